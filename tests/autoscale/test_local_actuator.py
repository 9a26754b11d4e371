"""The local actuator's settings: what it refuses of the flags a config passes to the
workers it starts (a config posted to /admin/config may carry them)."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.autoscale.local import LocalActuatorSettings
from fleetgate.config import Config, ConfigError
from fleetgate.processes import check_workers


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--port", "80"], "--port is the actuator's to set"),
        (["--model", "other"], "--model is the actuator's to set"),
        (["--added-latency", "0.1; rm -rf /"], "give flags and plain values only"),
        (["$(reboot)"], "give flags and plain values only"),
    ],
)
def test_flags_it_sets_and_odd_values_are_refused(args: list[str], error: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=error):
        msgspec.convert({"args": args}, LocalActuatorSettings)


def test_plain_flags_pass() -> None:
    settings = msgspec.convert({"args": ["--added-latency", "0.02"]}, LocalActuatorSettings)
    assert settings.args == ["--added-latency", "0.02"]


def test_several_gateway_processes_may_not_each_start_workers() -> None:
    pool = {"model": "m", "backends": [], "autoscale": {"enabled": True, "local": {}}}
    config = msgspec.convert({"pools": [pool]}, Config)
    check_workers(config, 1)
    with pytest.raises(ConfigError, match="each of the 2 processes would start its own"):
        check_workers(config, 2)
