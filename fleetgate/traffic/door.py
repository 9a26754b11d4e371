"""The front door: who is calling, what they may use, and whether they may go now.

    identify   the API key -> the caller's tenant             401 without a valid key
    allow      the model the request names                    403 if the tenant may not use it
    refused    a limit's refusal (traffic/limits.py)          429 with Retry-After

The entrance (director/entrance.py) reserves and settles the request's limits with `limits`
itself: one call each way on the request path.

With auth off every request is the anonymous tenant's, which has no limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgate.traffic.keys import KeyRing, bearer
from fleetgate.traffic.limits import Limits, OverLimit
from fleetgate.traffic.priority import Priority
from fleetgate.traffic.tenants import ANONYMOUS, Tenant


class Refused(Exception):
    """The request is turned away before routing; becomes an OpenAI-shaped 4xx or 503 with
    `headers` (Retry-After, x-ratelimit-*). `code` is the error's code, None for none."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        headers: list[tuple[bytes, bytes]] | None = None,
        param: str | None = None,
        priority: Priority | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or []
        self.param = param
        self.priority = priority  # the class it would have had, when known


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose request it is: the tenant and which of its keys (an id, never the key)."""

    tenant: Tenant
    key_id: str


ANONYMOUS_CALLER = Caller(ANONYMOUS, "")


def retry_after(seconds: float) -> tuple[bytes, bytes]:
    """The Retry-After header for a wait: whole seconds, at least 1."""
    return (b"retry-after", b"%d" % max(1, math.ceil(min(seconds, 86400.0))))


class FrontDoor:
    """Keys, model permissions and limits, for the gateway's edge (gateway/app.py)."""

    _KNOWN_MAX = 4096  # `Authorization` values remembered (valid ones only)

    def __init__(self, keys: KeyRing[Caller] | None, limits: Limits) -> None:
        self._keys = keys  # None: auth is off
        self._limits = limits
        # `Authorization` values already checked, and whose they are: a client sends the
        # same one with every request, and hashing it again costs more than the rest of its
        # check. Only valid values are kept (no client can fill it with its guesses), and a
        # lookup's time depends on the value's SipHash under this process's secret seed,
        # never on any stored key (as with the digests: keys.py).
        self._known: dict[bytes, Caller] = {}

    @property
    def auth(self) -> bool:
        return self._keys is not None

    def callers(self) -> frozenset[tuple[str, str]] | None:
        """(tenant, key id) of every key configured; None with auth off."""
        if self._keys is None:
            return None
        return frozenset((c.tenant.name, c.key_id) for c in self._keys.owners())

    def caller_of(self, tenant: str) -> Caller | None:
        """A caller of `tenant` as its first key identifies it (None: auth off, or no key of
        that tenant): the simulator's clients hold no raw keys, only hashed ones may be
        configured."""
        if self._keys is None:
            return None
        return next((c for c in self._keys.owners() if c.tenant.name == tenant), None)

    def identify(self, headers: dict[bytes, bytes]) -> Caller:
        if self._keys is None:
            return ANONYMOUS_CALLER
        presented = headers.get(b"authorization")
        if presented is not None:
            known = self._known.get(presented)
            if known is not None:
                return known
        key = bearer(headers)
        caller = self._keys.owner(key)
        if caller is not None and presented is not None:
            if len(self._known) >= self._KNOWN_MAX:
                self._known.clear()
            self._known[presented] = caller
        if caller is None:
            if key is None:
                message = "No API key: send `Authorization: Bearer YOUR_KEY`."
            else:
                message = "The API key is not valid here; check it, or ask for a new one."
            raise Refused(401, message, "invalid_api_key")
        return caller

    def allow(self, caller: Caller, model: str) -> None:
        if not caller.tenant.may_use(model):
            raise Refused(
                403, f"This API key may not use the model {model!r}.", "model_not_allowed",
                param="model",
            )  # fmt: skip

    @property
    def limits(self) -> Limits:
        return self._limits


def refused(over: OverLimit, priority: Priority) -> Refused:
    """Being over a limit, as the 429 the client gets."""
    headers = [retry_after(over.retry_after_s), *over.headers]
    return Refused(429, over.message, over.code, headers, priority=priority)
