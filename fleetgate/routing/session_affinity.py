"""`session_affinity` scorer: keeps a conversation on the backend that holds its KV cache.

A session's home is where its last request went, while that backend can take it: the pool's
session table (a SessionTable, routing/stores.py; in this process routing/session_table.py)
remembers it by backend id, from every pick (`chosen`). A session it does not know, or whose
remembered backend is gone or full, is placed by consistent hashing with bounded loads
(Mirrokni, Thorup and Zadimoghaddam, 2018): every backend owns `vnodes` points on a 64-bit
ring, at xxh3_64("<backend id>#<k>"); the request's session key (the x-session-id header, else
the body's `user`) hashes to a point, and its home is the first backend clockwise from there
that is a candidate. Either way the home carries fewer than
    bound = ceil((1 + epsilon) * (L + 1) / n)
requests in flight (the pool's load board), L being the in-flight total over the n candidates
scored. So no backend takes more than (1 + epsilon) times the average; when a backend leaves,
only the sessions it was home to move (to the next point clockwise), and when one joins, no
session known to the table moves to it.
    score_i = 1 for the home, 0 for the others;   every score is 0 without a session key.
With a shortlist (routing/pipeline.py) L / n is the shortlist's mean, an unbiased estimate of
the pool's; the pipeline puts the whole candidate set on the ring (`roster`), and the
remembered home is the first backend nominated. A pick costs O(n) over the candidates scored,
plus O(log(n * vnodes)) to find the point and the steps walked past full or absent backends.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from xxhash import xxh3_64_intdigest

from fleetgate.fleet.backend import BackendState
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.load import CandidateLoads
from fleetgate.routing.session_table import MemorySessionTable
from fleetgate.routing.stores import SessionTable
from fleetgate.settings import Settings, at_least, positive


class SessionAffinityParams(Settings, frozen=True):
    """The `session_affinity` scorer's parameters."""

    epsilon: float = 0.25  # no home takes over (1 + epsilon) x the average in flight
    vnodes: int = 64  # points each backend owns on the ring
    max_nominees: int = 3  # backends clockwise from a session's point put into the shortlist

    def __post_init__(self) -> None:
        positive("epsilon", self.epsilon)
        at_least("vnodes", self.vnodes, 1)


class SessionAffinity:
    name = "session_affinity"

    def __init__(
        self,
        loads: CandidateLoads,
        params: SessionAffinityParams = SessionAffinityParams(),
        *,
        sessions: SessionTable | None = None,
    ) -> None:
        """`sessions`: the pool's session table (routing/registry.py gives the PluginContext's);
        None: one of its own in this process."""
        self._loads = loads
        self._sessions = MemorySessionTable() if sessions is None else sessions
        self._epsilon = params.epsilon
        self._vnodes = params.vnodes
        self._max_nominees = params.max_nominees
        self._points: list[int] = []  # sorted ring positions
        self._owners: list[BackendState] = []  # the backend at each position
        self._known: set[BackendState] = set()

    def _join(self, states: Sequence[BackendState]) -> None:
        """Put backends on the ring (once each, in one sort)."""
        ring = list(zip(self._points, self._owners, strict=True))
        for state in states:
            self._known.add(state)
            for k in range(self._vnodes):
                ring.append((xxh3_64_intdigest(f"{state.backend.id}#{k}".encode()), state))
        ring.sort(key=lambda point: point[0])
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]

    def _clockwise(self, key: str) -> Iterator[BackendState]:
        """Distinct backends in ring order from the key's point."""
        points, owners = self._points, self._owners
        start = bisect_left(points, xxh3_64_intdigest(key.encode()))
        seen: set[BackendState] = set()
        for i in range(len(points)):
            owner = owners[(start + i) % len(points)]
            if owner not in seen:
                seen.add(owner)
                yield owner

    def roster(self, candidates: Sequence[BackendState]) -> None:
        """Put every candidate on the ring, so a session's home does not move as backends
        first turn up in shortlists."""
        new = [s for s in candidates if s not in self._known]
        if new:
            self._join(new)

    def home(self, key: str, candidates: Sequence[BackendState]) -> BackendState | None:
        """Where the session `key` goes among `candidates` (None: all of them are full)."""
        self.roster(candidates)
        loaded = self._loads.of(candidates)
        in_flight = {s: load.in_flight for s, load in loaded}
        bound = math.ceil((1 + self._epsilon) * (sum(in_flight.values()) + 1) / len(candidates))
        last = self._sessions.home(key)
        if last is not None:
            for state, load in loaded:
                if state.backend.id == last:
                    if load.in_flight < bound:
                        return state
                    break
        for state in self._clockwise(key):
            if in_flight.get(state, bound) < bound:
                return state
        return None

    def score(
        self, request: RoutingRequest, candidates: Sequence[BackendState], now: float
    ) -> list[float]:
        key = request.session_key
        if key is None:
            return [0.0] * len(candidates)
        home = self.home(key, candidates)
        return [1.0 if state is home else 0.0 for state in candidates]

    def nominate(self, request: RoutingRequest, now: float) -> list[str]:
        """The session's last backend, then the first few clockwise from its point, by id:
        its home is among them unless they are all full or unhealthy."""
        key = request.session_key
        if key is None or not self._points:
            return []
        last = self._sessions.home(key)
        found = [] if last is None else [last]
        for state in self._clockwise(key):
            if len(found) >= self._max_nominees:
                break
            if state.backend.id != last:
                found.append(state.backend.id)
        return found

    def chosen(self, request: RoutingRequest, state: BackendState, now: float) -> None:
        """Where the session's request went, whoever chose it: its KV cache is there now."""
        key = request.session_key
        if key is not None:
            self._sessions.record(key, state.backend.id)
