"""An attempt's events, made in one place: its AttemptStarted when it is sent, the FirstToken
of a stream, and its AttemptEnded however it went, the last two carrying what the first said
(its request, pool, backend, kind, prompt and queued prefill). Every attempt (upstream/attempt.py:
first, retry, hedge, continuation; upstream/prefill.py: a prefill) reports through one."""

from __future__ import annotations

from fleetgate.lifecycle.events import AttemptEnded, AttemptStarted, ErrorKind, FirstToken
from fleetgate.lifecycle.hooks import Emitters


class Bracket:
    """The events of one attempt, begun by its AttemptStarted (emitted here)."""

    __slots__ = ("_emit", "start")

    def __init__(self, emit: Emitters, start: AttemptStarted) -> None:
        self._emit = emit
        self.start = start
        if emit.attempt_started is not None:
            emit.attempt_started(start)

    def first_token(self, *, at: float, ttft_s: float | None, batch: bool) -> None:
        """Its stream's first event arrived at `at` (`ttft_s`: the client's time to its first
        token, when this attempt has the client)."""
        first_token = self._emit.first_token
        if first_token is not None:
            s = self.start
            first_token(
                FirstToken(
                    request_id=s.request_id,
                    at=at,
                    model=s.model,
                    backend=s.backend,
                    kind=s.kind,
                    prompt_tokens=s.prompt_tokens,
                    ttft_s=ttft_s,
                    sent_at=s.at,
                    batch=batch,
                )
            )

    def ended(
        self,
        *,
        at: float,
        status: int,
        error: ErrorKind | None,
        retry_after_s: float | None,
        first_token_at: float | None,
        output_tokens: int,
        stream: bool,
        prior_status: int = 0,
        prior_backend: str | None = None,
        priority: int = 1,
    ) -> None:
        """It is over (lifecycle/events.py's AttemptEnded says what each field means)."""
        attempt_ended = self._emit.attempt_ended
        if attempt_ended is not None:
            s = self.start
            attempt_ended(
                AttemptEnded(
                    request_id=s.request_id,
                    at=at,
                    model=s.model,
                    backend=s.backend,
                    kind=s.kind,
                    sent_at=s.at,
                    prompt_tokens=s.prompt_tokens,
                    queued_prefill=s.queued_prefill,
                    status=status,
                    error=error,
                    retry_after_s=retry_after_s,
                    first_token_at=first_token_at,
                    output_tokens=output_tokens,
                    stream=stream,
                    prior_status=prior_status,
                    prior_backend=prior_backend,
                    priority=priority,
                )
            )
