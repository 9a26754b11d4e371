"""What a benchmark sends and when: the request spec, arrival processes, and the run's bounds.

A workload is a lazy iterator of `RequestSpec` in send order (see `traces` and `generated` for
the builders). Builders stamp trace time on each spec, or 0 when there is none; `schedule`
then sets the send times, open-loop: from the trace scaled by a speed factor, or from a Poisson
process at a fixed rate. `bounded` stops the stream at the run's duration or request count.
Nothing here waits on a response, so a slow server cannot slow the offered load.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Protocol, TypeVar

Endpoint = Literal["chat", "completions"]
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions")


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: its time, its prompt and how much output to ask for."""

    at_s: float  # when to send it, in seconds after the run starts
    messages: tuple[Message, ...]  # the chat form; `prompt` is the completions form
    prompt_tokens: int  # tokens of all the messages' contents, by fleetgate.tokens' rule
    max_tokens: int  # asked for with ignore_eos, so it is also the output length
    endpoint: Endpoint = "chat"
    group: int | None = None  # the shared-prefix group, where the workload has one

    @property
    def prompt(self) -> str:
        """The messages' contents joined: the same tokens, as one completions prompt."""
        if len(self.messages) == 1:
            return self.messages[0].content
        return "".join(m.content for m in self.messages)


def user_request(
    at_s: float, text: str, prompt_tokens: int, max_tokens: int, endpoint: Endpoint
) -> RequestSpec:
    """A spec with one user message: the shape every trace replay sends."""
    return RequestSpec(at_s, (Message("user", text),), prompt_tokens, max(1, max_tokens), endpoint)


@dataclass(frozen=True, slots=True)
class TraceTimes:
    """Send at the trace's own times, divided by `speed` (2.0 = twice as fast)."""

    speed: float = 1.0

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"trace speed must be a positive number, not {self.speed}")


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Ignore trace times; send at Poisson arrivals of `rate` requests/s (inf: all at once)."""

    rate: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"request rate must be positive, not {self.rate}")


MAX_BURST = 10_000  # the largest mean burst size taken


@dataclass(frozen=True, slots=True)
class Bursts:
    """Requests in bursts, at a mean of `rate` requests/s: bursts start as a Poisson process of
    rate / `size` a second, each holds a geometric number of requests with mean `size` (at
    least one), sent at uniform times over `spread_s` from its start. Bursts may overlap.
    Code completion's traffic has this shape: an editor asks again at each pause in typing."""

    rate: float
    size: float = 8.0
    spread_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"request rate must be a positive number, not {self.rate}")
        if not 1 <= self.size <= MAX_BURST:  # (a burst's times are drawn at once)
            raise ValueError(f"burst size must be from 1 to {MAX_BURST:,}, not {self.size}")
        if not (self.spread_s >= 0 and math.isfinite(self.spread_s)):
            raise ValueError(f"burst spread must be a number of seconds >= 0, not {self.spread_s}")

    def times(self, rng: random.Random) -> Iterator[float]:
        """Endless send times, ascending."""
        pending: list[float] = []  # drawn times of the bursts begun, not yet given
        start = rng.expovariate(self.rate / self.size)
        keep = 1.0 - 1.0 / self.size  # a burst goes on after each request with this chance
        while True:
            while not pending or pending[0] > start:  # a burst that begins first: draw it
                heapq.heappush(pending, start + rng.uniform(0.0, self.spread_s))
                while rng.random() < keep:
                    heapq.heappush(pending, start + rng.uniform(0.0, self.spread_s))
                start += rng.expovariate(self.rate / self.size)
            yield heapq.heappop(pending)


Arrivals = TraceTimes | PoissonArrivals | Bursts


class Timed(Protocol):
    """Something sent at a time: a RequestSpec, or the simulator's request."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def at_s(self) -> float: ...


T = TypeVar("T", bound=Timed)


def schedule(specs: Iterable[T], arrivals: Arrivals, rng: random.Random) -> Iterator[T]:
    """`specs` with their send times set by `arrivals` (gaps drawn from `rng`)."""
    if isinstance(arrivals, TraceTimes):
        if arrivals.speed == 1.0:
            yield from specs
            return
        for spec in specs:
            yield replace(spec, at_s=spec.at_s / arrivals.speed)
        return
    if isinstance(arrivals, Bursts):
        for spec, at_s in zip(specs, arrivals.times(rng), strict=False):  # endless times
            yield replace(spec, at_s=at_s)
        return
    if math.isinf(arrivals.rate):
        for spec in specs:
            yield replace(spec, at_s=0.0)
        return
    # A Poisson process: independent exponential gaps with mean 1/rate.
    t = 0.0
    for spec in specs:
        t += rng.expovariate(arrivals.rate)
        yield replace(spec, at_s=t)


def bounded(specs: Iterable[T], duration_s: float, max_requests: int | None = None) -> Iterator[T]:
    """The specs sent before `duration_s`, at most `max_requests` of them (times ascending)."""
    if max_requests is not None and max_requests <= 0:
        return
    for count, spec in enumerate(specs, 1):
        if spec.at_s >= duration_s:
            return
        yield spec
        if count == max_requests:
            return
