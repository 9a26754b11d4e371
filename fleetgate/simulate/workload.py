"""What a simulation sends: `fleetgate bench`'s workloads as the simulator's requests.

A trace (the shipped Azure and Mooncake ones, or a user's file) is read row by row, never as
text: a request is its lengths and its prompt's blocks of BLOCK_TOKENS (Mooncake's hash ids;
fresh ids for a trace without them), so an hour of Mooncake (12k prompts of 12k tokens on
average) costs no filler text. Routing still sees a prompt: `prompt_bytes` builds one from the
blocks, 4 bytes a token (the gateway's estimate), each block's bytes its own, so equal block
prefixes are equal byte prefixes, as prefix routing needs. A generated workload (synthetic,
code-completion, shared-prefix) is the bench's own text, its blocks hashed from it.

Scaling: `speed` divides a trace's times (2 = twice the rate), `rate` replaces them with a
Poisson process (or the bench's bursts for code-completion), `length_scale` multiplies prompt
and answer lengths. Each request comes from one of the client regions, drawn by their shares.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import random
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec
from xxhash import xxh3_64_intdigest

from fleetgate.bench.config import BenchConfig, WorkloadName, build_workload
from fleetgate.bench.tracefile import TraceRow, azure_rows, mooncake_rows, read_trace
from fleetgate.bench.traces import AZURE_CONV, MOONCAKE_CONV, open_trace
from fleetgate.bench.workloads import (
    Bursts,
    PoissonArrivals,
    RequestSpec,
    TraceTimes,
    bounded,
    schedule,
)
from fleetgate.routing.base import BYTES_PER_TOKEN
from fleetgate.settings import Settings

BLOCK_TOKENS = 512  # a prompt block, as Mooncake's trace counts them
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN
_FRESH = 1 << 40  # block ids made for prompts without any: above every trace's own
_COPY = 1 << 48  # a trace copy's block ids are its own: the copy's number times this added
_U64 = (1 << 64) - 1
MAX_USERS = 10_000
MAX_LENGTH_SCALE = 100.0
MAX_DURATION_S = 1e6  # ~11.6 days: the virtual clock's floats keep timers apart below that
MAX_REQUESTS = 100_000_000  # a run's, unless max_requests says how many


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a simulation."""

    at_s: float  # when its client sends it
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]  # its prompt's blocks of BLOCK_TOKENS, by id, in order
    client: int = 0  # its client region (an index into the scenario's)
    text: bytes = b""  # the prompt as routing sees it, when the workload wrote one
    tenant: int = -1  # its tenant, an index into the workload's `tenants` (-1: none, anonymous)


class WorkloadSettings(Settings, frozen=True):
    """A scenario's `workload:`."""

    name: WorkloadName = "mooncake-conv"
    file: str | None = None  # name "trace": the trace file replayed (Azure CSV or Mooncake)
    speed: float = 1.0  # a trace's times divided by this
    rate: float | None = None  # req/s of a Poisson process instead of a trace's times
    length_scale: float = 1.0  # prompt and answer lengths multiplied by this
    # A trace's traffic from this many populations of users at once: the trace replayed that
    # many times over, each copy's prompts its own (no block shared across copies) and its
    # times the trace's shifted by copy / users of the trace's span (wrapping around).
    users: int = 1
    duration_s: float = 3600.0  # requests sent after this are not
    max_requests: int | None = None
    clients: Mapping[str, float] = msgspec.field(default_factory=dict)  # region -> share
    # Who sends them, by share: tenants of the gateway config (each request with one of its
    # keys, as a client of it would). Empty: nobody in particular (anonymous).
    tenants: Mapping[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.name == "trace") != (self.file is not None):
            raise ValueError("workload: a trace file is replayed as name 'trace', and only then")
        for name, value in (("speed", self.speed), ("length_scale", self.length_scale),
                            ("duration_s", self.duration_s)):  # fmt: skip
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"workload.{name} must be a number > 0, not {value}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"workload.rate must be a number of req/s > 0, not {self.rate}")
        if self.length_scale > MAX_LENGTH_SCALE or self.duration_s > MAX_DURATION_S:
            raise ValueError(f"workload: length_scale at most {MAX_LENGTH_SCALE:g}, duration_s "
                             f"at most {MAX_DURATION_S:g}")  # fmt: skip
        rate = self.rate if self.rate is not None else 0.0
        if self.max_requests is None and rate * self.duration_s > MAX_REQUESTS:
            raise ValueError(f"workload: rate x duration_s asks for more than {MAX_REQUESTS:,} "
                             "requests: give max_requests to bound them")  # fmt: skip
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError("workload.max_requests must be at least 1")
        if not 1 <= self.users <= MAX_USERS:
            raise ValueError(f"workload.users must be in 1..{MAX_USERS}, got {self.users}")
        if self.users > 1 and self.name not in ("azure-conv", "mooncake-conv", "trace"):
            raise ValueError("workload.users replays a trace: give a rate for generated ones")
        for what, shares in (("clients", self.clients), ("tenants", self.tenants)):
            if any(not (share > 0 and math.isfinite(share)) for share in shares.values()):
                raise ValueError(f"workload.{what}: each share must be a number > 0")


