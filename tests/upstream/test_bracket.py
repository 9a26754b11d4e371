"""An attempt's events come from one Bracket: FirstToken and AttemptEnded repeat what its
AttemptStarted said, and an event nobody hears is not made."""

from __future__ import annotations

from fleetgate.lifecycle.events import AttemptEnded, AttemptStarted, Event, FirstToken
from fleetgate.lifecycle.hooks import Emitters, Hooks
from fleetgate.upstream.bracket import Bracket

START = AttemptStarted(
    request_id=b"r1", at=10.0, model="m", backend="b1", kind="hedge", prompt_tokens=40,
    queued_prefill=7,
)  # fmt: skip


def test_the_bracket_s_events_carry_what_its_start_said() -> None:
    heard: list[Event] = []
    hooks = Hooks()
    for kind in (AttemptStarted, FirstToken, AttemptEnded):
        hooks.subscribe(kind, heard.append)
    events = Bracket(Emitters(hooks), START)
    events.first_token(at=10.5, ttft_s=None, batch=True)
    events.ended(
        at=12.0, status=200, error=None, retry_after_s=None, first_token_at=10.5,
        output_tokens=30, stream=True, prior_status=503, prior_backend="b0", priority=0,
    )  # fmt: skip
    started, first, ended = heard
    assert started is START
    assert first == FirstToken(
        request_id=b"r1", at=10.5, model="m", backend="b1", kind="hedge", prompt_tokens=40,
        ttft_s=None, sent_at=10.0, batch=True,
    )  # fmt: skip
    assert ended == AttemptEnded(
        request_id=b"r1", at=12.0, model="m", backend="b1", kind="hedge", sent_at=10.0,
        prompt_tokens=40, queued_prefill=7, status=200, error=None, retry_after_s=None,
        first_token_at=10.5, output_tokens=30, stream=True, prior_status=503,
        prior_backend="b0", priority=0,
    )  # fmt: skip


def test_events_nobody_hears_are_not_made() -> None:
    heard: list[Event] = []
    hooks = Hooks()
    hooks.subscribe(AttemptEnded, heard.append)
    events = Bracket(Emitters(hooks), START)  # no AttemptStarted or FirstToken subscriber
    events.first_token(at=10.5, ttft_s=0.5, batch=False)
    events.ended(
        at=11.0, status=502, error="read", retry_after_s=None, first_token_at=None,
        output_tokens=0, stream=False,
    )  # fmt: skip
    assert [type(e) for e in heard] == [AttemptEnded]
