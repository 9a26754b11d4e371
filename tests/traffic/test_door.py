"""The front door's check of a key: what it remembers of the values it has checked, and what
it never lets that memory answer."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.traffic.door import Caller, FrontDoor, Refused
from fleetgate.traffic.keys import KeyRing
from fleetgate.traffic.limits import Limits
from fleetgate.traffic.store import MemoryStore
from fleetgate.traffic.tenants import Tenant, TenantSettings

KEY = b"sk-door-test-key-1"


def door() -> tuple[FrontDoor, Caller]:
    tenant = Tenant.of(msgspec.convert({"name": "acme"}, TenantSettings))
    caller = Caller(tenant, "k1")
    ring: KeyRing[Caller] = KeyRing()
    ring.add(KEY.decode(), caller)
    return FrontDoor(ring, Limits(MemoryStore(lambda: 0.0), lambda: 0.0)), caller


def test_a_checked_authorization_is_remembered_and_only_a_valid_one() -> None:
    front, caller = door()
    assert front.identify({b"authorization": b"Bearer " + KEY}) is caller
    assert front._known == {b"Bearer " + KEY: caller}
    for _ in range(3):  # guesses are checked each time and never remembered
        with pytest.raises(Refused) as refused:
            front.identify({b"authorization": b"Bearer sk-door-test-key-2"})
        assert refused.value.status == 401
    assert list(front._known) == [b"Bearer " + KEY]
    assert front.identify({b"authorization": b"Bearer " + KEY}) is caller  # remembered


def test_a_remembered_value_answers_only_for_authorization() -> None:
    front, caller = door()
    front.identify({b"authorization": b"Bearer " + KEY})
    # The same bytes as an Azure-style `api-key` are a different (invalid) key.
    with pytest.raises(Refused):
        front.identify({b"api-key": b"Bearer " + KEY})
    assert front.identify({b"api-key": KEY}) is caller


def test_what_is_remembered_is_bounded() -> None:
    front, caller = door()
    front._KNOWN_MAX = 3
    for spaces in range(10):  # the same key, written ten ways
        value = b"Bearer " + KEY + b" " * spaces
        assert front.identify({b"authorization": value}) is caller
        assert len(front._known) <= 3
