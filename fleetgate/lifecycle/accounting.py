"""Fleet accounting: what the attempts of a pool's requests change in its live state.

In flight (requests and prompt tokens, on the pool's load board) from AttemptStarted to
AttemptEnded; pending prefill until the first token (or the end, for an answer that never
streamed one); the latency averages routing reads (fleet/latency.py) from each first or
retried attempt that ended well.
A continuation's timings are left out: they measure the rest of someone else's answer.
"""

from __future__ import annotations

from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import AttemptEnded, AttemptStarted, FirstToken
from fleetgate.lifecycle.hooks import Hooks


class FleetAccounting:
    """Keeps one pool's in-flight counts and latency stats from its attempts' events."""

    __slots__ = ("_board", "_members", "_pool")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._board = pool.board
        self._members = pool.members  # kept current by the pool, in place

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(AttemptStarted, self.on_attempt_started)
        hooks.subscribe(FirstToken, self.on_first_token)
        hooks.subscribe(AttemptEnded, self.on_attempt_ended)

    def on_attempt_started(self, event: AttemptStarted) -> None:
        self._pool.begin(event.backend, event.at, event.prompt_tokens)

    def on_first_token(self, event: FirstToken) -> None:
        self._board.prefilled(event.backend, event.prompt_tokens)

    def on_attempt_ended(self, event: AttemptEnded) -> None:
        prompt = event.prompt_tokens
        unprefilled = prompt if event.first_token_at is None else 0
        self._pool.end(event.backend, event.at, prompt, unprefilled)
        if event.error is not None or event.kind in ("continuation", "prefill"):
            return
        state = self._members.get(event.backend)
        if state is None:  # it left the pool with this, its last request
            return
        if event.stream:
            if event.first_token_at is not None and event.status == 200:
                # Time per output token from tokens, not events (a transport may report
                # a stream in a few): lifecycle/events.py.
                sent = event.sent_at
                state.latency.record_stream(
                    event.first_token_at - sent,
                    event.at - sent,
                    event.output_tokens,
                    event.queued_prefill + prompt,
                )
        elif event.status < 400:
            state.latency.record_response(event.at - event.sent_at)
