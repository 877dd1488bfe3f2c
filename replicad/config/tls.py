"""TLS contexts from the config's TLS sections, for both ends of a connection.

`client_tls_context` serves the follower's connections to the source
(`source.security.tls`, used by replicad.protocol.security), `server_tls_context` the
listener of `replicad serve` (`serve.security.tls`, replicad.leader.security); the config
loader builds them too, so a file that does not load is reported when the config is,
naming its key. Rules both keep:

- TLS 1.2 is the floor, either way.
- A private key's password is always answered by a callback, even when there is none
  (then ""): without one OpenSSL would prompt on the terminal of a daemon.

Certificates rotate without a restart (`reload_tls_files`: `replicad run`'s SIGHUP and
`replicad reload`). Every context made here is remembered (weakly) with what it was made
from; a reload first builds a fresh context from the same files, which must load (readable,
the key matching its certificate, CAs in PEM), and only then loads them again into the
remembered contexts themselves. So every holder (the follower's, the mirror's and the
verifier's clients, serve's listener) makes its next connections with the new files and
keeps the ones it has: a handshake copies the certificate out of the context. Files that do
not load are refused with one line naming the key, and the contexts keep what they had.
CA files are added to the trusted set, not swapped: a CA dropped from the file is still
trusted until a restart (rotation adds the new CA before the old one goes).
"""

from __future__ import annotations

import ssl
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from replicad.config.model import ClientAuth, Config, Secret, ServeTlsConfig, TlsConfig
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


# Every context made below, by what it was made from (see the module's docstring).
_LIVE: dict[Hashable, weakref.WeakSet[ssl.SSLContext]] = {}


def _remember(made_from: Hashable, context: ssl.SSLContext) -> ssl.SSLContext:
    _LIVE.setdefault(made_from, weakref.WeakSet()).add(context)
    return context


def client_tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """An SSLContext for connecting to brokers; ConfigError naming the key whose file fails."""
    return _remember(("client", tls), _client_context(tls))


def _client_context(tls: TlsConfig) -> ssl.SSLContext:
    context = tls_context(server=False)
    if tls.verify:
        _load_trust(context, tls.ca_file)
        context.check_hostname = tls.check_hostname
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    _load_client_files(context, tls, trust=False)
    return context


def _load_client_files(context: ssl.SSLContext, tls: TlsConfig, *, trust: bool) -> None:
    if trust and tls.verify and tls.ca_file is not None:
        _load_trust(context, tls.ca_file)
    if tls.cert_file is not None:
        _load_client_certificate(context, tls)


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
    _load_server_files(context, cert_file, key_file, ca_file, client_auth, key_password)
    return _remember(("server", cert_file, key_file, ca_file, client_auth, key_password), context)


def _load_server_files(
    context: ssl.SSLContext,
    cert_file: Path,
    key_file: Path | None,
    ca_file: Path | None,
    client_auth: ClientAuth,
    key_password: Secret | None,
) -> None:
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


# -- rotation without a restart ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsReload:
    """One TLS section re-read: how many live contexts took its files, or why none did."""

    section: str
    contexts: int
    error: str | None = None


def reload_tls_files(config: Config) -> list[TlsReload]:
    """Re-read the TLS files of every section of `config` that uses TLS into the contexts
    made from it (the module's docstring). Blocks on reading the files (a few KiB)."""
    reloads = []
    source = config.source.security
    if source.protocol.uses_tls:
        reloads.append(_reload_client(source.tls, "source.security.tls"))
    if config.mirror is not None and config.mirror.security.protocol.uses_tls:
        reloads.append(_reload_client(config.mirror.security.tls, "mirror.security.tls"))
    if config.serve is not None and config.serve.security.tls.cert_file is not None:
        reloads.append(_reload_server(config.serve.security.tls, "serve.security.tls"))
    return reloads


def _reload_client(tls: TlsConfig, section: str) -> TlsReload:
    live = list(_LIVE.get(("client", tls), ()))
    if not live:
        return TlsReload(section, 0)
    try:
        _client_context(tls)  # the new files must load before any live context takes them
        for context in live:
            _load_client_files(context, tls, trust=True)
    except ConfigError as error:
        return TlsReload(section, 0, f"{error.path.replace(TLS_KEYS, section, 1)}: {error.message}")
    return TlsReload(section, len(live))


def _reload_server(tls: ServeTlsConfig, section: str) -> TlsReload:
    assert tls.cert_file is not None
    files = (tls.cert_file, tls.key_file, tls.ca_file, tls.client_auth, tls.key_password)
    live = list(_LIVE.get(("server", *files), ()))
    if not live:
        return TlsReload(section, 0)
    try:
        _load_server_files(tls_context(server=True), *files)
        for context in live:
            _load_server_files(context, *files)
    except (ssl.SSLError, OSError, ValueError) as error:
        reason = ssl_reason(error) if isinstance(error, ssl.SSLError) else str(error)
        return TlsReload(
            section,
            0,
            f"{section}.cert_file: cannot load the certificate, its key and CAs ({reason})",
        )
    return TlsReload(section, len(live))
