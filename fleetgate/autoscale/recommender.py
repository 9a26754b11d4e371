"""How many replicas a pool should run, recommended on every tick from what it carries now.

Each signal is a usage ratio, what the pool carries over what its replicas should carry:

    requests      (in_flight + queued) / (replicas * target_in_flight)
    prefill       prefill_tokens / (replicas * target_prefill_tokens)
    kv            kv_usage / target_kv_usage                       (not counted when unknown)

and the highest decides, as in Kubernetes' HPA: raw = ceil(replicas * ratio), unless the ratio
is within 1 +- tolerance (then raw = replicas). No one signal suffices: a prefill-heavy pool
saturates with its KV cache at a third (llm-d's autoscaler, on KV use and queue length alone,
missed that). An SLO burning its budget at `burn_rate_up` or faster asks for one replica more
than now at least, whatever the load says; a pool with no replicas and demand asks for what
the demand needs, at least 1.

Then, in HPA's order:

    stabilised  between the lowest raw of the scale-up window and the highest of the
                scale-down window, as near the current count as that allows: up at once
                (window 0), down only once every raw of the last 300 s says so
    stepped     within current - max_step_down .. current + max_step_up
    desired     within max(min_replicas, the schedule's floor) .. max_replicas

The floor and the ceiling win over the step limits: a peak's floor is reached in one
decision (that is why it is given ahead). The windows keep the raws, not the floor: once a
peak ends, the count comes down toward what the load asks by max_step_down a decision (the
caller's tick sets that pace, as HPA's 15 s sync period does). No forecast: Dynamo's
planner's never beat the last value, and a schedule of known peaks, used as a floor only (as
AIBrix uses its prediction), covers what a forecast would.
"""

from __future__ import annotations

import math
from collections import deque

import msgspec

from fleetgate.autoscale.kubernetes import KubernetesActuatorSettings
from fleetgate.autoscale.local import LocalActuatorSettings
from fleetgate.autoscale.schedule import DAY_S, PeakSettings, Schedule
from fleetgate.settings import Settings, at_least, ordered, positive, positive_seconds, within

# ceil() of a ratio's product less this: float rounding (0.7 * 10 = 7.000000000000001) must
# not add a replica.
_ROUNDING = 1e-9


