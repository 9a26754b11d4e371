"""Makes each pool's members follow what the discovery sources say (discovery/found.py).

Each source's last good set is kept; the backends wanted are their union (a backend two
sources name is the first's). Against what discovery added before:
    new        joins its pool (fleet/membership.py, `probe_first`): nothing is routed to it
               until a health probe has passed, then it ramps up over the pool's slow start
    gone       is retired: drained of its requests in flight, then it leaves
    not ready  is drained (takes nothing new) until ready again
    weight     a changed one is applied; a change of labels, engine or limit is not (it
               leaves and joins again only when its URL changes)
A source that fails (SourceError) changes nothing: its last good set stays, with a warning
when it starts failing and a line when it is back, and its metrics say so
(fleetgate_discovery_source_up). Backends configured in the file are not discovery's: one a
source names too is left as configured. A backend of a model no pool serves is skipped and
logged once. Discovery never removes a backend it did not add.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.discovery.found import Found, Source, SourceError
from fleetgate.fleet.backend import BackendState, backend_id
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.membership import AlreadyMember, Joining, Membership, NotMember

log = logging.getLogger("fleetgate.discovery")

Key = tuple[str, str]  # (model, backend id)


@dataclass(slots=True)
class SourceStatus:
    """One source, for the metrics."""

    name: str
    up: bool = False  # its last read succeeded
    backends: int = 0  # in its last good set
    failures: int = 0  # reads that failed, since start


class Discovery:
    """Reconciles `members` with `sources` (each read by `poll`, on its interval)."""

    def __init__(self, members: Membership, sources: Sequence[Source]) -> None:
        """ValueError when two sources have one name (each would replace the other's set)."""
        names = [s.name for s in sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two discovery sources read the same thing: {', '.join(twice)}")
        self._members = members
        self.sources = tuple(sources)
        self._status = {s.name: SourceStatus(s.name) for s in self.sources}
        self._sets: dict[str, dict[Key, Found]] = {}  # each source's last good set
        # What discovery added, as last applied, with the member it made: only that member is
        # discovery's (one the operator removed, or removed and added again, is not).
        self._joined: dict[Key, tuple[Found, BackendState]] = {}
        self._skipped: set[Key] = set()  # logged once: configured already, or no such pool

    def statuses(self) -> list[SourceStatus]:
        return list(self._status.values())

    async def poll(self, source: Source) -> None:
        """Read `source` once and apply what it says."""
        status = self._status[source.name]
        try:
            found = await source.read()
        except Exception as exc:
            status.failures += 1
            if status.up or status.failures == 1:
                why = exc if isinstance(exc, SourceError) else repr(exc)
                log.warning("discovery: %s failed, its last good set kept: %s", source.name, why)
            status.up = False
            return
        if not status.up and status.failures:
            log.warning("discovery: %s read again", source.name)
        status.up = True
        self.update(source.name, found)

    def update(self, source: str, found: Sequence[Found]) -> None:
        """`found` is all `source` knows now: apply it."""
        now_set = {(f.model, backend_id(f.url)): f for f in found}
        self._sets[source] = now_set
        self._status[source].backends = len(now_set)
        self._reconcile()

    def _reconcile(self) -> None:
        wanted: dict[Key, Found] = {}
        for name in self._status:  # in the sources' order: the first to name one wins
            for key, found in self._sets.get(name, {}).items():
                wanted.setdefault(key, found)
        for key, (_, state) in list(self._joined.items()):
            if not self._ours(key, state):  # removed by the operator: found anew below
                del self._joined[key]
        for key in [k for k in self._joined if k not in wanted]:
            del self._joined[key]
            model, backend = key
            self._members.remove(backend, model)
            log.info("discovery: %s leaves %s", backend, model)
        for key, found in wanted.items():
            joined = self._joined.get(key)
            if joined is None:
                self._join(key, found)
            else:
                self._follow(key, joined[0], found)

    def _ours(self, key: Key, state: BackendState) -> bool:
        """Whether `state` is still the member discovery added, not retired since."""
        return self._members.member(*key) is state and not state.flags & HealthFlag.GONE

    def _join(self, key: Key, found: Found) -> None:
        model, backend = key
        joining = Joining(
            url=found.url, weight=found.weight, labels=found.labels,
            max_in_flight=found.max_in_flight, engine=found.engine,
        )  # fmt: skip
        try:
            state = self._members.add(model, joining, probe_first=True)
        except AlreadyMember as exc:
            if not exc.leaving and key not in self._skipped:  # leaving: tried again next time
                self._skipped.add(key)
                log.info("discovery: %s is configured for %s already; left as it is", backend,
                         model)  # fmt: skip
            return
        except NotMember as exc:
            if key not in self._skipped:
                self._skipped.add(key)
                log.warning("discovery: %s skipped: %s", backend, exc)
            return
        self._joined[key] = found, state
        log.info("discovery: %s joins %s", backend, model)
        if not found.ready:
            self._members.drain(backend, True, model)

    def _follow(self, key: Key, before: Found, found: Found) -> None:
        model, backend = key
        self._joined[key] = found, self._joined[key][1]
        if found.ready != before.ready:
            self._members.drain(backend, not found.ready, model)
        if found.weight != before.weight:
            self._members.set_weight(backend, found.weight, model)
