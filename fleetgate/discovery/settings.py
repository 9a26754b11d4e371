"""The config's `discovery:` list: each entry a source, named by its `type`."""

from __future__ import annotations

import ipaddress
from typing import Literal

from fleetgate.settings import Settings, positive_seconds


class FileDiscovery(Settings, frozen=True, tag="file", tag_field="type"):
    """A file of backends (discovery/file_source.py), read again when it changes."""

    path: str
    interval_s: float = 1.0  # how often the file is checked for a change

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("`path` is empty: give the file of backends")
        positive_seconds("interval_s", self.interval_s)


class RedisDiscovery(Settings, frozen=True, tag="redis", tag_field="type"):
    """The workers registered in a Redis (discovery/registry.py), read on an interval."""

    url: str  # redis://[:password@]host[:port][/db]
    key_prefix: str = "fleetgate"  # as the workers register under (`--register-prefix`)
    interval_s: float = 0.5  # how often the registry is read

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        if not self.key_prefix or not self.key_prefix.isprintable():
            raise ValueError("`key_prefix` must be printable text")


class DnsDiscovery(Settings, frozen=True, tag="dns", tag_field="type"):
    """The addresses a DNS name resolves to (discovery/dns_source.py): A and AAAA records at
    `port`, or SRV records (their own targets and ports)."""

    name: str  # e.g. vllm.default.svc.cluster.local, or _http._tcp.vllm.example (srv)
    model: str  # the pool the addresses serve
    record: Literal["a", "srv"] = "a"  # a: A and AAAA records, at `port`
    port: int = 8000  # record a: the port the engines listen on
    scheme: Literal["http", "https"] = "http"
    interval_s: float = 30.0  # resolved again at least this often, and when the answer's TTL ends
    nameserver: str | None = None  # HOST[:PORT]; None: the system's (/etc/resolv.conf)
    labels: dict[str, str] = {}  # given to every backend found

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        if not self.name or not self.name.isprintable() or " " in self.name:
            raise ValueError("`name` must be a DNS name")
        if not self.model or not self.model.isprintable():
            raise ValueError("`model` must be printable text")
        if not 0 < self.port < 65536:
            raise ValueError(f"`port` must be in 1-65535, got {self.port}")
        if self.nameserver is not None:
            nameserver_address(self.nameserver)


def nameserver_address(text: str) -> tuple[str, int]:
    """(IP, port) of `IP`, `IP:PORT` or `[IPv6]:PORT` (port 53 unless given); ValueError."""
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = int(rest.removeprefix(":")) if rest.startswith(":") else -1
    elif text.count(":") == 1:
        host, _, number = text.partition(":")
        port = int(number) if number.isdigit() else -1
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"`nameserver` must be IP[:PORT], got {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"`nameserver`: the port must be in 1-65535, got {text!r}")
    return host, port


class KubernetesDiscovery(Settings, frozen=True, tag="kubernetes", tag_field="type"):
    """The endpoints of a Service's EndpointSlices, or the pods a label selector picks
    (discovery/kubernetes_source.py; the `kubernetes` extra: pip install fleetgate[kubernetes])."""

    model: str  # the pool they serve
    service: str | None = None  # a Service's name: its EndpointSlices' endpoints
    selector: str | None = None  # or pods by labels, `key=value[,key=value]`
    namespace: str | None = None  # None: the gateway's own in a cluster, else `default`
    port: int | None = None  # pods: required; a Service: the slices' port named `port_name`,
    port_name: str | None = None  # ... or their first, unless `port` is given
    scheme: Literal["http", "https"] = "http"
    labels: dict[str, str] = {}  # given to every backend found
    api_server: str | None = None  # the API server's URL; None: in-cluster, else ~/.kube/config
    interval_s: float = 1.0  # how often what the watch has seen is applied

    def __post_init__(self) -> None:
        positive_seconds("interval_s", self.interval_s)
        if not self.model or not self.model.isprintable():
            raise ValueError("`model` must be printable text")
        if (self.service is None) == (self.selector is None):
            raise ValueError("give exactly one of `service` or `selector`")
        if self.selector is not None:
            pairs = [p.split("=") for p in self.selector.split(",")]
            if any(len(p) != 2 or not p[0].strip() for p in pairs):
                raise ValueError("`selector` must be key=value[,key=value...]")
            if self.port is None:
                raise ValueError("`port`: give the port the pods' engines listen on")
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"`port` must be in 1-65535, got {self.port}")


SourceConfig = FileDiscovery | RedisDiscovery | DnsDiscovery | KubernetesDiscovery
"""Any source's config, told apart by its `type`."""
