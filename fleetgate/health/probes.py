"""Who watches each backend from outside: its pool's active health checks (health/active.py)
and engine-metrics scrapes (fleet/scraper.py), for the backends configured at start and for
those that join later (fleet/membership.py), stopped for those that leave; started again on
a reloaded config's settings (fleetgate/reload.py)."""

from __future__ import annotations

from fleetgate.fleet.backend import BackendState
from fleetgate.fleet.health import HealthFlag
from fleetgate.fleet.pool import Pool
from fleetgate.fleet.scraper import MetricsScraper, ScrapeSettings
from fleetgate.health.active import ActiveChecker, ActiveCheckSettings


class BackendProbes:
    """Probes and scrapes with `checker` and `scraper` (None: not at all, as in a benchmark),
    on each pool's settings."""

    def __init__(self, checker: ActiveChecker | None, scraper: MetricsScraper | None) -> None:
        self._checker = checker
        self._scraper = scraper
        self._settings: dict[Pool, tuple[ActiveCheckSettings, ScrapeSettings]] = {}

    def start(
        self, pool: Pool, health_check: ActiveCheckSettings, engine_metrics: ScrapeSettings
    ) -> None:
        """Watch every backend of `pool` on these settings, and those that join it later."""
        self._settings[pool] = (health_check, engine_metrics)
        for state in pool.states:
            self.watch(pool, state)

    def restart(
        self, pool: Pool, health_check: ActiveCheckSettings, engine_metrics: ScrapeSettings
    ) -> None:
        """`pool`'s settings after a reload: its backends are watched on them from now on
        (started again only when they changed; what the probes set on a backend stays)."""
        if self._settings.get(pool) == (health_check, engine_metrics):
            return
        self.stop(pool)
        self.start(pool, health_check, engine_metrics)

    def stop(self, pool: Pool) -> None:
        """Stop watching the backends of `pool` (no longer configured)."""
        self._settings.pop(pool, None)
        for state in pool.states:
            self.forget(state)

    def watching(self, pool: Pool) -> bool:
        """Whether `pool`'s backends are watched (it was started, and not stopped)."""
        return pool in self._settings

    def probes(self, pool: Pool) -> bool:
        """Whether a backend that joins `pool` is probed (so may wait for a good probe)."""
        return self._checker is not None and self._settings[pool][0].enabled

    def watch(self, pool: Pool, state: BackendState) -> None:
        """Watch `state`, a member of `pool` (started), until `forget` or the end: one that
        waits for its first good probe (UNPROBED) is probed at once."""
        health_check, engine_metrics = self._settings[pool]
        if self._checker is not None:
            at_once = bool(state.flags & HealthFlag.UNPROBED)
            # update, not refresh: a backend let in starts its slow start at its floor share
            self._checker.start(pool.model, [state], health_check, pool.update, at_once=at_once)
        if self._scraper is not None:
            self._scraper.start([state], engine_metrics, pool.board)

    def forget(self, state: BackendState) -> None:
        """Stop watching `state` (it left its pool)."""
        if self._checker is not None:
            self._checker.forget(state)
        if self._scraper is not None:
            self._scraper.forget(state)
