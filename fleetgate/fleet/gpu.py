"""What a GPU health agent (`fleetgate worker gpu-agent`) reports of one GPU, as it travels in
a heartbeat (POST /fleet/heartbeat {"backend": ID, "gpu": [...]}) and as the gateway keeps it
on the backend's state.

Every field but `index` may be None: NVML could not read it on that device (not supported,
no permission); `notes` says why. The sizes are bounded so that a heartbeat is small and a
bad one is refused whole (gateway/heartbeat.py), never stored.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import msgspec

MAX_GPUS = 64  # readings in one heartbeat (a node has 8; some 16)
MAX_XIDS = 32  # XID errors reported in one reading (the agent keeps the first)
MAX_NOTES = 16
_TEXT = 200  # characters of a name, uuid or note

# Why a GPU's clocks are held below their maximum: NVML's clocks event (throttle) reasons,
# decoded from its bitmask by the agent (workers/gpu/nvml.py). `other`: a bit this list does
# not know (a newer driver's).
ThrottleReason = Literal[
    "gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost",
    "sw_thermal", "hw_thermal", "hw_power_brake", "display_clocks", "other",
]  # fmt: skip
THROTTLE_REASONS: tuple[ThrottleReason, ...] = get_args(ThrottleReason)

_Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]
_Mhz = Annotated[int, msgspec.Meta(ge=0, le=100_000)]
_Watts = Annotated[float, msgspec.Meta(ge=0, le=100_000)]
_Text = Annotated[str, msgspec.Meta(max_length=_TEXT)]


class GpuReading(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One GPU at one moment."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=1024)]  # NVML's device index on its host
    name: _Text | None = None  # e.g. "NVIDIA H100 80GB HBM3"
    uuid: _Text | None = None
    temperature_c: Annotated[int, msgspec.Meta(ge=-273, le=1000)] | None = None  # the die's
    utilization_gpu_pct: _Percent | None = None  # time a kernel ran, over the last sample
    utilization_memory_pct: _Percent | None = None  # time memory was read or written
    memory_used_bytes: _Count | None = None
    memory_total_bytes: _Count | None = None
    power_draw_w: _Watts | None = None
    power_limit_w: _Watts | None = None  # the enforced limit
    # Volatile ECC error counts (since the driver loaded); None: ECC is off or not supported.
    ecc_uncorrected: _Count | None = None
    ecc_corrected: _Count | None = None
    # XID critical errors since the previous reading, by XID number; None: this device cannot
    # report them (NVML's XID events are not supported there).
    xid_errors: Annotated[list[_Count], msgspec.Meta(max_length=MAX_XIDS)] | None = None
    sm_clock_mhz: _Mhz | None = None
    memory_clock_mhz: _Mhz | None = None
    # Why the clocks are held down now (empty: they are not); None: not readable.
    throttle_reasons: Annotated[list[ThrottleReason], msgspec.Meta(max_length=16)] | None = None
    lost: bool = False  # NVML says the GPU is lost (fallen off the bus): nothing else is known
    # Why fields are None, as NVML said (e.g. "xid_errors: Not Supported").
    notes: Annotated[list[_Text], msgspec.Meta(max_length=MAX_NOTES)] = msgspec.field(
        default_factory=list
    )


GpuReadings = Annotated[list[GpuReading], msgspec.Meta(min_length=1, max_length=MAX_GPUS)]

# A backend's GPUs as the gateway judges them (health/gpu.py): `fault` (unhealthy: out of
# routing), `throttled` (routed at a lower weight), `ok`, or `stale`: the agent's last
# readings are older than the pool's `gpu.stale_after_s`, so they judge nothing any more.
GpuState = Literal["fault", "throttled", "ok", "stale"]


class GpuStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's GPUs as the gateway last heard of them (health/gpu.py keeps it on the
    backend's state; /admin/backends, /metrics and the dashboard show it). Stale, it keeps
    the last readings and what they said, which no longer count."""

    at: float  # when the readings came (the gateway's clock)
    state: GpuState  # what they make of the backend; `stale` once they are too old
    readings: tuple[GpuReading, ...]
    faults: tuple[str, ...]  # what makes it unhealthy in them, e.g. "gpu 3: xid 79"
    throttling: tuple[str, ...]  # the throttle reasons that lower its weight, "gpu 0: hw_thermal"
    xid_totals: dict[int, int]  # XIDs reported per GPU index since the gateway started