class Signals(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of a pool, taken by the caller every tick."""

    replicas: int  # backends serving now (ready, not draining)
    queued: float  # requests waiting: the gateway's admission queue + the engines' waiting
    in_flight: float  # requests running (the gateway's count)
    prefill_tokens: float  # prompt tokens sent whose first token has not come back
    kv_usage: float | None  # mean KV-cache use of the pool's engines in [0, 1]; None: unknown
    burn_rate: float | None  # the SLO's error-budget burn rate, short window; None: no SLO


class AutoscaleSettings(Settings, frozen=True):
    """A pool's autoscaling (`pools[].autoscale`)."""

    enabled: bool = False  # off: the pool is not autoscaled (its caller makes no Recommender)
    min_replicas: int = 1
    max_replicas: int = 8
    # What one replica should carry at most; a signal over its target asks for replicas in
    # proportion.
    target_in_flight: float = 16.0  # requests running + waiting
    target_prefill_tokens: float = 8192.0  # prompt tokens waiting for their prefill
    target_kv_usage: float = 0.8  # mean KV-cache use
    burn_rate_up: float = 2.0  # a burn rate at or above this asks for a replica more than now
    tolerance: float = 0.1  # ratios within 1 +- this change nothing (HPA's)
    scale_up_window_s: float = 0.0  # up to the lowest raw of this window (0: at once)
    scale_down_window_s: float = 300.0  # down to the highest raw of this window (HPA's)
    max_step_up: int = 4  # replicas added at most per decision
    max_step_down: int = 1  # replicas removed at most per decision
    schedule: list[PeakSettings] = []
    interval_s: float = 15.0  # how often it decides (autoscale/scaler.py)
    # The load signals are averaged over about this long (exponentially; 0: each tick's
    # reading alone): a gauge read once a tick is noisy, and noise both ways is flapping.
    smoothing_s: float = 30.0
    # What makes it so; none: recommend only (the gauge, for KEDA or an HPA).
    local: LocalActuatorSettings | None = None  # sim workers this gateway starts and stops
    kubernetes: KubernetesActuatorSettings | None = None  # or a Deployment's or StatefulSet's pods

    def __post_init__(self) -> None:
        at_least("min_replicas", self.min_replicas, 0)
        at_least("max_replicas", self.max_replicas, 1)
        ordered("min_replicas", self.min_replicas, "max_replicas", self.max_replicas)
        positive("target_in_flight", self.target_in_flight)
        positive("target_prefill_tokens", self.target_prefill_tokens)
        within("target_kv_usage", self.target_kv_usage, 0, 1, open_low=True)
        positive("burn_rate_up", self.burn_rate_up)
        within("tolerance", self.tolerance, 0, 1)
        within("scale_up_window_s", self.scale_up_window_s, 0, DAY_S)
        within("scale_down_window_s", self.scale_down_window_s, 0, DAY_S)
        at_least("max_step_up", self.max_step_up, 1)
        at_least("max_step_down", self.max_step_down, 1)
        positive_seconds("interval_s", self.interval_s)
        within("smoothing_s", self.smoothing_s, 0, DAY_S)
        if self.local is not None and self.kubernetes is not None:
            raise ValueError("give one actuator: `local` or `kubernetes`, not both")
        for i, peak in enumerate(self.schedule):
            name = f"schedule[{i}].min_replicas"
            ordered(name, peak.min_replicas, "max_replicas", self.max_replicas)


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    """What a pool should run, and why."""

    desired: int  # replicas, after every rule
    raw: int  # from the signals alone, before stabilisation, steps and limits
    reason: str  # the signal or rule that decided `desired`, e.g. "prefill_tokens 2.4x target"
    floor: int  # the lowest allowed now: min_replicas, or a peak's


class Recommender:
    """The recommendations of one pool (module docstring); it keeps its recent raw values."""

    def __init__(self, settings: AutoscaleSettings) -> None:
        self._settings = settings
        self._schedule = Schedule(settings.schedule)
        self._window = max(settings.scale_up_window_s, settings.scale_down_window_s)
        self._raws: deque[tuple[float, int]] = deque()  # (now, raw), oldest first

    def recommend(self, signals: Signals, now: float) -> Recommendation:
        """`now`: seconds since the epoch (UTC), injected: the stabilisation windows count
        in it, and the schedule reads the time of day from it."""
        s, current = self._settings, signals.replicas
        raw, reason = self._raw(signals)
        up, down = self._stabilise(raw, now)
        desired = min(max(current, up), down)
        if desired != raw:
            reason = "stabilised (down window)" if desired > raw else "stabilised (up window)"
        if desired > current + s.max_step_up:
            desired, reason = current + s.max_step_up, "max_step_up"
        elif desired < current - s.max_step_down:
            desired, reason = current - s.max_step_down, "max_step_down"
        floor, why = self._floor(now)
        if desired < floor:
            desired, reason = floor, why
        elif desired > s.max_replicas:
            desired, reason = s.max_replicas, "max_replicas"
        return Recommendation(desired=desired, raw=raw, reason=reason, floor=floor)

    def _raw(self, signals: Signals) -> tuple[int, str]:
        """What the signals ask for, and which decided."""
        s, replicas = self._settings, signals.replicas
        demand = signals.in_flight + signals.queued
        if replicas <= 0:
            if demand <= 0 and signals.prefill_tokens <= 0:
                return 0, "no replicas, no demand"
            needed = max(
                _ceil(demand / s.target_in_flight),
                _ceil(signals.prefill_tokens / s.target_prefill_tokens),
            )
            return max(1, needed), "demand with no replicas"
        ratios = {
            "in_flight": demand / (replicas * s.target_in_flight),
            "prefill_tokens": signals.prefill_tokens / (replicas * s.target_prefill_tokens),
        }
        if signals.kv_usage is not None:
            ratios["kv_usage"] = signals.kv_usage / s.target_kv_usage
        name = max(ratios, key=ratios.__getitem__)
        ratio = ratios[name]
        if abs(ratio - 1) <= s.tolerance:
            raw, reason = replicas, f"{name} {ratio:.2f}x target, within tolerance"
        else:
            raw, reason = _ceil(replicas * ratio), f"{name} {ratio:.1f}x target"
        burn = signals.burn_rate
        if burn is not None and burn >= s.burn_rate_up and raw <= replicas:
            raw, reason = replicas + 1, f"burn_rate {burn:.1f} >= {s.burn_rate_up:g}"
        return raw, reason

    def _stabilise(self, raw: int, now: float) -> tuple[int, int]:
        """The lowest raw of the scale-up window and the highest of the scale-down window,
        this one included (one `window` seconds old is out of it)."""
        s, raws = self._settings, self._raws
        if raws and now < raws[-1][0]:
            raws.clear()  # the wall clock stepped back: the windows start over
        while raws and now - raws[0][0] >= self._window:
            raws.popleft()
        up = min([raw, *(r for t, r in raws if now - t < s.scale_up_window_s)])
        down = max([raw, *(r for t, r in raws if now - t < s.scale_down_window_s)])
        raws.append((now, raw))
        return up, down

    def _floor(self, now: float) -> tuple[int, str]:
        """The lowest count allowed now, and what sets it."""
        min_replicas = self._settings.min_replicas
        peak = self._schedule.peak(now)
        if peak is None or peak.min_replicas <= min_replicas:
            return min_replicas, "min_replicas"
        return peak.min_replicas, f"schedule peak {peak.label}"


def _ceil(x: float) -> int:
    return math.ceil(x - _ROUNDING)
