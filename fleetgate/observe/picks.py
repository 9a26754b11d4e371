"""Each backend's last pick: when routing last chose it, for which kind of attempt, and each
scorer's score of it then (the Routed event's, by plugin name), for GET /admin/backends: why
traffic goes where it goes. Kept only with `server.admin` on, since hearing Routed makes every
pick note its scores."""

from __future__ import annotations

from fleetgate.fleet.backend import BackendState
from fleetgate.lifecycle.events import Routed
from fleetgate.lifecycle.hooks import Hooks


class LastPicks:
    """The last Routed event of each backend picked (one per backend ever picked, those
    removed since included: a few hundred bytes each)."""

    def __init__(self) -> None:
        self._last: dict[BackendState, Routed] = {}

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Routed, self.on_routed)

    def on_routed(self, event: Routed) -> None:
        if event.backend is not None:
            self._last[event.backend] = event

    def of(self, state: BackendState) -> Routed | None:
        """`state`'s last pick (None: never picked)."""
        return self._last.get(state)
