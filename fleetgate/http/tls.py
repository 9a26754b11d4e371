"""TLS for the server: a certificate and key from files, reloaded when the files change.

A renewed certificate (cert-manager writing a Kubernetes secret, certbot, an operator copying
files) is picked up without a restart: `reload_if_changed` loads the files into the same
`SSLContext` whenever either one's modification time or size moves, so every handshake after
that uses them; connections already open keep the certificate they began with. A pair that
does not load (a half-written file, a key that does not match) leaves the old pair serving
and says why; the next check tries again.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

log = logging.getLogger(__name__)


class TlsFiles:
    """A server-side TLS context over a certificate chain file and its private key file."""

    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self._cert = Path(cert_file)
        self._key = Path(key_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])
        self._seen = self._stamp()
        self.context.load_cert_chain(self._cert, self._key)  # a bad pair fails at start

    def _stamp(self) -> tuple[int, int, int, int]:
        cert, key = os.stat(self._cert), os.stat(self._key)
        return cert.st_mtime_ns, cert.st_size, key.st_mtime_ns, key.st_size

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last load; True if it did."""
        try:
            stamp = self._stamp()
        except OSError as exc:
            log.error("TLS files unreadable, keeping the loaded certificate: %s", exc)
            return False
        if stamp == self._seen:
            return False
        try:
            self.context.load_cert_chain(self._cert, self._key)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files did not load, keeping the previous certificate: %s", exc)
            return False
        self._seen = stamp
        log.warning("TLS certificate reloaded from %s", self._cert)
        return True
