"""replicad/config/tls.py: TLS contexts for both ends, from the config."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from replicad.config.model import (
    ClientAuth,
    Config,
    HostPort,
    Secret,
    SecurityConfig,
    SecurityProtocol,
    ServeConfig,
    ServeSecurityConfig,
    ServeTlsConfig,
    SourceConfig,
    TlsConfig,
)
from replicad.config.tls import (
    MINIMUM_TLS,
    TlsReload,
    client_tls_context,
    password_callback,
    reload_tls_files,
    server_tls_context,
    ssl_reason,
    tls_context,
)
from tools.peers.pki import Pki, make_test_pki, reissue
from tools.wait import wait_until


@pytest.mark.parametrize("server", [True, False])
def test_both_ends_refuse_below_tls_1_2(server: bool) -> None:
    context = tls_context(server=server)
    assert context.minimum_version == MINIMUM_TLS == ssl.TLSVersion.TLSv1_2
    assert context.protocol == (ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)


def test_the_key_password_is_always_answered_and_reported_asked() -> None:
    asked: list[bool] = []
    assert password_callback(None, asked=lambda: asked.append(True))() == ""
    assert asked == [True]
    assert password_callback(Secret("test", "s3cret"))() == "s3cret"


def test_ssl_reasons_read_as_words() -> None:
    error = ssl.SSLError(1, "x")
    error.reason = "CERTIFICATE_VERIFY_FAILED"
    assert ssl_reason(error) == "certificate verify failed"


# -- certificates rotated without a restart (reload_tls_files) ------------------------------


class TlsPeer:
    """A real TLS endpoint on 127.0.0.1 (Python's ssl, a thread): it records the
    certificate each connection showed (the client's, when it asks for one) and echoes."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.context = context
        self.seen: list[int | None] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(raw,), daemon=True).start()

    def _echo(self, raw: socket.socket) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as conn:
                cert = conn.getpeercert(binary_form=True)
                self.seen.append(_serial(cert) if cert else None)
                while data := conn.recv(1024):
                    conn.sendall(data)
        except OSError:
            raw.close()

    def close(self) -> None:
        self.listener.close()


def _serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def _connect(context: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    conn = context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname="localhost"
    )
    conn.sendall(b"ping")  # TLS 1.3: the server checks a client certificate by now
    assert conn.recv(4) == b"ping"
    return conn


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_test_pki(tmp_path / "pki")


def _serve_config(cert: Path, key: Path) -> Config:
    tls = ServeTlsConfig(cert_file=cert, key_file=key)
    serve = ServeConfig(HostPort("127.0.0.1", 1), security=ServeSecurityConfig(tls=tls))
    return Config(serve=serve)


def test_a_rotated_server_certificate_is_shown_to_new_connections_and_old_ones_stay(
    pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "serve-cert.pem", tmp_path / "serve-key.pem"
    shutil.copy(pki.broker_cert, cert)
    shutil.copy(pki.broker_key, key)
    peer = TlsPeer(server_tls_context(cert, key))
    clients = ssl.create_default_context(cafile=str(pki.ca))
    try:
        old = _connect(clients, peer.port)
        first = _serial(old.getpeercert(binary_form=True))
        new = reissue(pki, cert, key, common_name="serve", server=True, dns=["localhost"])
        assert reload_tls_files(_serve_config(cert, key)) == [TlsReload("serve.security.tls", 1)]
        with _connect(clients, peer.port) as after:
            assert _serial(after.getpeercert(binary_form=True)) == new.serial_number != first
        old.sendall(b"more")  # the connection made before the reload goes on
        assert old.recv(4) == b"more"
        old.close()

        # A key that is not the certificate's: refused in one line, the new pair kept.
        shutil.copy(pki.client_key, key)
        (refused,) = reload_tls_files(_serve_config(cert, key))
        assert refused.contexts == 0
        assert refused.error is not None and "\n" not in refused.error
        assert refused.error.startswith("serve.security.tls.cert_file: cannot load")
        with _connect(clients, peer.port) as still:
            assert _serial(still.getpeercert(binary_form=True)) == new.serial_number
    finally:
        peer.close()


def test_a_rotated_client_certificate_is_shown_by_new_connections(pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "client-cert.pem", tmp_path / "client-key.pem"
    shutil.copy(pki.client_cert, cert)
    shutil.copy(pki.client_key, key)
    tls = TlsConfig(ca_file=pki.ca, cert_file=cert, key_file=key)
    config = Config(source=SourceConfig(security=SecurityConfig(SecurityProtocol.SSL, tls)))
    server = server_tls_context(
        pki.broker_cert, pki.broker_key, ca_file=pki.ca, client_auth=ClientAuth.REQUIRED
    )
    peer = TlsPeer(server)
    context = client_tls_context(tls)
    try:
        _connect(context, peer.port).close()
        new = reissue(pki, cert, key, common_name="rotated", server=False)
        (reloaded,) = reload_tls_files(config)
        assert reloaded == TlsReload("source.security.tls", 1)
        _connect(context, peer.port).close()

        cert.unlink()  # unreadable: refused, the certificate in use kept
        (refused,) = reload_tls_files(config)
        assert refused.error == f"source.security.tls.cert_file: {cert} is not a readable file"
        _connect(context, peer.port).close()
        wait_until(lambda: len(peer.seen) == 3, timeout_s=30, what="three handshakes")
        assert peer.seen[0] != new.serial_number
        assert peer.seen[1:] == [new.serial_number, new.serial_number]
    finally:
        peer.close()
