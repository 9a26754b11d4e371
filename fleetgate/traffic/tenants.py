"""Tenants: who an API key belongs to, and what that tenant may do (the `tenants:` section).

A tenant may use the models it lists, at a default priority class (raised by a header only up
to its `max_priority`), within its rate limits, budget and concurrency quota. Settings are
validated where they are decoded; `Tenant` is what the request path reads.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import msgspec

from fleetgate.settings import Settings, at_least, positive, positive_seconds
from fleetgate.traffic.priority import Priority


class RateLimitSettings(Settings, frozen=True):
    """Token buckets: each refills at its per-minute rate and holds at most its burst."""

    requests_per_minute: float | None = None  # None: no request limit
    tokens_per_minute: float | None = None  # prompt + completion tokens; None: no limit
    requests_burst: float | None = None  # the bucket's size; None: one minute's worth
    tokens_burst: float | None = None  # the bucket's size; None: one minute's worth

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "requests_burst",
                     "tokens_burst"):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                positive(name, value)
        for burst, rate in (("requests_burst", "requests_per_minute"),
                            ("tokens_burst", "tokens_per_minute")):  # fmt: skip
            if getattr(self, burst) is not None and getattr(self, rate) is None:
                raise ValueError(f"`{burst}` needs `{rate}`")

    @property
    def limited(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


PERIODS = {"hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}


class BudgetSettings(Settings, frozen=True):
    """What a tenant may spend per period: tokens, or money at the pools' prices."""

    period: str = "day"  # hour, day, week or month (30 days), counted from the Unix epoch
    tokens: float | None = None  # prompt + completion tokens per period
    cost_usd: float | None = None  # spend per period at `pools[].pricing`

    def __post_init__(self) -> None:
        if self.period not in PERIODS:
            raise ValueError(f"`period` must be one of {', '.join(PERIODS)}, got {self.period!r}")
        if (self.tokens is None) == (self.cost_usd is None):
            raise ValueError("give exactly one of `tokens` or `cost_usd`")
        if self.tokens is not None:
            positive("tokens", self.tokens)
        if self.cost_usd is not None:
            positive("cost_usd", self.cost_usd)

    @property
    def period_s(self) -> float:
        return PERIODS[self.period]


class TenantSettings(Settings, frozen=True):
    """One tenant (docs/configuration.md, "Tenants and keys")."""

    name: str  # in metrics and logs; letters, digits, `-`, `_`, `.`
    keys: list[str] = []  # API keys, as given or `sha256:<hex>` of one (preferred)
    # Model names it may use; shell patterns (`llama-*`); the default `["*"]` is all of them.
    models: list[str] = msgspec.field(default_factory=lambda: ["*"])
    priority: str = "standard"  # its requests' class: critical, standard or sheddable
    max_priority: str | None = None  # the highest class a header may ask for; None: `priority`
    weight: float = 1.0  # its share of a saturated pool against tenants of its class
    limits: RateLimitSettings = RateLimitSettings()  # the tenant's, all its keys together
    key_limits: RateLimitSettings = RateLimitSettings()  # each of its keys alone
    budget: BudgetSettings | None = None  # spend per period; None: no budget
    max_concurrency: int | None = None  # requests in flight at most; None: no cap
    min_concurrency: int = 0  # requests in flight guaranteed however busy the pool
    batch: bool = False  # its requests use only spare capacity (the batch lane)
    queue_timeout_s: float = 30.0  # longest wait in the admission queue, then 503
    engine_fields: bool = False  # may send engine-steering fields (`kv_transfer_params`)
    # Data residency: the only regions (backends' `region` label) its requests may be served
    # in, by any attempt; none there can: 503. Empty: any region.
    regions: list[str] = []
    # Spilled to another region when the gateway's is saturated (routing/regions.py); false:
    # never, its requests wait (or are shed) in their region instead.
    spill: bool = True

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"`name` {self.name!r}: use letters, digits, `-`, `_` or `.`")
        Priority.parse(self.priority)
        if self.max_priority is not None and Priority.parse(self.max_priority) > Priority.parse(
            self.priority
        ):
            raise ValueError("`max_priority` must not be below `priority`")
        positive("weight", self.weight)
        if self.max_concurrency is not None:
            at_least("max_concurrency", self.max_concurrency, 1)
            if self.min_concurrency > self.max_concurrency:
                raise ValueError("`min_concurrency` must not exceed `max_concurrency`")
        at_least("min_concurrency", self.min_concurrency, 0)
        positive_seconds("queue_timeout_s", self.queue_timeout_s)
        if not self.models:
            raise ValueError("`models` is empty: list what it may use, or `*` for all")
        for region in self.regions:
            if not region or not all(c.isalnum() or c in "-_." for c in region):
                raise ValueError(f"`regions`: {region!r} is not a region name")


@dataclass(frozen=True, slots=True, eq=False)
class Tenant:
    """A tenant as the request path reads it (made once from its settings)."""

    name: str
    settings: TenantSettings
    priority: Priority
    max_priority: Priority
    all_models: bool  # `*` among its models: no check per request
    exact: frozenset[str]
    patterns: tuple[str, ...]
    limited: bool  # it has rate limits or a budget
    regions: frozenset[str] | None  # where its requests may be served; None: anywhere
    stays: bool  # never spilled out of the gateway's region (`spill: false`)

    @classmethod
    def of(cls, settings: TenantSettings) -> Tenant:
        priority = Priority.parse(settings.priority)
        top = priority if settings.max_priority is None else Priority.parse(settings.max_priority)
        patterns = tuple(m for m in settings.models if any(c in m for c in "*?["))
        exact = frozenset(m for m in settings.models if m not in patterns)
        s = settings
        limited = s.limits.limited or s.key_limits.limited or s.budget is not None
        return cls(
            name=s.name, settings=s, priority=priority, max_priority=top,
            all_models="*" in patterns, exact=exact, patterns=patterns, limited=limited,
            regions=frozenset(s.regions) if s.regions else None, stays=not s.spill,
        )  # fmt: skip

    def may_use(self, model: str) -> bool:
        if self.all_models or model in self.exact:
            return True
        return any(fnmatch.fnmatchcase(model, p) for p in self.patterns)

    def priority_for(self, asked: bytes | None) -> Priority:
        """The class of a request that asked for `asked` (a header's value): lowering is
        always allowed, raising only up to `max_priority`; ValueError for an unknown name."""
        if asked is None:
            return self.priority
        wanted = Priority.parse(asked.decode("latin-1"))
        return max(wanted, self.max_priority)  # larger value, lower class


# The tenant of every request when auth is off: no limits, the standard class.
ANONYMOUS = Tenant.of(TenantSettings(name="anonymous"))
