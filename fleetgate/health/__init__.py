"""Health detectors: active probes and passive outlier detection, each setting its own flag."""

from fleetgate.health.active import ActiveChecker, ActiveCheckSettings
from fleetgate.health.outlier import OutlierDetector, OutlierSettings

__all__ = ["ActiveCheckSettings", "ActiveChecker", "OutlierDetector", "OutlierSettings"]
