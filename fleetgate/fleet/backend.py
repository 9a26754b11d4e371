"""A backend (one model-server replica) and the live state the gateway keeps for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import urlsplit

from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.engines import configured
from fleetgate.fleet.gpu import GpuStatus
from fleetgate.fleet.health import HealthFlag, Verdict
from fleetgate.fleet.latency import LatencyStats
from fleetgate.fleet.step_fit import StepFit
from fleetgate.http.client import Origin


def backend_origin(url: str) -> Origin:
    """Where a backend's OpenAI paths live. A trailing /v1, as in an OpenAI client's base_url,
    is accepted and dropped, since the gateway forwards the /v1/... path it was asked."""
    origin = Origin.parse(url)
    if origin.base_path.endswith(b"/v1"):
        return Origin.parse(url.rstrip("/")[:-3])
    return origin


def check_joining_url(url: str) -> None:
    """A backend that joins at run time (the admin API, discovery) names its scheme, host and
    port, and no credentials, query or fragment; ValueError saying which is missing (its
    message never repeats a user or password)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        shown = url if parts.username is None and parts.password is None else "(with credentials)"
        raise ValueError(f"`url` must be http(s)://HOST:PORT[/PATH], got {shown!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("`url` must not hold a user or password: give the backend's key as"
                         " `api_key`.")  # fmt: skip
    if parts.query or parts.fragment:
        raise ValueError(f"`url` must have no query or fragment, got {url!r}")


def backend_id(url: str) -> str:
    """A backend's id in the gateway, from its URL: host:port and any base path."""
    origin = backend_origin(url)
    return f"{origin.host}:{origin.port}{origin.base_path.decode()}"


# The labels that say where a backend is (routing/locality.py; residency: routing/router.py).
REGION, ZONE = "region", "zone"
STANDBY = "standby"  # a backend labelled standby: "true" waits until its region needs it


@dataclass(frozen=True, slots=True)
class Backend:
    """Who a backend is: fixed for its lifetime (an operator's new weight replaces it with a
    copy: fleet/pool.py `set_weight`)."""

    id: str  # unique in the gateway, e.g. "127.0.0.1:8101"
    url: str
    models: tuple[str, ...]
    weight: float = 1.0  # relative share for weight-aware policies; > 0
    labels: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({})
    )  # region, zone, accelerator, ...
    max_in_flight: int | None = None  # at this many requests routing skips it; None: no limit
    api_key: str | None = field(default=None, repr=False)  # its own, never a client's
    # What clients may be told of it, never its address: its pool's model and its place
    # there, e.g. "llama-3.1-8b-instruct#1" (serve.py); its first model when not given.
    name: str = ""
    cost_per_hour_usd: float = 0.0  # what it costs to run an hour (its GPUs), for metrics
    engine: str = "auto"  # what serves it (fleet/engines.py); auto: probed
    origin: Origin = field(init=False, compare=False)
    # What every request to it carries besides the client's headers: its api key.
    credentials: tuple[tuple[bytes, bytes], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", backend_origin(self.url))
        key = self.api_key
        credentials = () if key is None else ((b"authorization", b"Bearer " + key.encode()),)
        object.__setattr__(self, "credentials", credentials)
        if not self.name:
            object.__setattr__(self, "name", self.models[0] if self.models else "backend")


class BackendState:
    """How a backend is doing now, as the gateway sees it: routing reads it; the lifecycle's
    subscribers (lifecycle/accounting.py) and the health detectors write it. What is in
    flight to it is on its pool's load board, by its id (fleet/load_board.py)."""

    __slots__ = (
        "backend", "backoff_until", "engine", "flags", "gpus", "kind", "latency", "ramp_from",
        "speed", "step_fit", "throttle_share", "weight",
    )  # fmt: skip

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # effective: typed weight x speed x slow-start share x throttle share
        self.weight = backend.weight
        self.speed = 1.0  # measured speed relative to the pool's fastest (fleet/calibration.py)
        self.flags = HealthFlag(0)  # set by the health detectors; none set means healthy
        self.backoff_until = 0.0  # an engine asked for no traffic until then (Retry-After)
        self.ramp_from: float | None = None  # when its slow start began; None: full weight
        self.throttle_share = 1.0  # of its weight, while its GPUs throttle (health/gpu.py)
        self.gpus: GpuStatus | None = None  # its GPU agent's last readings (None: no agent)
        self.engine: EngineLoad | None = None  # the engine's last reported load (scraped)
        self.kind = configured(backend.engine)  # what serves it; probed when `auto`
        self.latency = LatencyStats()  # what the gateway measured of its recent answers
        self.step_fit = StepFit()  # its engine's speed, from the step metrics scraped

    @property
    def healthy(self) -> bool:
        return not self.flags

    def verdict(self, now: float) -> Verdict:
        """The one word for routing and operators: flags make it unhealthy; backing off,
        ramping up after a return or throttling GPUs, degraded."""
        if self.flags:
            return Verdict.UNHEALTHY
        if self.backoff_until > now or self.ramp_from is not None or self.throttle_share < 1.0:
            return Verdict.DEGRADED
        return Verdict.HEALTHY

    def __repr__(self) -> str:
        return f"BackendState({self.backend.id})"
