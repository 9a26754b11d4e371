"""Observability, from the request lifecycle's events: Prometheus metrics now; traces, logs,
SLOs and the dashboard later."""

from fleetgate.observe.metrics import GatewayMetrics

__all__ = ["GatewayMetrics"]
