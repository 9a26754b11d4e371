"""Fault injection for the sim worker: set from flags at start, changed live through
`POST /admin/faults` (the same fields as JSON), read back with `GET /admin/faults`."""

from __future__ import annotations

import argparse
import random

import msgspec


class Faults(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    error_rate: float = 0.0  # share of requests answered 500 at once, drawn per request
    error_status: int = 500  # the status those requests get (429/503 come with Retry-After)
    added_latency_s: float = 0.0  # extra wait before a request enters the engine
    # Extra wait before every request is handled, health checks and metrics included: the
    # network between the gateway and a worker in another region (a round trip's worth).
    network_delay_s: float = 0.0
    slowdown: float = 1.0  # every engine step takes this many times longer (thermal throttling)
    hang: bool = False  # accept requests and never answer them (health checks included)
    crash_after: int = 0  # after this many requests the worker stops listening; 0: never
    close_after_tokens: int = 0  # cut each stream's connection after N tokens; 0: never

    def check(self) -> Faults:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be in [0, 1]")
        if not 400 <= self.error_status <= 599:
            raise ValueError("error_status must be a 4xx or 5xx status")
        if self.added_latency_s < 0 or self.network_delay_s < 0 or self.slowdown <= 0:
            raise ValueError("added_latency_s and network_delay_s must be >= 0, slowdown > 0")
        if self.crash_after < 0 or self.close_after_tokens < 0:
            raise ValueError("crash_after and close_after_tokens must be >= 0")
        return self


class FaultState:
    """The live faults of one worker and what they need to decide: a request count, a Random."""

    def __init__(self, faults: Faults, rng: random.Random) -> None:
        self.faults = faults
        self.requests = 0
        self._rng = rng

    def admit(self) -> bool:
        """Count a request; True when it should get an injected error."""
        self.requests += 1
        rate = self.faults.error_rate
        return rate > 0 and self._rng.random() < rate

    @property
    def crashed(self) -> bool:
        """True once more than `crash_after` requests came: the first N are served."""
        limit = self.faults.crash_after
        return limit > 0 and self.requests > limit


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fault injection (also live: POST /admin/faults)")
    group.add_argument("--error-rate", type=float, default=0.0)
    group.add_argument("--error-status", type=int, default=500)
    group.add_argument("--added-latency", type=float, default=0.0, help="seconds")
    group.add_argument(
        "--network-delay", type=float, default=0.0, metavar="S",
        help="seconds before every request is handled, health checks included: a worker far "
        "away (another region)",
    )  # fmt: skip
    group.add_argument("--slowdown", type=float, default=1.0)
    group.add_argument("--hang", action="store_true")
    group.add_argument("--crash-after", type=int, default=0, metavar="N")
    group.add_argument("--close-after-tokens", type=int, default=0, metavar="N")


def faults_from_args(args: argparse.Namespace) -> Faults:
    return Faults(
        error_rate=args.error_rate,
        error_status=args.error_status,
        added_latency_s=args.added_latency,
        network_delay_s=args.network_delay,
        slowdown=args.slowdown,
        hang=args.hang,
        crash_after=args.crash_after,
        close_after_tokens=args.close_after_tokens,
    ).check()
