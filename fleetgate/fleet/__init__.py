"""What the gateway knows about its backends: who each is, its live state and health, and the
pool (host set) of each model."""

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.health import HealthFlag, HealthSettings, Verdict
from fleetgate.fleet.pool import Pool

__all__ = ["Backend", "BackendState", "HealthFlag", "HealthSettings", "Pool", "Verdict"]
