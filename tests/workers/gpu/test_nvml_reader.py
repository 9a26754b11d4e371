"""The NVML reader's code paths, over a stand-in for the pynvml module (no GPU here): the
real package's error classes and its struct types, with devices whose answers each test sets.
On a machine with a GPU, `fleetgate worker gpu-agent --once --print` shows the real thing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from fleetgate.workers.gpu.reader import (
    NvmlReader,
    NvmlUnavailable,
    open_nvml,
    throttle_reasons,
)


@dataclass
class Device:
    """What a fake NVML answers for one GPU: a value, or an NVMLError subclass to raise."""

    answers: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[int, int]] = field(default_factory=list)  # (event type, data) waiting
    xid_supported: bool = True

    def answer(self, call: str) -> Any:
        value = self.answers[call]
        if isinstance(value, type) and issubclass(value, pynvml.NVMLError):
            raise value()
        return value


def h100() -> Device:
    return Device({
        "name": "NVIDIA H100 80GB HBM3", "uuid": b"GPU-1234",  # bytes: old releases' strings
        "temperature_v": 64, "temperature": 63,
        "utilization": pynvml.c_nvmlUtilization_t(gpu=97, memory=41),
        "memory": pynvml.c_nvmlMemory_t(total=80 * 2**30, free=10 * 2**30, used=70 * 2**30),
        "power": 612_500, "power_limit": 700_000,
        "ecc_uncorrected": 0, "ecc_corrected": 3,
        "sm_clock": 1980, "mem_clock": 2619,
        "reasons": 0x4,  # sw_power_cap
    })  # fmt: skip


def fake_nvml(devices: list[Device], init: Any = None) -> SimpleNamespace:
    """A stand-in for the pynvml module over `devices` (`init`: an error nvmlInit raises)."""
    sets: dict[int, Device] = {}

    def ask(call: str) -> Callable[..., Any]:
        return lambda handle, *args: devices[handle].answer(call)

    def temperature(handle: int, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return devices[handle].answer("temperature_v")

    def ecc(handle: int, kind: int, counter: int) -> Any:
        assert counter == pynvml.NVML_VOLATILE_ECC
        name = "ecc_uncorrected" if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else (
            "ecc_corrected")  # fmt: skip
        return devices[handle].answer(name)

    def clock(handle: int, kind: int) -> Any:
        return devices[handle].answer("sm_clock" if kind == pynvml.NVML_CLOCK_SM else "mem_clock")

    def create() -> int:
        sets[len(sets)] = Device()
        return len(sets) - 1

    def register(handle: int, types: int, events: int) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if not devices[handle].xid_supported:
            raise pynvml.NVMLError_NotSupported()
        sets[events] = devices[handle]

    def wait(events: int, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks
        waiting = sets[events].events
        if not waiting:
            raise pynvml.NVMLError_Timeout()
        kind, data = waiting.pop(0)
        return pynvml.c_nvmlEventData_t(eventType=kind, eventData=data)

    def nvml_init() -> None:
        if init is not None:
            raise init()

    return SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        NVMLError_FunctionNotFound=pynvml.NVMLError_FunctionNotFound,
        NVMLError_GpuIsLost=pynvml.NVMLError_GpuIsLost,
        NVMLError_Timeout=pynvml.NVMLError_Timeout,
        nvmlInit=nvml_init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=ask("name"), nvmlDeviceGetUUID=ask("uuid"),
        nvmlDeviceGetTemperatureV=temperature, nvmlDeviceGetTemperature=ask("temperature"),
        nvmlDeviceGetUtilizationRates=ask("utilization"),
        nvmlDeviceGetMemoryInfo=ask("memory"),
        nvmlDeviceGetPowerUsage=ask("power"),
        nvmlDeviceGetEnforcedPowerLimit=ask("power_limit"),
        nvmlDeviceGetTotalEccErrors=ecc, nvmlDeviceGetClockInfo=clock,
        nvmlDeviceGetCurrentClocksEventReasons=ask("reasons"),
        nvmlDeviceGetCurrentClocksThrottleReasons=ask("reasons"),
        nvmlEventSetCreate=create, nvmlDeviceRegisterEvents=register,
        nvmlEventSetWait=wait, nvmlEventSetFree=lambda events: None,
    )  # fmt: skip


def test_the_reason_bitmask_decodes_into_names_in_bit_order() -> None:
    assert throttle_reasons(0) == []
    # nvml.h's values, as the installed pynvml spells them.
    mask = (pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
            | pynvml.nvmlClocksThrottleReasonSwPowerCap
            | pynvml.nvmlClocksThrottleReasonHwSlowdown)  # fmt: skip
    assert throttle_reasons(mask) == ["sw_power_cap", "hw_slowdown", "hw_thermal"]
    assert throttle_reasons(pynvml.nvmlClocksThrottleReasonSwThermalSlowdown) == ["sw_thermal"]
    assert throttle_reasons(pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown | 0x10000) == [
        "hw_power_brake", "other"
    ]  # fmt: skip


def test_every_field_is_read_in_its_unit() -> None:
    reading = NvmlReader(fake_nvml([h100()]), 1).read()[0]
    assert reading.index == 0
    assert (reading.name, reading.uuid) == ("NVIDIA H100 80GB HBM3", "GPU-1234")
    assert reading.temperature_c == 64
    assert (reading.utilization_gpu_pct, reading.utilization_memory_pct) == (97, 41)
    assert (reading.memory_used_bytes, reading.memory_total_bytes) == (70 * 2**30, 80 * 2**30)
    assert (reading.power_draw_w, reading.power_limit_w) == (612.5, 700.0)  # from milliwatts
    assert (reading.ecc_uncorrected, reading.ecc_corrected) == (0, 3)
    assert (reading.sm_clock_mhz, reading.memory_clock_mhz) == (1980, 2619)
    assert reading.throttle_reasons == ["sw_power_cap"]
    assert reading.xid_errors == []
    assert reading.notes == []
    assert not reading.lost


def test_an_unsupported_query_is_none_with_a_note_and_the_rest_is_read() -> None:
    device = h100()
    device.answers["ecc_uncorrected"] = pynvml.NVMLError_NotSupported  # ECC off (GeForce)
    device.answers["ecc_corrected"] = pynvml.NVMLError_NotSupported
    device.answers["power_limit"] = pynvml.NVMLError_NoPermission
    reading = NvmlReader(fake_nvml([device]), 1).read()[0]
    assert reading.ecc_uncorrected is None and reading.ecc_corrected is None
    assert reading.power_limit_w is None
    assert reading.power_draw_w == 612.5 and reading.temperature_c == 64
    assert reading.notes == [
        "power_limit_w: Insufficient Permissions", "ecc_uncorrected: Not Supported",
        "ecc_corrected: Not Supported",
    ]  # fmt: skip


def test_a_call_the_driver_lacks_falls_back_to_the_older_one() -> None:
    device = h100()
    device.answers["temperature_v"] = pynvml.NVMLError_FunctionNotFound
    assert NvmlReader(fake_nvml([device]), 1).read()[0].temperature_c == 63
    nvml = fake_nvml([h100()])
    del nvml.nvmlDeviceGetCurrentClocksEventReasons  # an nvidia-ml-py release before it
    assert NvmlReader(nvml, 1).read()[0].throttle_reasons == ["sw_power_cap"]


def test_xid_errors_are_drained_per_device_without_waiting() -> None:
    first, second = h100(), h100()
    reader = NvmlReader(fake_nvml([first, second]), 2)
    first.events += [(pynvml.nvmlEventTypeXidCriticalError, 79),
                     (pynvml.nvmlEventTypeXidCriticalError, 48)]  # fmt: skip
    readings = reader.read()
    assert readings[0].xid_errors == [79, 48]
    assert readings[1].xid_errors == []
    assert reader.read()[0].xid_errors == []  # each XID is reported once


def test_a_device_that_cannot_report_xids_says_so() -> None:
    device = h100()
    device.xid_supported = False
    reading = NvmlReader(fake_nvml([device]), 1).read()[0]
    assert reading.xid_errors is None
    assert reading.notes == ["xid_errors: Not Supported"]


def test_a_lost_gpu_is_read_as_lost() -> None:
    device = h100()
    device.answers["memory"] = pynvml.NVMLError_GpuIsLost
    reading = NvmlReader(fake_nvml([device]), 1).read()[0]
    assert reading.lost
    assert reading.temperature_c is None


def test_without_nvml_opening_fails_with_what_to_install() -> None:
    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(NvmlUnavailable, match=r"pynvml.*fleetgate\[gpu\]"):
        open_nvml(missing)
    broken = fake_nvml([], init=pynvml.NVMLError_DriverNotLoaded)
    with pytest.raises(NvmlUnavailable, match=r"nvmlInit failed: Driver Not Loaded.*nvidia-smi"):
        open_nvml(lambda name: broken)
    with pytest.raises(NvmlUnavailable, match="found no GPU"):
        open_nvml(lambda name: fake_nvml([]))


def test_the_command_exits_with_one_clear_message_when_nvml_is_unavailable() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetgate", "worker", "gpu-agent", "--once", "--print"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode == 0:
        pytest.skip("NVML works on this machine: the agent read its GPUs")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fleetgate worker gpu-agent: cannot read the GPUs: nvmlInit")
    assert "nvidia-smi" in lines[0] and "fleetgate[gpu]" in lines[0]
