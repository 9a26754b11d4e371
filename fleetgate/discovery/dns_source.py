"""The backends a DNS name resolves to: A and AAAA records (every address at the configured
port), or SRV records (each target's addresses at its own port; only the lowest priority's,
the others being RFC 2782's fallbacks). Resolved again at `interval_s` at the latest, and
sooner when the answer's TTL ends (at most once a second), through dnspython.

A name that does not exist (NXDOMAIN), a server that does not answer, or a name with no
address is a SourceError, and the last good set stays (a DNS outage or a mistake in a zone
must not empty a pool): to empty a pool, remove the source.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Sequence

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.settings import DnsDiscovery, nameserver_address

CHECK_S = 1.0  # how often it looks whether the answer is due again
TIMEOUT_S = 2.0  # one resolution, every server and retry included


class DnsSource:
    """The addresses of `config.name`, as backends of `config.model`."""

    def __init__(self, config: DnsDiscovery, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._resolver = dns.asyncresolver.Resolver(configure=config.nameserver is None)
        if config.nameserver is not None:
            host, port = nameserver_address(config.nameserver)
            self._resolver.nameservers = [host]
            self._resolver.port = port
        self._resolver.lifetime = TIMEOUT_S
        self._resolver.cache = None  # the TTLs are followed here
        self._found: list[Found] | None = None
        self._due = -math.inf

    @property
    def name(self) -> str:
        return f"dns:{self._config.name}"

    @property
    def interval_s(self) -> float:
        return min(CHECK_S, self._config.interval_s)

    async def read(self) -> Sequence[Found]:
        now = self._clock()
        if self._found is not None and now < self._due:
            return self._found
        try:
            if self._config.record == "srv":
                targets, ttl = await self._srv()
            else:
                targets, ttl = await self._addresses(self._config.name, self._config.port)
        except dns.exception.DNSException as exc:
            raise SourceError(f"{self.name}: {exc}") from None
        if not targets:
            raise SourceError(f"{self.name}: no address in the answer")
        c = self._config
        self._found = [
            Found(model=c.model, url=f"{c.scheme}://{_host(ip)}:{port}", labels=c.labels)
            for ip, port in sorted(set(targets))
        ]
        self._due = now + min(c.interval_s, max(CHECK_S, ttl))
        return self._found

    async def _addresses(self, name: str, port: int) -> tuple[list[tuple[str, int]], float]:
        """Every A and AAAA address of `name` at `port`, and the least TTL of the two."""
        found: list[tuple[str, int]] = []
        ttl = math.inf
        missing = 0
        for kind in (dns.rdatatype.A, dns.rdatatype.AAAA):
            try:
                answer = await self._resolver.resolve(name, kind)
            except dns.resolver.NoAnswer:  # the name exists, without this kind of record
                missing += 1
                continue
            assert answer.rrset is not None  # resolve() raises NoAnswer otherwise
            ttl = min(ttl, answer.rrset.ttl)
            found += [(r.address, port) for r in answer]
        if missing == 2:
            raise SourceError(f"{self.name}: {name} has no A or AAAA record")
        return found, ttl

    async def _srv(self) -> tuple[list[tuple[str, int]], float]:
        answer = await self._resolver.resolve(self._config.name, dns.rdatatype.SRV)
        assert answer.rrset is not None
        ttl: float = answer.rrset.ttl
        records = list(answer)
        first = min(r.priority for r in records)
        found: list[tuple[str, int]] = []
        for record in records:
            if record.priority == first:
                addresses, more = await self._addresses(record.target.to_text(), record.port)
                found += addresses
                ttl = min(ttl, more)
        return found, ttl

    async def close(self) -> None:
        pass  # a resolver holds no connection between queries


def _host(ip: str) -> str:
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