def requests(
    settings: WorkloadSettings, regions: list[str], rng: random.Random
) -> Iterator[SimRequest]:
    """The simulation's requests in send order, lazily; `regions`: the client regions, in the
    order `SimRequest.client` indexes."""
    shares = [settings.clients.get(r, 0.0) for r in regions] if settings.clients else [1.0]
    clients = _clients(shares, rng)
    arrivals = _arrivals(settings)
    if settings.name in ("azure-conv", "mooncake-conv", "trace"):
        rows = _rows(settings) if settings.users == 1 else _copies(settings)
        timed = schedule(_from_rows(rows, settings.length_scale), arrivals, rng)
    else:
        timed = _from_specs(_generated(settings, rng), settings.length_scale)
    # Tenants are drawn apart, so that naming them changes nothing else of the workload.
    tenants = (
        _clients(list(settings.tenants.values()), random.Random(rng.random()))
        if settings.tenants
        else itertools.repeat(-1)
    )
    bound = bounded(timed, settings.duration_s, settings.max_requests)
    for request, client, tenant in zip(bound, clients, tenants, strict=False):
        if client or tenant >= 0:
            request = dataclasses.replace(request, client=client, tenant=tenant)
        yield request


def _arrivals(settings: WorkloadSettings) -> TraceTimes | PoissonArrivals | Bursts:
    if settings.rate is None:
        return TraceTimes(settings.speed)
    if settings.name == "code-completion":
        return Bursts(settings.rate)
    return PoissonArrivals(settings.rate)


def _rows(settings: WorkloadSettings) -> Iterator[TraceRow]:
    if settings.file is not None:
        yield from read_trace(Path(settings.file))
    elif settings.name == "mooncake-conv":
        with open_trace(MOONCAKE_CONV) as f:
            yield from mooncake_rows(f, MOONCAKE_CONV)
    else:
        with open_trace(AZURE_CONV) as f:
            yield from azure_rows(f, AZURE_CONV)


def _copies(settings: WorkloadSettings) -> Iterator[TraceRow]:
    """`settings.users` copies of the trace, merged by time (module docstring)."""
    rows = list(_rows(settings))  # a trace's rows are small: 12k for the Mooncake hour
    if not rows:
        return iter(())
    span = rows[-1].at_s + 1e-3
    times = [r.at_s for r in rows]
    n = settings.users
    pieces: list[Iterator[TraceRow]] = []
    for copy in range(n):
        shift = span * copy / n
        cut = bisect.bisect_left(times, span - shift)  # from here on, wrapped around
        pieces.append(_moved(rows, cut, len(rows), shift - span, copy * _COPY))
        pieces.append(_moved(rows, 0, cut, shift, copy * _COPY))
    return heapq.merge(*pieces, key=lambda r: r.at_s)


def _moved(rows: list[TraceRow], start: int, end: int, shift: float,
           offset: int) -> Iterator[TraceRow]:  # fmt: skip
    for r in itertools.islice(rows, start, end):
        blocks = tuple(h + offset for h in r.hash_ids) if offset else r.hash_ids
        yield TraceRow(r.at_s + shift, r.input_tokens, r.output_tokens, blocks)


def _from_rows(rows: Iterable[TraceRow], scale: float) -> Iterator[SimRequest]:
    fresh = itertools.count(_FRESH)
    for row in rows:
        prompt = max(1, round(row.input_tokens * scale))
        output = max(1, round(row.output_tokens * scale))
        need = -(-prompt // BLOCK_TOKENS)
        blocks = row.hash_ids[:need]
        if len(blocks) < need:
            blocks = (*blocks, *itertools.islice(fresh, need - len(blocks)))
        yield SimRequest(row.at_s, prompt, output, blocks)


def _generated(settings: WorkloadSettings, rng: random.Random) -> Iterator[RequestSpec]:
    config = BenchConfig(
        target="http://simulated", workload=settings.name,
        arrivals=None if settings.rate is None else _arrivals(settings),
        duration_s=settings.duration_s, max_requests=settings.max_requests,
    )  # fmt: skip
    return build_workload(config, rng)


def _from_specs(specs: Iterable[RequestSpec], scale: float) -> Iterator[SimRequest]:
    for spec in specs:
        messages = [{"role": m.role, "content": m.content} for m in spec.messages]
        text = b",".join(msgspec.json.encode(m) for m in messages)
        prompt = max(1, round(spec.prompt_tokens * scale))
        if scale != 1.0:  # the text grows or shrinks with it, its start kept
            text = (text * math.ceil(scale))[: prompt * BYTES_PER_TOKEN]
        output = max(1, round(spec.max_tokens * scale))
        yield SimRequest(spec.at_s, prompt, output, _hashed(text), text=text)


def _hashed(text: bytes) -> tuple[int, ...]:
    """The chained hashes of the text's blocks (the last one partial)."""
    blocks, h = [], 0
    for start in range(0, len(text), BLOCK_BYTES):
        h = xxh3_64_intdigest(text[start : start + BLOCK_BYTES], h)
        blocks.append(h)
    return tuple(blocks)


def _clients(shares: list[float], rng: random.Random) -> Iterator[int]:
    """Indexes into `shares`, drawn by them."""
    if len(shares) == 1:
        return itertools.repeat(0)
    indexes = range(len(shares))
    return (rng.choices(indexes, shares)[0] for _ in itertools.count())


def prompt_bytes(request: SimRequest) -> bytes:
    """The prompt as routing sees it: its text, or its blocks' bytes (4 a token): each block
    its id's 8 bytes, then zeros. Equal block prefixes are equal byte prefixes, and the chained
    hashes of prefix routing tell blocks apart by their first bytes."""
    if request.text:
        return request.text
    size = request.prompt_tokens * BYTES_PER_TOKEN
    blocks = request.blocks[: -(-size // BLOCK_BYTES)]
    prompt = bytearray(len(blocks) * BLOCK_BYTES)
    with memoryview(prompt) as view, view.cast("Q") as words:
        words[:: BLOCK_BYTES // 8] = array("Q", [block & _U64 for block in blocks])
    del prompt[size:]  # the last block cut to the prompt's end
    return bytes(prompt)
