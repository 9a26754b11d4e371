"""The response cache's answers shared through Redis, and which gateway is computing which: so
a deterministic request asked again at any gateway is answered from the cache, and identical
requests at several gateways at once reach a backend once (director/cache.py).

    {prefix}:answer:{key}   an answer kept (msgpack), expiring after the cache's ttl_s
    {prefix}:flight:{key}   the gateway computing it (SET NX), expiring after the
                            coalescing timeout, deleted once the answer is kept

A gateway that finds neither claims the flight and goes to a backend; one that finds a flight
another holds polls for the answer every `poll_s` until it comes, the flight is gone (its
holder failed: it goes itself), or the coalescing timeout passes.

Every call has a time budget (`budget_s`); Redis slow or away is a miss, never an error: the
request goes to a backend, as it would without the cache (`failures` counts it). A waiting
gateway that gets no word on one poll polls again until its timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from redis.exceptions import RedisError

from fleetgate.clock import Clock

log = logging.getLogger(__name__)

Execute = Callable[..., Awaitable[Any]]
NO_WORD = object()  # what a call Redis did not answer in time returns


class Kept(msgspec.Struct, array_like=True):
    """An answer as Redis keeps it."""

    headers: list[tuple[bytes, bytes]]
    body: bytes


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Kept).decode


class SharedAnswers:
    def __init__(
        self,
        execute: Execute,
        prefix: str,
        gateway_id: str,
        clock: Clock,
        *,
        ttl_s: float,
        hold_s: float,
        budget_s: float = 0.2,
        poll_s: float = 0.01,
    ) -> None:
        self._execute = execute
        self._prefix = prefix
        self._gateway_id = gateway_id
        self._clock = clock
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._hold_ms = max(1, round(hold_s * 1000))
        self._hold_s = hold_s
        self._budget_s = budget_s
        self._poll_s = poll_s
        self.failures = 0  # calls Redis did not answer within the budget

    def _keys(self, key: bytes) -> tuple[str, str]:
        name = key.hex()
        return f"{self._prefix}:answer:{name}", f"{self._prefix}:flight:{name}"

    async def _call(self, *command: Any) -> Any:
        """A command's reply; NO_WORD when Redis did not answer in time (counted)."""
        try:
            return await self._clock.within(self._execute(*command), self._budget_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.debug("response cache in Redis: %s", exc)
            return NO_WORD

    async def get(self, key: bytes) -> Kept | None:
        raw = await self._call("GET", self._keys(key)[0])
        if raw is None or raw is NO_WORD:
            return None
        try:
            return _decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    async def claim(self, key: bytes) -> bool:
        """This gateway computes the answer: True; False when another already does (Redis
        away: True, the request goes itself)."""
        claimed = await self._call(
            "SET", self._keys(key)[1], self._gateway_id, "NX", "PX", self._hold_ms
        )
        return claimed is not None  # None: another holds it; NO_WORD: Redis away, go yourself

    async def wait(self, key: bytes) -> Kept | None:
        """The answer another gateway is computing, once kept; None when it gives up or the
        coalescing timeout passes."""
        answer_key, flight_key = self._keys(key)
        deadline = self._clock.now() + self._hold_s
        while self._clock.now() < deadline:
            await self._clock.sleep(self._poll_s)
            reply = await self._call("MGET", answer_key, flight_key)
            if reply is NO_WORD:
                continue  # no word this time: the flight may still land
            raw, holder = reply
            if raw is not None:
                try:
                    return _decode(raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return None
            if holder is None:
                return None  # its holder gave up (or Redis lost it): go yourself
        return None

    async def keep(
        self, key: bytes, headers: list[tuple[bytes, bytes]], body: bytes, held: bool = True
    ) -> None:
        """The answer, for every gateway; the flight over when this gateway `held` it."""
        answer_key, flight_key = self._keys(key)
        await self._call("SET", answer_key, _encode(Kept(headers, body)), "PX", self._ttl_ms)
        if held:
            await self._call("DEL", flight_key)

    async def release(self, key: bytes) -> None:
        """No answer to share (an error, a stream): the waiting gateways go themselves."""
        await self._call("DEL", self._keys(key)[1])
