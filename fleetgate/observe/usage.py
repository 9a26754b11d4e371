"""Each tenant's use since the gateway started: requests let through to routing, and the tokens
and spend of those answered (the engine's usage at the pool's prices), per pool, all read from
their Finished (one event a request: a request is counted once it is over). One account for
the metrics (fleetgate_tokens, fleetgate_spend_usd), the dashboard and GET /admin/tenants,
kept while any of them is on. Counted in this gateway alone (with several gateways,
Prometheus sums the series)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from fleetgate.lifecycle.events import Finished
from fleetgate.lifecycle.hooks import Hooks


class TenantUse(msgspec.Struct):
    tenant: str
    requests: int = 0  # admitted (let through to routing), once over
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spend_usd: float = 0.0


class TenantUsage:
    """The use of the tenants `known` from the start (at zero until they call), and of any
    other that calls (the anonymous caller when auth is off)."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self._requests: dict[str, int] = {}  # admitted, by tenant (names from the config)
        self.know(known)
        self._counts_requests = True
        # Per (pool, tenant): [prompt tokens, completion tokens, spend]. Only these are kept
        # per answer (a tenant's totals are summed when read: far more answers than reads).
        self.by_pool: dict[tuple[str, str], list[float]] = {}

    def know(self, tenants: Iterable[str]) -> None:
        """Show these tenants (the config's, at start or reloaded) from zero."""
        for tenant in tenants:
            self._requests.setdefault(tenant, 0)

    def subscribe(self, hooks: Hooks, requests: bool = True) -> None:
        """Hear what tenants use; their requests too unless `requests` is False (the metrics
        alone read only the tokens and spend: they count requests themselves)."""
        self._counts_requests = requests
        hooks.subscribe(Finished, self.on_finished)

    def on_finished(self, event: Finished) -> None:
        if self._counts_requests and event.queued_s is not None:  # it was admitted
            requests = self._requests
            requests[event.tenant] = requests.get(event.tenant, 0) + 1
        if event.prompt_tokens is None:  # nothing it used is counted
            return
        key = (event.model, event.tenant)
        cell = self.by_pool.get(key)
        if cell is None:
            cell = self.by_pool[key] = [0.0, 0.0, 0.0]
        cell[0] += event.prompt_tokens
        cell[1] += event.completion_tokens
        cell[2] += event.cost_usd

    def tenants(self) -> list[TenantUse]:
        """Each tenant's use, by name: every tenant known from the start, and any other that
        called."""
        uses = {name: TenantUse(name, n) for name, n in self._requests.items()}
        for (_, tenant), (prompt, completion, usd) in self.by_pool.items():
            use = uses.get(tenant) or uses.setdefault(tenant, TenantUse(tenant))
            use.prompt_tokens += int(prompt)
            use.completion_tokens += int(completion)
            use.spend_usd += usd
        return [uses[name] for name in sorted(uses)]
