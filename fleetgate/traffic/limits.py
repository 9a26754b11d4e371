"""Rate limits and budgets: reserve on arrival, reconcile when the answer ends.

A request reserves 1 from each requests-per-minute bucket that applies to it (its tenant's,
its key's) and its estimated tokens from each tokens bucket and its tenant's budget:

    estimate = estimated prompt tokens + (max_tokens or `assumed_output_tokens`)
    cost_usd = prompt * input_per_1m_usd / 1e6 + completion * output_per_1m_usd / 1e6

When it ends, the difference between the estimate and what it used (the engine's `usage`, or
for a stream its relayed events) goes back to the buckets or is taken from them, so nothing
is charged twice and nothing used slips past a limit. A refusal says which limit, and when
a request of the same size would pass (Retry-After); the `x-ratelimit-*` headers the OpenAI
SDKs read go with every answer of a limited tenant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from fleetgate.settings import Settings, at_least
from fleetgate.traffic.store import Account, Bucket, LimitStore, Taken
from fleetgate.traffic.tenants import RateLimitSettings, Tenant


class PricingSettings(Settings, frozen=True):
    """What a pool's tokens cost (`pools[].pricing`), for budgets and spend."""

    input_per_1m_usd: float = 0.0  # per million prompt tokens
    output_per_1m_usd: float = 0.0  # per million completion tokens

    def __post_init__(self) -> None:
        at_least("input_per_1m_usd", self.input_per_1m_usd, 0)
        at_least("output_per_1m_usd", self.output_per_1m_usd, 0)

    def cost_usd(self, prompt: float, completion: float) -> float:
        return (prompt * self.input_per_1m_usd + completion * self.output_per_1m_usd) / 1e6


FREE = PricingSettings()
Kind = Literal["requests", "tokens", "budget"]


@dataclass(frozen=True, slots=True)
class _Limit:
    bucket: Bucket
    kind: Kind
    amount: float  # the limit as configured: per minute, or the budget per period
    per_key: bool = False  # a key's own limit, not its tenant's
    usd: bool = False  # a budget in money, not tokens
    renews_at: float = 0.0  # a budget: when its period ends (Unix time)
    header: bytes = field(init=False)  # x-ratelimit-limit-*'s value

    def __post_init__(self) -> None:
        object.__setattr__(self, "header", b"%d" % self.amount)

    def wait_s(self, cost: float, level: float, now: float) -> float:
        """Until a request of `cost` could pass (a cost over the bucket's size: until it is
        full, the most it will ever hold); `now` in Unix time, for a budget's period."""
        b = self.bucket
        if b.rate_per_s <= 0:
            return max(0.0, self.renews_at - now)
        return max(0.0, (min(cost, b.capacity) - level) / b.rate_per_s)


def _rate_limits(prefix: str, settings: RateLimitSettings, per_key: bool) -> list[_Limit]:
    limits = []
    if settings.requests_per_minute is not None:
        rpm = settings.requests_per_minute
        size = settings.requests_burst or rpm
        bucket = Bucket(f"{prefix}:rpm", size, rpm / 60)
        limits.append(_Limit(bucket, "requests", rpm, per_key))
    if settings.tokens_per_minute is not None:
        tpm = settings.tokens_per_minute
        size = settings.tokens_burst or tpm
        limits.append(_Limit(Bucket(f"{prefix}:tpm", size, tpm / 60), "tokens", tpm, per_key))
    return limits


class Reservation(msgspec.Struct, gc=False):
    """What one admitted request took, to reconcile when it ends (a struct: made in C)."""

    plan: _Plan
    prompt_tokens: int  # estimated
    output_tokens: int  # reserved
    pricing: PricingSettings
    head: bytes  # x-ratelimit-* for the client, as header lines (`name: value\r\n`)

    @property
    def limits(self) -> tuple[_Limit, ...]:
        return self.plan.limits


def _cost(limit: _Limit, pricing: PricingSettings, prompt: float, completion: float) -> float:
    """What a request of `prompt` and `completion` tokens costs against `limit`."""
    if limit.kind == "requests":
        return 1.0
    if limit.usd:
        return pricing.cost_usd(prompt, completion)
    return prompt + completion


@dataclass(frozen=True, slots=True)
class OverLimit:
    """Why a request may not go now: the 429's message, code, and Retry-After."""

    message: str
    code: str
    retry_after_s: float
    headers: list[tuple[bytes, bytes]]


