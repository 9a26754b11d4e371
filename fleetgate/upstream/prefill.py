"""Prefill/decode disaggregation (vLLM's protocol): the prefill half of a request runs on a
prefill backend, and the KV handoff it answers with goes into the body the decode backend gets.

Any failure leaves the body as it was: the decode backend then prefills the prompt itself,
slower but answered. What the prefill backend's answer says of it is the outlier detector's
rule, as for any attempt: an engine's 429 or 503 with Retry-After backs it off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from fleetgate.http.errors import UpstreamError
from fleetgate.http.transport import Transport
from fleetgate.lifecycle.events import AttemptKind, AttemptStarted, ErrorKind
from fleetgate.lifecycle.hooks import Emitters
from fleetgate.openai_api import with_fields
from fleetgate.routing.router import Router
from fleetgate.upstream.attempt import Exchange, error_kind, retry_after_s
from fleetgate.upstream.bracket import Bracket
from fleetgate.upstream.routed import routed
from fleetgate.upstream.timeouts import Timeouts

# What a prefill engine is asked for, as vLLM's disaggregation proxies ask it.
PREFILL_HANDOFF = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}  # fmt: skip


def prefill_body(body: bytes) -> bytes:
    """The body for the prefill half of a disaggregated request: one token (whichever limit
    the client used), not streamed, with kv_transfer_params asking the engine to keep the KV
    for a remote decode."""
    return with_fields(
        body, ("stream_options", "min_tokens", "max_completion_tokens"), stream=False,
        max_tokens=1, kv_transfer_params=PREFILL_HANDOFF,
    )  # fmt: skip


class _Handoff(msgspec.Struct):
    kv_transfer_params: dict[str, msgspec.Raw] | None = None


_handoff = msgspec.json.Decoder(_Handoff)


def handoff_params(prefill_answer: bytes) -> dict[str, msgspec.Raw] | None:
    """The kv_transfer_params a prefill engine answered with, or None."""
    try:
        return _handoff.decode(prefill_answer).kv_transfer_params
    except msgspec.DecodeError:
        return None


class Prefill:
    """Runs the prefill half of disaggregated requests on a pool's prefill backends."""

    def __init__(
        self,
        transport: Transport,
        clock: Callable[[], float],
        router: Router,
        timeouts: Timeouts,
        emit: Emitters,
    ) -> None:
        self._transport = transport
        self._clock = clock
        self.router = router
        self._timeouts = timeouts
        self._emit = emit  # the prefill pool's: its accounting and outliers hear these

    async def handoff(self, ex: Exchange) -> bytes:
        """The body for the decode backend: with the KV handoff, or as it was."""
        clock, emit, t = self._clock, self._emit, self._timeouts
        routing, model = ex.routing, ex.model
        kind: AttemptKind = "prefill"
        now = clock()
        state = routed(self.router, emit, request_id=ex.request_id, model=model,
                       routing=routing, kind=kind, now=now)  # fmt: skip
        if state is None:
            return ex.body
        queued = self.router.pool.board.load(state.backend.id).pending_prefill
        ex.attempts += 1
        events = Bracket(emit, AttemptStarted(
            request_id=ex.request_id, at=now, model=model, backend=state.backend.id, kind=kind,
            prompt_tokens=routing.prompt_tokens, queued_prefill=queued,
        ))  # fmt: skip
        status = 0
        error: ErrorKind | None = None
        wait_s: float | None = None
        answer = b""
        try:
            response = await self._transport.request(
                state.backend.origin, b"POST", ex.path, [*ex.headers, *state.backend.credentials],
                prefill_body(ex.body),
                timeout_s=t.first_byte_s, connect_timeout_s=t.connect_s,
            )  # fmt: skip
            response.expire_in(t.total_s, t.total_message)
            status = response.status
            wait_s = retry_after_s(response.header(b"retry-after"))
            answer = await response.read()
        except UpstreamError as exc:
            error = error_kind(exc)
        except asyncio.CancelledError:
            error = "cancelled"
            raise
        except Exception:
            error = "gateway"
            raise
        finally:
            events.ended(
                at=clock(), status=status, error=error, retry_after_s=wait_s,
                first_token_at=None, output_tokens=0, stream=False,
            )  # fmt: skip
        params = handoff_params(answer) if status == 200 else None
        if params is None:
            return ex.body
        return with_fields(ex.body, kv_transfer_params=params)
