"""TLS termination: the gateway serves HTTPS from a certificate and key in config, and picks
up renewed files without a restart (open connections keep theirs, new ones get the new)."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleetgate.config import ConfigError, parse_config
from fleetgate.http.tls import TlsFiles
from fleetgate.running import RunningGateway, start_gateway


def write_pair(directory: Path, common_name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 named `common_name`, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )  # fmt: skip
    return cert_path, key_path


async def served_name(port: int) -> str:
    """The common name of the certificate a new connection to `port` is shown."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    cert = x509.load_der_x509_certificate(der)
    (attribute,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attribute.value)


@pytest.fixture
async def tls_gateway(tmp_path: Path) -> AsyncIterator[tuple[RunningGateway, Path]]:
    cert, key = write_pair(tmp_path, "first")
    config = parse_config({
        "server": {"port": 0, "tls_cert_file": str(cert), "tls_key_file": str(key),
                   "tls_reload_s": 0.05},
        "pools": [{"model": "m", "backends": [{"url": "http://127.0.0.1:9"}],
                   "health_check": {"enabled": False}, "engine_metrics": {"enabled": False}}],
    })  # fmt: skip
    running = await start_gateway(config)
    yield running, tmp_path
    await running.close()


async def test_https_is_served_and_a_renewed_certificate_is_picked_up(
    tls_gateway: tuple[RunningGateway, Path],
) -> None:
    running, directory = tls_gateway
    assert running.tls
    assert await served_name(running.port) == "first"
    write_pair(directory, "second")
    for _ in range(200):  # reloads every 50 ms; give it up to 2 s
        if await served_name(running.port) == "second":
            break
        await asyncio.sleep(0.01)
    assert await served_name(running.port) == "second"


def test_a_broken_renewal_keeps_the_certificate_that_works(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "good")
    files = TlsFiles(cert, key)
    key.write_text("-----BEGIN PRIVATE KEY-----\nhalf-written")
    assert not files.reload_if_changed()  # logged; the old pair still serves
    write_pair(tmp_path, "fixed")
    assert files.reload_if_changed()


def test_one_file_without_the_other_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both `tls_cert_file` and `tls_key_file`"):
        parse_config({"server": {"tls_cert_file": "c.pem"},
                      "pools": [{"model": "m", "backends": [{"url": "http://h:1"}]}]})  # fmt: skip
