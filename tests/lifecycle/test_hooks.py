"""lifecycle/hooks.py: who hears which events, in the order they subscribed."""

from __future__ import annotations

from fleetgate.lifecycle.events import Event, Rejected, Retried
from fleetgate.lifecycle.hooks import Emitters, Hooks


def rejected() -> Rejected:
    return Rejected(request_id=b"r", at=1.0, status=429, reason="rate_limit_exceeded")


def test_an_event_nobody_hears_has_no_emitter_and_one_subscriber_is_its_own() -> None:
    hooks = Hooks()
    heard: list[Event] = []
    hooks.subscribe(Rejected, heard.append)
    emit = Emitters(hooks)
    assert emit.retried is None and emit.finished is None
    assert emit.rejected == heard.append  # no wrapper around a lone subscriber
    emit.rejected(rejected())
    assert heard == [rejected()]


def test_subscribers_hear_in_the_order_they_subscribed_and_a_base_type_hears_all() -> None:
    hooks = Hooks()
    heard: list[tuple[str, str]] = []
    hooks.subscribe(Rejected, lambda e: heard.append(("first", type(e).__name__)))
    hooks.subscribe(Event, lambda e: heard.append(("everything", type(e).__name__)))
    hooks.subscribe(Rejected, lambda e: heard.append(("last", type(e).__name__)))
    emit = Emitters(hooks)
    assert emit.rejected is not None and emit.retried is not None
    emit.rejected(rejected())
    emit.retried(Retried(request_id=b"r", at=2.0, model="m", status=502))
    assert heard == [
        ("first", "Rejected"), ("everything", "Rejected"), ("last", "Rejected"),
        ("everything", "Retried"),
    ]  # fmt: skip
