"""A backend's health as independent flags, reduced to the one verdict routing reads.

Each detector owns one flag and never touches another's: the active checker sets
ACTIVE_CHECK_FAILED, the outlier detector EJECTED, an admin call or SIGTERM DRAINING, discovery
or an operator's removal (fleet/membership.py) GONE, the GPU agents' readings (health/gpu.py)
GPU_FAULT. Backpressure (an engine's 429/503 with Retry-After) is not a flag: the backend is
healthy but busy, so it is skipped until the advertised time and counts as DEGRADED; so is a
backend whose GPUs throttle, routed at a lower weight.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HealthFlag(enum.IntFlag):
    ACTIVE_CHECK_FAILED = 1  # the active health checker's probes fail
    EJECTED = 2  # the outlier detector ejected it after consecutive failures
    DRAINING = 4  # finishing what it has; takes nothing new
    GONE = 8  # no longer a member: leaves its pool when its last request ends
    GPU_FAULT = 16  # its GPU agent reported an XID error, uncorrected ECC, a GPU too hot or lost
    UNPROBED = 32  # found by discovery, waiting for its first good health probe
    REGION_DRAINED = 64  # its region is drained by the operator (a drill: gateway/admin.py)


# A pool in panic still never routes to these: they are leaving on purpose, or nothing has
# shown yet that they answer.
NEVER_ROUTE = (
    HealthFlag.DRAINING | HealthFlag.GONE | HealthFlag.UNPROBED | HealthFlag.REGION_DRAINED
)


class Verdict(enum.Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"  # routable: backing off, ramping up after a return, or throttling
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """How a pool turns its backends' health into candidates."""

    # When fewer than this share of a pool is healthy, route across all of it (but never to
    # DRAINING or GONE backends) rather than pile everything on the few (Envoy's default).
    panic_threshold: float = 0.5
    # After an ejection ends, a backend's weight ramps from 10% to full over this window.
    slow_start_s: float = 30.0
