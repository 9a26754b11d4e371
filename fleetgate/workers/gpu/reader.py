"""Where the GPU agent's readings come from: a `GpuReader`. The real one reads NVML through the
`nvidia-ml-py` package (import name `pynvml`, the optional extra `fleetgate[gpu]`); tests give
the agent one of their own.

NVML is asked field by field, and a field it cannot give on a device (NVMLError_NotSupported,
no permission, a driver too old for the call) is None in the reading with a note of why: one
unsupported query never loses the others. A GPU that NVML calls lost (fallen off the bus) is
read as `lost` and nothing more. XID critical errors come from an NVML event set per device,
drained without waiting at each reading (`nvmlEventSetWait` with a 0 ms timeout).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from fleetgate.fleet.gpu import MAX_NOTES, MAX_XIDS, GpuReading, ThrottleReason

T = TypeVar("T")

# NVML's clocks event (throttle) reason bits, nvml.h `nvmlClocksEventReason*`.
THROTTLE_BITS: tuple[tuple[int, ThrottleReason], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)
_KNOWN_BITS = sum(bit for bit, _ in THROTTLE_BITS)
# nvml.h constants the reader passes (stable across NVML versions).
_TEMPERATURE_GPU = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2
_ECC_CORRECTED, _ECC_UNCORRECTED, _VOLATILE = 0, 1, 0
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError


def throttle_reasons(mask: int) -> list[ThrottleReason]:
    """NVML's reason bitmask as names, in bit order; bits it does not know are `other`."""
    names = [name for bit, name in THROTTLE_BITS if mask & bit]
    if mask & ~_KNOWN_BITS:
        names.append("other")
    return names


class GpuReader(Protocol):
    """Reads every GPU of this host; `close` once done."""

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


class NvmlUnavailable(Exception):
    """NVML cannot be used here: the message says what was tried and what to install or check."""


_HELP = (
    "it needs an NVIDIA driver (check that `nvidia-smi` lists the GPUs) and the nvidia-ml-py "
    "package (`pip install 'fleetgate[gpu]'`)"
)


def open_nvml(import_module: Callable[[str], Any] = importlib.import_module) -> NvmlReader:
    """An NvmlReader over NVML, initialised; NvmlUnavailable when the package is missing,
    `nvmlInit` fails (no driver, no GPU) or it finds no GPU."""
    try:
        nvml = import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"cannot import pynvml ({exc}): {_HELP}") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"nvmlInit failed: {exc}: {_HELP}") from None
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        nvml.nvmlShutdown()
        raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {exc}: {_HELP}") from None
    if count == 0:
        nvml.nvmlShutdown()
        raise NvmlUnavailable(f"NVML initialised but found no GPU: {_HELP}")
    try:
        return NvmlReader(nvml, count)
    except nvml.NVMLError as exc:
        nvml.nvmlShutdown()
        raise NvmlUnavailable(f"nvmlDeviceGetHandleByIndex failed: {exc}: {_HELP}") from None


class _Device:
    """One GPU: its handle, its XID event set (None: XID events not supported there), and the
    notes of its current reading."""

    __slots__ = ("events", "handle", "index", "notes", "xid_note")

    def __init__(self, index: int, handle: Any, events: Any, xid_note: str | None) -> None:
        self.index, self.handle, self.events, self.xid_note = index, handle, events, xid_note
        self.notes: list[str] = []


class _Lost(Exception):
    """NVML said the GPU is lost: stop reading it."""


