"""Each backend's last pick: when routing last chose it, for which kind of attempt, and each
scorer's score of it then (the Routed event's, by plugin name), for GET /admin/backends: why
traffic goes where it goes. Kept only with `server.admin` on, since hearing Routed makes every
pick note its scores."""

from __future__ import annotations

from fleetgate.lifecycle.events import Routed
from fleetgate.lifecycle.hooks import Hooks


class LastPicks:
    """The last Routed event of each backend picked, by pool and backend id (one per backend
    ever picked, those removed since included: a few hundred bytes each)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], Routed] = {}

    def subscribe(self, hooks: Hooks) -> None:
        hooks.subscribe(Routed, self.on_routed)

    def on_routed(self, event: Routed) -> None:
        if event.backend is not None:
            self._last[event.model, event.backend] = event

    def of(self, model: str, backend_id: str) -> Routed | None:
        """The last pick of that backend in the pool of `model` (None: never picked)."""
        return self._last.get((model, backend_id))
