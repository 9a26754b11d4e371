"""Which backend holds each stored response: a Responses API follow-up (`previous_response_id`)
must reach the replica that made the response it continues, since an engine keeps the
responses it made in its own memory (vLLM, llama.cpp's server) and any other answers 404.

The gateway notes each response's id and the backend that answered it (from the answer, or a
stream's `response.created` event), and pins a follow-up to that backend while it can take it
(routing/router.py); a backend that has left or is unhealthy leaves the follow-up to ordinary
routing, and the engine's own 404 to tell the client. At most `capacity` ids are kept, the
oldest forgotten first.

`StoredResponses` keeps them in this process's memory: the `ResponsePins` protocol's in-process
implementation (routing/stores.py), one per gateway (serve.py gives it to the Director); a
shared one lets a follow-up sent to another gateway reach the same backend.

A response is its tenant's: another tenant naming its id is told there is no such response
(an engine keeps no owner, and would continue anyone's conversation).
"""

from __future__ import annotations

from collections import OrderedDict


class StoredResponses:
    __slots__ = ("_capacity", "_where")

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        # response id -> (backend id, tenant)
        self._where: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def record(self, response_id: str, backend_id: str, tenant: str) -> None:
        where = self._where
        where[response_id] = (backend_id, tenant)
        where.move_to_end(response_id)
        if len(where) > self._capacity:
            where.popitem(last=False)

    def where(self, response_id: str) -> tuple[str, str] | None:
        """The backend that holds `response_id` and whose it is, if this gateway saw it made."""
        return self._where.get(response_id)

    def __len__(self) -> int:
        return len(self._where)
