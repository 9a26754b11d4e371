"""The DNS source against a small DNS server the test runs on 127.0.0.1 (dnspython builds its
answers): A/AAAA and SRV records become backends, a short TTL is followed, and a name that
vanishes or a server that stops answering is an error (the last good set is kept)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import cast

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from fleetgate.discovery.dns_source import DnsSource
from fleetgate.discovery.found import Found, SourceError
from fleetgate.discovery.settings import DnsDiscovery

Zone = dict[tuple[str, str], tuple[int, list[str]]]  # (name, type) -> (ttl, rdata texts)


class Server(asyncio.DatagramProtocol):
    """Answers from `zone`; NXDOMAIN for a name it has nothing of; silent when `mute`."""

    def __init__(self) -> None:
        self.zone: Zone = {}
        self.mute = False
        self.queries = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is not a subclass

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.mute or self.transport is None:
            return
        self.queries += 1
        query = dns.message.from_wire(data)
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text()
        kind = dns.rdatatype.to_text(question.rdtype)
        if (name, kind) in self.zone:
            ttl, texts = self.zone[name, kind]
            response.answer.append(dns.rrset.from_text_list(name, ttl, "IN", kind, texts))
        elif not any(n == name for n, _ in self.zone):
            response.set_rcode(dns.rcode.NXDOMAIN)
        self.transport.sendto(response.to_wire(), addr)


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, str]]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Server, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    yield protocol, f"127.0.0.1:{port}"
    transport.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def source(nameserver: str, clock: Clock, **config: object) -> DnsSource:
    settings = DnsDiscovery(name="vllm.test.", model="m", nameserver=nameserver,
                            interval_s=30.0, labels={"via": "dns"}, **config)  # type: ignore[arg-type]  # fmt: skip
    return DnsSource(settings, clock)


async def test_a_and_aaaa_records_become_backends_and_a_short_ttl_is_followed(
    server: tuple[Server, str],
) -> None:
    dns_server, address = server
    dns_server.zone = {("vllm.test.", "A"): (5, ["10.0.0.2", "10.0.0.1"]),
                       ("vllm.test.", "AAAA"): (60, ["fd00::1"])}  # fmt: skip
    clock = Clock()
    vllm = source(address, clock, port=8000)
    assert vllm.name == "dns:vllm.test."
    found = await vllm.read()
    assert [f.url for f in found] == [
        "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::1]:8000"
    ]  # fmt: skip
    assert found[0] == Found(model="m", url="http://10.0.0.1:8000", labels={"via": "dns"})
    asked = dns_server.queries
    clock.now = 4.0
    assert await vllm.read() is found and dns_server.queries == asked  # within the TTL
    dns_server.zone["vllm.test.", "A"] = (5, ["10.0.0.3"])
    clock.now = 5.0  # the A records' TTL has ended (not the 30 s interval)
    assert [f.url for f in await vllm.read()] == ["http://10.0.0.3:8000", "http://[fd00::1]:8000"]


async def test_srv_records_give_their_targets_ports_of_the_first_priority(
    server: tuple[Server, str],
) -> None:
    dns_server, address = server
    dns_server.zone = {
        ("vllm.test.", "SRV"): (30, ["0 5 8001 a.test.", "0 5 8002 b.test.", "1 5 9000 c.test."]),
        ("a.test.", "A"): (30, ["10.0.1.1"]), ("b.test.", "A"): (30, ["10.0.1.2"]),
        ("c.test.", "A"): (30, ["10.0.1.3"]),
    }  # fmt: skip
    found = await source(address, Clock(), record="srv").read()
    assert [f.url for f in found] == ["http://10.0.1.1:8001", "http://10.0.1.2:8002"]


async def test_a_vanished_name_or_a_silent_server_is_an_error_not_an_empty_pool(
    server: tuple[Server, str],
) -> None:
    dns_server, address = server
    clock = Clock()
    vllm = source(address, clock)
    with pytest.raises(
        SourceError, match=re.escape("dns:vllm.test.: The DNS query name does not exist")
    ):
        await vllm.read()
    dns_server.zone = {("vllm.test.", "TXT"): (30, ['"x"'])}  # the name, with no address
    with pytest.raises(SourceError, match="has no A or AAAA record"):
        await vllm.read()
    dns_server.mute = True
    with pytest.raises(SourceError, match=re.escape("dns:vllm.test.: ")):
        await vllm.read()


@pytest.mark.parametrize(
    ("config", "says"),
    [({"nameserver": "dns.example:53"}, "`nameserver` must be IP[:PORT]"),
     ({"nameserver": "127.0.0.1:0"}, "the port must be in 1-65535"),
     ({"port": 0}, "`port` must be in 1-65535"), ({"name": "a b"}, "`name` must be a DNS name")],
)  # fmt: skip
def test_a_source_it_cannot_use_is_refused(config: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        DnsDiscovery(**{"name": "x.test", "model": "m", **config})  # type: ignore[arg-type]
