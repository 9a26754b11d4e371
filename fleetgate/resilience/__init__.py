"""A request's way through its pool when backends fail or are slow: retries within a budget,
hedging, continuation of a broken stream (failover.py runs them)."""

from fleetgate.resilience.cluster import Cluster
from fleetgate.resilience.failover import Failover
from fleetgate.resilience.hedge import HedgeSettings, TtftWindow
from fleetgate.resilience.retry import RetryBudget, RetrySettings

__all__ = ["Cluster", "Failover", "HedgeSettings", "RetryBudget", "RetrySettings", "TtftWindow"]
