"""Each tenant's use since the gateway started: requests let through to routing (Admitted), and
the tokens and spend of those answered (Charged: the engine's usage at the pool's prices), per
pool. One account for the metrics (fleetgate_tokens, fleetgate_spend_usd), the dashboard and
GET /admin/tenants, kept while any of them is on: the only subscriber to Charged among them.
Counted in this gateway alone (with several gateways, Prometheus sums the series)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from fleetgate.lifecycle.events import Admitted, Charged
from fleetgate.lifecycle.hooks import Hooks


class TenantUse(msgspec.Struct):
    tenant: str
    requests: int = 0  # admitted (let through to routing)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spend_usd: float = 0.0


class TenantUsage:
    """The use of the tenants `known` from the start (at zero until they call), and of any
    other that calls (the anonymous caller when auth is off)."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self._tenants = {name: TenantUse(name) for name in known}
        # Per (pool, tenant): [prompt tokens, completion tokens, spend], for the metrics.
        self.by_pool: dict[tuple[str, str], list[float]] = {}

    def subscribe(self, hooks: Hooks, requests: bool = True) -> None:
        """Hear what tenants use; their requests too unless `requests` is False (the metrics
        alone read only the tokens and spend: they count requests themselves)."""
        if requests:
            hooks.subscribe(Admitted, self.on_admitted)
        hooks.subscribe(Charged, self.on_charged)

    def on_admitted(self, event: Admitted) -> None:
        use = self._tenants.get(event.tenant)
        if use is None:
            use = self._tenant(event.tenant)
        use.requests += 1

    def on_charged(self, event: Charged) -> None:
        tenant = event.tenant
        use = self._tenants.get(tenant)
        if use is None:
            use = self._tenant(tenant)
        prompt, completion, usd = event.prompt_tokens, event.completion_tokens, event.cost_usd
        use.prompt_tokens += prompt
        use.completion_tokens += completion
        use.spend_usd += usd
        key = (event.model, tenant)
        cell = self.by_pool.get(key)
        if cell is None:
            cell = self.by_pool[key] = [0.0, 0.0, 0.0]
        cell[0] += prompt
        cell[1] += completion
        cell[2] += usd

    def _tenant(self, name: str) -> TenantUse:
        use = self._tenants[name] = TenantUse(name)  # names come from the config: bounded
        return use

    def tenants(self) -> list[TenantUse]:
        """Each tenant's use, by name."""
        return sorted(self._tenants.values(), key=lambda use: use.tenant)
