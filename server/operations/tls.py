"""TLS for both front ends, with certificates that reload when their files change (no restart).

gRPC asks ``fetch`` for a new configuration at every new connection's handshake; the HTTP API's
``ssl.SSLContext`` is reloaded in place by the same check, which the server also runs every
RELOAD_CHECK_SECONDS. A rotation (cert-manager renewing a mounted Secret, say) reaches new connections
within that time; connections already open keep the certificate they started with.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

import grpc

from server.config import ServerConfig

RELOAD_CHECK_SECONDS = 5.0
log = logging.getLogger(__name__)


class Certificates:
    def __init__(self, config: ServerConfig) -> None:
        assert config.tls_cert is not None and config.tls_key is not None
        self.cert, self.key, self.client_ca = config.tls_cert, config.tls_key, config.tls_client_ca
        self._lock = threading.Lock()  # gRPC fetches from its own threads
        stamp = self._read_stamp()
        self._stamps = {"grpc": stamp, "http": stamp}  # what each front end last loaded
        self.http_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        if self.client_ca is not None:
            self.http_context.verify_mode = ssl.CERT_REQUIRED
        self._load_http()

    @property
    def files(self) -> list[Path]:
        return [path for path in (self.cert, self.key, self.client_ca) if path is not None]

    def _read_stamp(self) -> tuple[int, ...]:
        return tuple(path.stat().st_mtime_ns for path in self.files)

    def _load_http(self) -> None:
        self.http_context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            self.http_context.load_verify_locations(self.client_ca)

    def _grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        client_ca = self.client_ca.read_bytes() if self.client_ca is not None else None
        pair = (self.key.read_bytes(), self.cert.read_bytes())
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=client_ca)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_configuration(), self.fetch, require_client_authentication=self.client_ca is not None
        )

    def _changed(self, consumer: str, load) -> bool:
        """Whether a file changed since ``consumer`` (gRPC, HTTP) last loaded them; if so, ``load()`` it."""
        with self._lock:
            try:
                stamp = self._read_stamp()
                if stamp == self._stamps[consumer]:
                    return False
                load()
            except (OSError, ssl.SSLError) as error:  # mid-rotation (a missing or half-written file): next time
                log.warning("TLS files changed but do not load yet (%s); keeping the loaded certificate", error)
                return False
            self._stamps[consumer] = stamp
            log.info("TLS certificate for %s reloaded from %s", consumer, self.cert)
            return True

    def reload_http(self) -> bool:
        """Load the files into the HTTP API's context again if they changed (run every RELOAD_CHECK_SECONDS)."""
        return self._changed("http", self._load_http)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's per-handshake question: a new configuration when the files changed, else None."""
        loaded: list[grpc.ServerCertificateConfiguration] = []
        self._changed("grpc", lambda: loaded.append(self._grpc_configuration()))
        return loaded[0] if loaded else None
