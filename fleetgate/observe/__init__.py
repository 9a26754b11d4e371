"""Observability: Prometheus metrics now; traces, logs, SLOs and the dashboard later."""
