"""Health detectors: active probes and passive outlier detection, each setting its own flag."""
