"""TLS contexts from the config's TLS sections, for both ends of a connection.

`client_tls_context` serves the follower's connections to the source
(`source.security.tls`, used by replicad.protocol.security), `server_tls_context` the
listener of `replicad serve` (`serve.security.tls`, replicad.leader.security); the config
loader builds them too, so a file that does not load is reported when the config is,
naming its key. Rules both keep:

- TLS 1.2 is the floor, either way.
- A private key's password is always answered by a callback, even when there is none
  (then ""): without one OpenSSL would prompt on the terminal of a daemon.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from replicad.config.model import ClientAuth, Secret, TlsConfig
from replicad.errors import ConfigError

MINIMUM_TLS = ssl.TLSVersion.TLSv1_2
TLS_KEYS = "source.security.tls"


def tls_context(*, server: bool) -> ssl.SSLContext:
    """A server's or a client's context, at the TLS floor."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_TLS
    return context


def password_callback(
    secret: Secret | None, asked: Callable[[], None] | None = None
) -> Callable[[], str]:
    """The password callback for `load_cert_chain` ("" when there is no secret);
    `asked` is told when OpenSSL needed it (the key is encrypted)."""

    def answer() -> str:
        if asked is not None:
            asked()
        return secret.reveal() if secret is not None else ""

    return answer


def ssl_reason(error: ssl.SSLError) -> str:
    """OpenSSL's reason for a failure, readable: "certificate verify failed"."""
    return str(error.reason or error.strerror or error).replace("_", " ").lower()


def client_tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """An SSLContext for connecting to brokers; ConfigError naming the key whose file fails."""
    context = tls_context(server=False)
    if tls.verify:
        _load_trust(context, tls.ca_file)
        context.check_hostname = tls.check_hostname
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert_file is not None:
        _load_client_certificate(context, tls)
    return context


def _load_trust(context: ssl.SSLContext, ca_file: Path | None) -> None:
    if ca_file is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        return
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except ssl.SSLError as error:
        raise ConfigError(
            f"{TLS_KEYS}.ca_file",
            f"{ca_file} holds no usable PEM CA certificate ({ssl_reason(error)})",
        ) from None
    except OSError as error:
        raise ConfigError(
            f"{TLS_KEYS}.ca_file", f"cannot read {ca_file}: {error.strerror or error}"
        ) from None


def _load_client_certificate(context: ssl.SSLContext, tls: TlsConfig) -> None:
    assert tls.cert_file is not None
    secret = tls.key_password_file or tls.key_password_env
    asked: list[bool] = []
    for path in (tls.cert_file, tls.key_file):
        if path is not None and not path.is_file():
            key = "cert_file" if path == tls.cert_file else "key_file"
            raise ConfigError(f"{TLS_KEYS}.{key}", f"{path} is not a readable file")
    try:
        context.load_cert_chain(
            str(tls.cert_file),
            str(tls.key_file) if tls.key_file is not None else None,
            password=password_callback(secret, asked=lambda: asked.append(True)),
        )
    except ssl.SSLError as error:
        if asked and secret is None:
            raise ConfigError(
                f"{TLS_KEYS}.key_file",
                "the private key is encrypted: give key_password_file or key_password_env",
            ) from None
        if asked:
            reason = "the key password does not decrypt the private key"
            raise ConfigError(f"{TLS_KEYS}.key_file", reason) from None
        raise ConfigError(
            f"{TLS_KEYS}.cert_file",
            "cannot load the client certificate and its key: cert_file must hold a PEM "
            "certificate, and key_file (or cert_file) the private key that matches it "
            f"({ssl_reason(error)})",
        ) from None
    except OSError as error:
        raise ConfigError(
            f"{TLS_KEYS}.cert_file", f"cannot read it: {error.strerror or error}"
        ) from None


def server_tls_context(
    cert_file: Path,
    key_file: Path | None = None,
    *,
    ca_file: Path | None = None,
    client_auth: ClientAuth = ClientAuth.NONE,
    key_password: Secret | None = None,
) -> ssl.SSLContext:
    """An SSLContext for serving; client certificates are checked against `ca_file`.

    Raises ssl.SSLError / OSError as loading does; the caller names the setting.
    """
    context = tls_context(server=True)
    context.load_cert_chain(
        str(cert_file),
        str(key_file) if key_file is not None else None,
        password=password_callback(key_password),
    )
    if client_auth is not ClientAuth.NONE:
        if ca_file is None:
            raise ValueError("client certificates need a ca_file to check them against")
        context.load_verify_locations(cafile=str(ca_file))
        context.verify_mode = (
            ssl.CERT_REQUIRED if client_auth is ClientAuth.REQUIRED else ssl.CERT_OPTIONAL
        )
    return context