class NvmlReader:
    """Reads NVML (`nvml` is the pynvml module, initialised) for GPUs 0..count-1."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._devices: list[_Device] = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            events, note = None, None
            try:
                events = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, events)
            except nvml.NVMLError as exc:
                if events is not None:
                    nvml.nvmlEventSetFree(events)
                events, note = None, f"xid_errors: {exc}"
            self._devices.append(_Device(index, handle, events, note))

    def read(self) -> list[GpuReading]:
        return [self._read(device) for device in self._devices]

    def close(self) -> None:
        nvml = self._nvml
        for device in self._devices:
            if device.events is not None:
                nvml.nvmlEventSetFree(device.events)
                device.events = None
        nvml.nvmlShutdown()

    def _ask(self, device: _Device, field: str, *calls: Callable[[], T]) -> T | None:
        """The first of `calls` that answers; None (and a note) when NVML cannot say. A call
        the driver lacks (FunctionNotFound) falls through to the next, an older one."""
        nvml = self._nvml
        error: object = "no call"
        for call in calls:
            try:
                return call()
            except nvml.NVMLError_FunctionNotFound as exc:
                error = exc  # the driver is older than the call: try the next
            except AttributeError:  # the nvidia-ml-py release is older than the call
                error = "not in this nvidia-ml-py release"
            except nvml.NVMLError_GpuIsLost:
                raise _Lost from None
            except nvml.NVMLError as exc:
                error = exc
                break
        device.notes.append(f"{field}: {error}")
        return None

    def _read(self, device: _Device) -> GpuReading:
        device.notes = [] if device.xid_note is None else [device.xid_note]
        try:
            return self._read_fields(device)
        except _Lost:
            return GpuReading(index=device.index, lost=True, notes=["GPU is lost"])

    def _read_fields(self, device: _Device) -> GpuReading:
        nvml, h, ask = self._nvml, device.handle, self._ask
        name = ask(device, "name", lambda: _text(nvml.nvmlDeviceGetName(h)))
        uuid = ask(device, "uuid", lambda: _text(nvml.nvmlDeviceGetUUID(h)))
        temperature = ask(
            device, "temperature_c",
            lambda: int(nvml.nvmlDeviceGetTemperatureV(h, _TEMPERATURE_GPU)),
            lambda: int(nvml.nvmlDeviceGetTemperature(h, _TEMPERATURE_GPU)),
        )  # fmt: skip
        utilization = ask(device, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        memory = ask(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        draw_mw = ask(device, "power_draw_w", lambda: int(nvml.nvmlDeviceGetPowerUsage(h)))
        limit_mw = ask(
            device, "power_limit_w", lambda: int(nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        )
        uncorrected = ask(device, "ecc_uncorrected", lambda: self._ecc(h, _ECC_UNCORRECTED))
        corrected = ask(device, "ecc_corrected", lambda: self._ecc(h, _ECC_CORRECTED))
        sm = ask(device, "sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(h, _CLOCK_SM)))
        mem = ask(
            device, "memory_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(h, _CLOCK_MEM))
        )
        mask = ask(
            device, "throttle_reasons",
            lambda: int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
            lambda: int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        )  # fmt: skip
        xids = self._xids(device)
        return GpuReading(
            index=device.index, name=name, uuid=uuid, temperature_c=temperature,
            utilization_gpu_pct=None if utilization is None else int(utilization.gpu),
            utilization_memory_pct=None if utilization is None else int(utilization.memory),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_draw_w=None if draw_mw is None else draw_mw / 1000,
            power_limit_w=None if limit_mw is None else limit_mw / 1000,
            ecc_uncorrected=uncorrected, ecc_corrected=corrected, xid_errors=xids,
            sm_clock_mhz=sm, memory_clock_mhz=mem,
            throttle_reasons=None if mask is None else throttle_reasons(mask),
            notes=[note[:200] for note in device.notes[:MAX_NOTES]],
        )  # fmt: skip

    def _ecc(self, handle: Any, kind: int) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEccErrors(handle, kind, _VOLATILE))

    def _xids(self, device: _Device) -> list[int] | None:
        """The XIDs delivered to the device's event set since the last reading, without
        waiting (None: the device cannot report them)."""
        nvml = self._nvml
        if device.events is None:
            return None
        xids: list[int] = []
        for _ in range(4 * MAX_XIDS):  # drain what is waiting (bounded: a storm cannot hold us)
            try:
                data = nvml.nvmlEventSetWait(device.events, 0)
            except nvml.NVMLError_Timeout:
                return xids
            except nvml.NVMLError_GpuIsLost:
                raise _Lost from None
            except nvml.NVMLError as exc:
                device.notes.append(f"xid_errors: {exc}")
                return xids
            if int(data.eventType) & _XID_EVENT and len(xids) < MAX_XIDS:
                xids.append(int(data.eventData))
        return xids


def _text(value: bytes | str) -> str:
    """NVML's strings come as bytes from older nvidia-ml-py releases, str from newer."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    return text[:200]
