"""The response cache: a deterministic request asked again is answered from memory, and
identical requests in flight at once reach a backend once.

    cache:
      enabled: true            # off by default: an operator decides what may be served twice
      ttl_s: 300               # an answer is kept this long at most
      max_entries: 10000       # and at most this many answers,
      max_bytes: 67108864      # of at most this many bytes together (least recently used go)
      coalesce_timeout_s: 30   # a request waits this long for an identical one in flight
      store: memory            # redis: every gateway on `state.url` shares its answers and
                               # its flights (shared/answers.py)

Only whole answers (status 200) of chat and completion requests are kept, and only of
requests whose answer is fixed by what they ask: `temperature` 0, or a `seed`. A request's key
is its tenant, its pool and its whole body with `stream` and `stream_options` left out, its
keys sorted: the same question asked by another tenant, of another model, or with any other
parameter is another key (one tenant is never served another's answer). A cached answer to a
streaming request is replayed as a stream (director/replay.py). With `store: redis` the answers
and the requests in flight are every gateway's on `state.url` (shared/answers.py).

`Cache-Control: no-cache` skips the lookup (the answer is still kept); `no-store` neither
looks up nor keeps. A cached answer is charged to its tenant's limits as a served one is: a
request, and the tokens its usage says.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Literal

import msgspec

from fleetgate.clock import Clock
from fleetgate.lifecycle.events import CacheResult
from fleetgate.settings import Settings, at_least, positive_seconds
from fleetgate.shared.answers import Kept, SharedAnswers

_CACHED_ENDPOINTS = frozenset(("chat", "completions"))
_UNKEYED = ("stream", "stream_options")  # how the answer is sent, not what it says
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode


class CacheSettings(Settings, frozen=True):
    """The `cache:` section."""

    enabled: bool = False
    store: Literal["memory", "redis"] = "memory"  # redis: shared by the gateways on state.url
    ttl_s: float = 300.0
    max_entries: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    coalesce_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        positive_seconds("ttl_s", self.ttl_s)
        at_least("max_entries", self.max_entries, 1)
        at_least("max_bytes", self.max_bytes, 1)
        positive_seconds("coalesce_timeout_s", self.coalesce_timeout_s)


class Answer(msgspec.Struct, frozen=True):
    """A whole answer as kept: its upstream's headers that go to the client, and its body."""

    headers: list[tuple[bytes, bytes]]
    body: bytes
    kept_at: float


def directives(cache_control: bytes) -> tuple[bool, bool]:
    """What a request's Cache-Control lets the cache do: (keep its answer, answer it from
    the cache)."""
    said = {part.strip().lower() for part in cache_control.split(b",")}
    if b"no-store" in said:
        return False, False
    return True, b"no-cache" not in said


def cache_key(tenant: str, model: str, endpoint: str, body: bytes) -> bytes | None:
    """The key of a request whose answer may be kept and served again; None for any other:
    an endpoint that is not chat or completions, a body that is not a JSON object, or a
    request that does not fix its answer (`temperature` 0 or a `seed`)."""
    if endpoint not in _CACHED_ENDPOINTS:
        return None
    try:
        fields = _decode(body)
    except msgspec.DecodeError:
        return None
    if fields.get("temperature") != 0 and fields.get("seed") is None:
        return None
    for name in _UNKEYED:
        fields.pop(name, None)
    digest = hashlib.sha256()
    for part in (tenant.encode(), model.encode(), _encode_sorted(fields)):
        digest.update(len(part).to_bytes(8, "big"))  # so no two parts run into each other
        digest.update(part)
    return digest.digest()