class Limits:
    """The rate limits and budgets of every tenant, over one store."""

    def __init__(
        self,
        store: LimitStore,
        wall_clock: Callable[[], float],
        prefix: str = "fleetgate",
        assumed_output_tokens: int = 256,
    ) -> None:
        self._store = store
        self._wall = wall_clock  # budgets' periods are counted in Unix time
        self._prefix = prefix
        self._assumed = assumed_output_tokens
        self._plans: dict[str, _Plan] = {}  # by key id (a tenant's name when it has no key)
        self._periods: dict[str, tuple[int, _Plan]] = {}  # the same with its budget, by period

    def _plan(self, tenant: Tenant, key_id: str) -> _Plan:
        s, p = tenant.settings, self._prefix
        limits = (*_rate_limits(f"{p}:t:{tenant.name}", s.limits, False),
                  *_rate_limits(f"{p}:k:{key_id}", s.key_limits, True))  # fmt: skip
        # Requests buckets first, as the pinned states are (the levels come in this order).
        plan = _Plan(tuple(sorted(limits, key=lambda limit: limit.kind != "requests")))
        # Its buckets are asked for with every request of the key: one account of the store.
        plan.account = self._store.account(
            [limit.bucket for limit in plan.limits if limit.kind == "requests"],
            [limit.bucket for limit in plan.limits if limit.kind != "requests"],
        )
        self._plans[key_id or f"tenant:{tenant.name}"] = plan
        return plan

    def _budgeted(self, tenant: Tenant, key: str, plan: _Plan) -> _Plan:
        """`plan` with its tenant's budget of the period now: made once a period."""
        budget = tenant.settings.budget
        assert budget is not None
        now, period = self._wall(), budget.period_s
        index = int(now // period)
        made = self._periods.get(key)
        if made is not None and made[0] == index:
            return made[1]
        ends = (index + 1) * period
        usd = budget.cost_usd is not None
        amount = budget.cost_usd if budget.cost_usd is not None else budget.tokens
        assert amount is not None
        name = f"{self._prefix}:b:{tenant.name}:{budget.period}:{index}"
        # Kept a minute past its period (counted from any change), for a late reconciliation.
        bucket = Bucket(name, amount, 0.0, ends - now + 60.0)
        full = _Plan((*plan.limits, _Limit(bucket, "budget", amount, False, usd, ends)))
        self._periods[key] = (index, full)
        return full

    async def reserve(
        self,
        tenant: Tenant,
        key_id: str,
        prompt_tokens: int,
        max_tokens: int | None,
        pricing: PricingSettings = FREE,
    ) -> Reservation | OverLimit:
        """Take what the request may use from its tenant's limits, or say why it may not."""
        key = key_id or f"tenant:{tenant.name}"
        plan = self._plans.get(key) or self._plan(tenant, key_id)
        output = max_tokens if max_tokens is not None else self._assumed
        size = prompt_tokens + output
        costs = None  # what it takes from each bucket, when they differ by limit (a budget)
        if tenant.settings.budget is None:  # through the key's own account: the common case
            taken = await plan.account.take(size)
        else:
            plan = self._budgeted(tenant, key, plan)
            costs = [_cost(lim, pricing, prompt_tokens, output) for lim in plan.limits]
            taken = await self._store.take(plan.buckets, costs)
        if taken.ok:
            return Reservation(plan, prompt_tokens, output, pricing, plan.head(taken.levels))
        headers = plan.refusal_headers(taken.levels)
        costs = plan.costs(size) if costs is None else costs
        return _refusal(plan.limits, costs, taken, headers, self._wall())

    async def settle(self, held: Reservation, prompt_tokens: int, output_tokens: int) -> None:
        """Reconcile a reservation with what the request used."""
        plan = held.plan
        if not plan.budgeted:  # tokens alone: one difference for every tokens bucket
            unused = held.prompt_tokens + held.output_tokens - prompt_tokens - output_tokens
            if unused != 0 and plan.token_buckets:
                await plan.account.give(unused)
            return
        buckets, amounts = [], []
        for limit in held.limits:
            if limit.kind == "requests":
                continue
            reserved = _cost(limit, held.pricing, held.prompt_tokens, held.output_tokens)
            used = _cost(limit, held.pricing, prompt_tokens, output_tokens)
            if used != reserved:
                buckets.append(limit.bucket)
                amounts.append(reserved - used)
        if buckets:
            await self._store.give(buckets, amounts)


_HEADER_NAMES = {
    kind: tuple(f"x-ratelimit-{part}-{kind}".encode() for part in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}


class _Plan:
    """A key's limits, with what each request recomputes made once."""

    __slots__ = (
        "account", "buckets", "budgeted", "by_kind", "counts_tokens", "limits", "per_request",
        "pick", "template", "token_at", "token_buckets", "unit",
    )  # fmt: skip

    def __init__(self, limits: tuple[_Limit, ...]) -> None:
        self.limits = limits
        self.buckets = tuple(limit.bucket for limit in limits)
        # Its rate limits' buckets as one account of the store (Limits._plan; not a budget).
        self.account: Account
        self.per_request = tuple(limit.kind == "requests" for limit in limits)
        self.token_buckets = tuple(lim.bucket for lim in limits if lim.kind == "tokens")
        self.budgeted = any(limit.kind == "budget" for limit in limits)
        self.counts_tokens = bool(self.token_buckets) or self.budgeted
        # A request's costs: 1 from each requests bucket, its tokens from each tokens one.
        self.unit = [1.0 if kind else 0.0 for kind in self.per_request]
        self.token_at = tuple(i for i, kind in enumerate(self.per_request) if not kind)
        self.by_kind = tuple(
            (_HEADER_NAMES[kind], tuple(i for i, lim in enumerate(limits) if lim.kind == kind))
            for kind in ("requests", "tokens")
            if any(lim.kind == kind for lim in limits)
        )
        # An answer's header lines, each limit's figure in place and %d for what remains.
        # With one bucket of each kind (the common case) the figures are known now and
        # `pick` takes the levels (None: all of them, in order); else it finds the tightest
        # bucket of each kind, its figure and its level.
        single = all(len(indices) == 1 for _, indices in self.by_kind)
        firsts = tuple(indices[0] for _, indices in self.by_kind)
        self.pick: Callable[[Sequence[float]], tuple[Any, ...]] | None = (
            (None if firsts == tuple(range(len(limits))) else _picker(firsts))
            if single
            else self._tightest
        )
        self.template = b"".join(
            b"%b: %b\r\n%b: %%d\r\n"
            % (names[0], limits[indices[0]].header if single else b"%b", names[1])
            for names, indices in self.by_kind
        )

    def costs(self, tokens: float) -> list[float]:
        """What a request of `tokens` (estimated) takes from each bucket (no budget)."""
        costs = self.unit.copy()
        for i in self.token_at:
            costs[i] = tokens
        return costs

    def head(self, levels: Sequence[float]) -> bytes:
        """The x-ratelimit-limit-* and -remaining-* header lines of an admitted request, from
        the tightest requests and tokens buckets."""
        head: bytes = self.template % (tuple(levels) if self.pick is None else self.pick(levels))
        return head

    def _tightest(self, levels: Sequence[float]) -> tuple[bytes | float, ...]:
        values: list[bytes | float] = []
        for _, indices in self.by_kind:
            i = min(indices, key=levels.__getitem__)
            values.append(self.limits[i].header)
            values.append(levels[i])
        return tuple(values)

    def refusal_headers(self, levels: list[float]) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-limit-*, -remaining-* and -reset-* headers of a refusal, from
        the tightest requests and tokens buckets."""
        headers: list[tuple[bytes, bytes]] = []
        for names, indices in self.by_kind:
            i = min(indices, key=levels.__getitem__) if len(indices) > 1 else indices[0]
            limit, level = self.limits[i], levels[i]
            bucket = limit.bucket
            wait = (bucket.capacity - level) / bucket.rate_per_s
            headers.append((names[0], limit.header))
            headers.append((names[1], b"%d" % level if level > 0 else b"0"))
            headers.append((names[2], duration(wait).encode()))
        return headers


def _picker(indices: tuple[int, ...]) -> Callable[[Sequence[float]], tuple[Any, ...]]:
    """The levels at `indices`, as a tuple (itemgetter, made in C, gives a lone one bare)."""
    if len(indices) > 1:
        get: Callable[[Sequence[float]], tuple[Any, ...]] = operator.itemgetter(*indices)
        return get
    return lambda levels: tuple(levels[i] for i in indices)


def _refusal(
    limits: tuple[_Limit, ...],
    costs: list[float],
    taken: Taken,
    headers: list[tuple[bytes, bytes]],
    now: float,
) -> OverLimit:
    """The refusal for the limit that keeps the request waiting longest; on a tie, the one
    configured first (the tenant's before the key's, requests before tokens, a budget last),
    whatever the order of a plan's buckets."""
    short = [
        (lim, c, lvl) for lim, c, lvl in zip(limits, costs, taken.levels, strict=True) if lvl < c
    ]
    limit, cost, level = min(
        short,
        key=lambda s: (
            -s[0].wait_s(s[1], s[2], now),
            s[0].kind == "budget", s[0].per_key, s[0].kind != "requests",
        ),
    )  # fmt: skip
    retry = limit.wait_s(cost, level, now)
    if limit.kind == "budget":
        unit = "USD" if limit.usd else "tokens"
        message = (
            f"This key's tenant has spent its budget of {limit.amount:g} {unit} for the "
            f"period; it renews in {duration(retry)}."
        )
        return OverLimit(message, "insufficient_quota", retry, headers)
    scope = "key" if limit.per_key else "tenant"
    if cost > limit.bucket.capacity:
        message = (
            f"This request needs {cost:.0f} {limit.kind} (prompt + max_tokens), more than the "
            f"{scope}'s limit allows at once ({limit.bucket.capacity:.0f}): lower `max_tokens`."
        )
    else:
        message = (
            f"Rate limit reached: {limit.amount:g} {limit.kind} per minute for this {scope}. "
            f"Retry in {duration(retry)}."
        )
    return OverLimit(message, "rate_limit_exceeded", retry, headers)


def duration(seconds: float) -> str:
    """A wait as OpenAI writes it in x-ratelimit-reset-*: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{rest}s"
