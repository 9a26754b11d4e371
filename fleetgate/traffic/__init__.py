"""The front door: tenants and their API keys, rate limits and budgets (reserved on arrival,
reconciled at the end, counted in memory or in a Redis several gateways share), priority
classes; door.py is what the gateway's edge asks."""

from fleetgate.traffic.door import Caller, FrontDoor, Refused
from fleetgate.traffic.keys import KeyRing
from fleetgate.traffic.limits import Limits, PricingSettings
from fleetgate.traffic.priority import Priority
from fleetgate.traffic.redis_store import RedisStore
from fleetgate.traffic.store import Bucket, LimitStore, MemoryStore
from fleetgate.traffic.tenants import Tenant, TenantSettings

__all__ = [
    "Bucket",
    "Caller",
    "FrontDoor",
    "KeyRing",
    "LimitStore",
    "Limits",
    "MemoryStore",
    "PricingSettings",
    "Priority",
    "RedisStore",
    "Refused",
    "Tenant",
    "TenantSettings",
]