class ResponseCache:
    """The answers kept in this process (LRU, bounded by count and bytes, each for `ttl_s`),
    and the requests in flight that identical ones may wait for; with `shared`, the answers
    and flights of every gateway on one Redis too (shared/answers.py)."""

    def __init__(
        self, settings: CacheSettings, clock: Clock, shared: SharedAnswers | None = None
    ) -> None:
        self.settings = settings
        self._timer = clock  # the coalescing wait
        self._clock = clock.now
        self._answers: OrderedDict[bytes, Answer] = OrderedDict()
        self._bytes = 0
        self._flights: dict[bytes, asyncio.Future[Answer | None]] = {}  # led from here
        self._shared = shared  # every gateway's answers and flights (store: redis)
        self._claims: set[bytes] = set()  # flights this gateway holds in Redis
        self._telling: set[asyncio.Task[None]] = set()

    def get(self, key: bytes) -> Answer | None:
        answer = self._answers.get(key)
        if answer is None:
            return None
        if self._clock() - answer.kept_at >= self.settings.ttl_s:
            self._drop(key)
            return None
        self._answers.move_to_end(key)
        return answer

    def keep(self, key: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        """Keep an answer (unless it alone is over `max_bytes`); the answer, kept or not."""
        answer = Answer(headers, body, self._clock())
        if len(body) > self.settings.max_bytes:
            return answer
        if key in self._answers:
            self._drop(key)
        self._answers[key] = answer
        self._bytes += len(body)
        limits = self.settings
        while len(self._answers) > limits.max_entries or self._bytes > limits.max_bytes:
            self._drop(next(iter(self._answers)))
        return answer

    def _drop(self, key: bytes) -> None:
        self._bytes -= len(self._answers.pop(key).body)

    async def find(
        self, key: bytes, lookup: bool, may_lead: bool
    ) -> tuple[Answer | None, CacheResult, bool]:
        """What the cache has for a request: an answer and how it came (hit, coalesced), or
        none (miss); and whether this request is the one that goes for the identical ones
        (it ends with `landed` either way). `lookup` False: look nowhere (Cache-Control:
        no-cache); `may_lead` False: its answer cannot be shared (a stream)."""
        shared = self._shared
        if lookup:
            answer = self.get(key)
            if answer is not None:
                return answer, "hit", False
            if shared is not None and key not in self._flights:
                kept = await shared.get(key)
                if kept is not None:
                    return self.keep(key, kept.headers, kept.body), "hit", False
            # Read after the await: an identical request here may have taken off meanwhile.
            flight = self._flights.get(key)
            if flight is not None:
                answer = await self._wait(flight)
                if answer is not None:
                    return answer, "coalesced", False
        if not may_lead or key in self._flights:
            return None, "miss", False
        self._flights[key] = asyncio.get_running_loop().create_future()
        if shared is None:
            return None, "miss", True
        try:
            kept, result = await self._across(shared, key, lookup)
        except BaseException:  # the client left: the identical ones here go themselves
            self._land(key, None)
            raise
        if kept is None:
            return None, "miss", True
        answer = self.keep(key, kept.headers, kept.body)
        self._land(key, answer)
        return answer, result, False

    async def _across(
        self, shared: SharedAnswers, key: bytes, lookup: bool
    ) -> tuple[Kept | None, CacheResult]:
        """Claim the request for this gateway in Redis, or have its answer from the gateway
        that claimed it first (None: go to a backend)."""
        if await shared.claim(key):
            # Kept by another between the look and the claim: no need to go.
            kept = await shared.get(key) if lookup else None
            if kept is None:
                self._claims.add(key)
            else:
                await shared.release(key)
            return kept, "hit"
        if not lookup:
            return None, "miss"
        return await shared.wait(key), "coalesced"  # unless it gives up

    async def _wait(self, flight: asyncio.Future[Answer | None]) -> Answer | None:
        """The answer of the identical request in flight here, if it has one within
        `coalesce_timeout_s` (None: go to a backend yourself)."""
        try:
            return await self._timer.within(
                asyncio.shield(flight), self.settings.coalesce_timeout_s
            )
        except TimeoutError:
            return None

    def landed(self, key: bytes, answer: Answer | None, led: bool) -> None:
        """A request that went has its answer (None: nothing to share); `led`: the one
        `find` sent for the others, whose waiters go themselves without an answer."""
        if led:
            self._land(key, answer)
        shared = self._shared
        if shared is None:
            return
        claimed = key in self._claims
        self._claims.discard(key)
        if answer is not None:
            self._later(shared.keep(key, answer.headers, answer.body, claimed))
        elif claimed:
            self._later(shared.release(key))

    def _land(self, key: bytes, answer: Answer | None) -> None:
        flight = self._flights.pop(key, None)
        if flight is not None and not flight.done():
            flight.set_result(answer)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Tell Redis without the request waiting for it (held until done)."""
        task = asyncio.get_running_loop().create_task(work)
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def __len__(self) -> int:
        return len(self._answers)
