"""How each engine's KV-event feed is doing, as the metrics read it (apart from feeds.py, so
that reading it does not load ZMQ)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FeedStatus:
    """One backend's feed, as the metrics show it."""

    pool: str
    backend: str
    batches: int = 0  # applied, replayed ones included
    undecodable: int = 0
    replayed: int = 0  # gaps filled from the replay socket
    lost: int = 0  # gaps that could not be filled: the backend's blocks were forgotten
    restarts: int = 0  # another engine process: the backend's blocks were forgotten
    lag_s: float = 0.0  # the last batch: its arrival here less its engine's timestamp
    blocks: int = 0  # blocks the index holds for it (read when scraped)
