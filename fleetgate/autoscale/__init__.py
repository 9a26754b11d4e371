"""Autoscaling: how many replicas each pool should run, from its load, its SLO and a schedule."""
