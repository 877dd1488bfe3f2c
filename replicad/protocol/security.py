"""TLS and SASL towards the source's brokers: the client side. The server side is
`replicad.leader.security`; what both keep is written once: TLS contexts in
`replicad.config.tls` (the TLS floor, key passwords), SASL's rules in
`replicad.protocol.sasl` (PLAIN's message, SCRAM's hashes, SASLprep).

Rules this module keeps:
- TLS verifies by default: the broker's chain against `ca_file` (or the system's CAs)
  and its name against the host we dial (or `server_hostname`). TLS 1.2 is the floor.
- SASL follows Kafka's order on a fresh connection: ApiVersions, then SaslHandshake v1
  naming one mechanism, then SaslAuthenticate rounds until the mechanism is done; only
  then any other request. `SaslClient` is that order as a sans-I/O state machine:
  kio requests out, kio responses in; the connection does the sending.
- PLAIN is one round ("\\0user\\0password", RFC 4616). SCRAM-SHA-256/512 (RFC 5802,
  RFC 7677; computed by the `scramp` library) is two rounds, and the second answer must
  prove the broker knows our credential: a broker that cannot is refused.
- A session lifetime from SaslAuthenticate (KIP-368, the broker's connections.max.reauth.ms)
  is honoured by the connection reconnecting before it ends, not by re-authenticating.
- A refusal is an `AuthenticationError` (a `KafkaConnectionError`: the shell logs it and
  retries with backoff), whose text says what failed and which setting to look at, and
  never holds a password: the secret is read from a `Secret` only to build the bytes sent.
- Anything that does not follow these rules is the peer's fault; bad SCRAM messages from
  the broker are refused the same way as a wrong password, never raised raw.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from kio.schema.errors import ErrorCode

from replicad.config.model import (
    SaslConfig,
    SaslMechanism,
    Secret,
    SecurityConfig,
)
from replicad.errors import AuthenticationError, ConfigError, KafkaConnectionError
from replicad.protocol.apis import ApiKey, NegotiatedVersions
from replicad.protocol.sasl import PLAIN_SEPARATOR, refuse_saslprep_changes

if TYPE_CHECKING:
    # ssl (with OpenSSL, 5.2 MiB of RSS) is loaded by a connection that uses TLS
    # (replicad.config.tls), not by every follower: replicad/startup.py's keep_tls_out.
    import ssl

log = structlog.get_logger("replicad.security")

SASL_KEYS = "source.security.sasl"
# OpenSSL's verify codes for a certificate that does not name the host (RFC 6125).
X509_V_ERR_HOSTNAME_MISMATCH = 62
X509_V_ERR_IP_ADDRESS_MISMATCH = 64


def is_ssl_error(error: BaseException | None) -> bool:
    """Whether `error` is one of ssl's. Without ssl loaded (no TLS configured) there can be
    none, and this does not load it."""
    loaded = sys.modules.get("ssl")
    return loaded is not None and isinstance(error, loaded.SSLError)


def _authenticate_request_class(version: int) -> type:
    """SaslAuthenticate's request class for `version` (0 to 2). kio's SASL schemas are
    imported by a connection that authenticates, not by every start: a follower without
    SASL spent about 20 ms of its start-up generating their classes (issue 32)."""
    if version == 0:
        from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest
    elif version == 1:
        from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
    else:
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    return SaslAuthenticateRequest


# -- settings a connection uses ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    """Who we are to the brokers. The password stays a `Secret` (hidden in repr)."""

    mechanism: SaslMechanism
    username: str
    password: Secret


@dataclass(frozen=True, slots=True)
class ConnectionSecurity:
    """What a broker connection does before its first request: TLS, then SASL.

    The default is plaintext without authentication.
    """

    tls: ssl.SSLContext | None = None
    # The name the brokers' certificates must carry; None = the host dialled.
    server_hostname: str | None = None
    # Whether `tls` holds a client certificate (mutual TLS), for error messages.
    client_certificate: bool = False
    sasl: SaslCredentials | None = None

    def open_options(self, host: str, handshake_timeout_s: float) -> dict[str, Any]:
        """Keyword arguments for asyncio.open_connection to `host` ({} for plaintext)."""
        if self.tls is None:
            return {}
        return {
            "ssl": self.tls,
            "server_hostname": self.server_hostname or host,
            "ssl_handshake_timeout": handshake_timeout_s,
            # A broker that never answers our close_notify must not hold up a close.
            "ssl_shutdown_timeout": min(handshake_timeout_s, 5.0),
        }

    def connect_failure(self, address: str, error: BaseException) -> KafkaConnectionError:
        """The error to report when connecting to `address` failed with `error`."""
        if is_ssl_error(error):
            return tls_failure(address, error, client_certificate=self.client_certificate)
        if self.tls is not None and isinstance(error, _CLOSED_IN_HANDSHAKE):
            return AuthenticationError(
                f"TLS with {address} failed: the broker closed the connection during the "
                f"handshake; {_NOT_TLS_HINT}"
            )
        return KafkaConnectionError(
            f"cannot connect to {address}: {str(error) or type(error).__name__}"
        )

    def reset_failure(self, address: str, error: OSError) -> AuthenticationError | None:
        """A TLS connection reset before the first answer: with TLS 1.3 a broker that
        refuses (or misses) our client certificate may just reset instead of alerting."""
        if self.tls is None or not isinstance(error, ConnectionResetError):
            return None
        return AuthenticationError(
            f"TLS with {address}: the broker reset the connection right after the "
            f"handshake; {_client_certificate_hint(self.client_certificate)}"
        )

    def read_failure(self, address: str, error: ssl.SSLError) -> AuthenticationError:
        """A TLS error after the handshake: TLS 1.3 reports a refused client certificate
        there, at the first read."""
        return tls_failure(address, error, client_certificate=self.client_certificate)


PLAINTEXT = ConnectionSecurity()


def connection_security(config: SecurityConfig) -> ConnectionSecurity:
    """The connection settings for a validated `source.security` (ConfigError if the TLS
    files no longer load). Settings that weaken security are logged once, here."""
    protocol = config.protocol
    tls = None
    if protocol.uses_tls:
        from replicad.config.tls import TLS_KEYS, client_tls_context

        tls = client_tls_context(config.tls)
    sasl = _credentials(config.sasl) if protocol.uses_sasl else None
    if tls is not None and not config.tls.verify:
        log.warning(
            "TLS certificate verification is off: the connection is encrypted, but any "
            "host can pose as the broker",
            setting=f"{TLS_KEYS}.verify",
        )
    elif tls is not None and not config.tls.check_hostname:
        log.warning(
            "TLS hostname check is off: any certificate from a trusted CA is accepted",
            setting=f"{TLS_KEYS}.check_hostname",
        )
    if sasl is not None and tls is None and sasl.mechanism is SaslMechanism.PLAIN:
        log.warning(
            "SASL PLAIN without TLS sends the password in clear text; use sasl_ssl or SCRAM",
            setting="source.security.protocol",
        )
    server_hostname = config.tls.server_hostname if tls is not None else None
    return ConnectionSecurity(
        tls=tls,
        server_hostname=server_hostname,
        client_certificate=tls is not None and config.tls.cert_file is not None,
        sasl=sasl,
    )


def _credentials(sasl: SaslConfig) -> SaslCredentials:
    password = sasl.password
    if password is None or not sasl.username:
        # The loader's cross checks make this unreachable for a loaded config.
        raise ConfigError(SASL_KEYS, "SASL needs a username and a password")
    return SaslCredentials(sasl.mechanism, sasl.username, password)


# -- what a TLS failure means -----------------------------------------------------------

# A TLS client whose peer hangs up mid-handshake sees one of these.
_CLOSED_IN_HANDSHAKE = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
_NOT_TLS_HINT = (
    "is this port a TLS listener? Check source.security.protocol against the broker's listener"
)
# OpenSSL reasons (lower case, "_" as " ") and what they mean here.
_CLIENT_CERTIFICATE_REFUSALS = (
    "certificate required",
    "handshake failure",
    "unknown ca",
    "bad certificate",
    "certificate unknown",
    "unsupported certificate",
)
_NOT_TLS_REASONS = ("wrong version number", "record layer failure", "packet length too long")


def _client_certificate_hint(client_certificate: bool) -> str:
    return (
        "the broker refused our client certificate: is it signed by a CA the broker trusts?"
        if client_certificate
        else "the broker requires a client certificate: set source.security.tls.cert_file "
        "and key_file"
    )


def tls_failure(
    address: str, error: ssl.SSLError, *, client_certificate: bool
) -> AuthenticationError:
    """The error to report for a TLS failure talking to `address`, with what to check."""
    import ssl  # loaded already: `error` is one of its errors

    from replicad.config.tls import ssl_reason

    if isinstance(error, ssl.SSLCertVerificationError):
        detail = str(error.verify_message or error.reason or error).rstrip(".")
        if error.verify_code in (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH):
            hint = (
                "the certificate does not name the host we connected to; set "
                "source.security.tls.server_hostname to the name it carries"
            )
        else:
            hint = (
                "the broker's certificate is not signed by a CA we trust "
                "(source.security.tls.ca_file)"
            )
        return AuthenticationError(
            f"TLS: {address} presented a certificate we refuse: {detail}; {hint}"
        )
    reason = ssl_reason(error)
    if any(needle in reason for needle in _CLIENT_CERTIFICATE_REFUSALS):
        hint = _client_certificate_hint(client_certificate)
        return AuthenticationError(f"TLS with {address} failed: {reason}; {hint}")
    if any(needle in reason for needle in _NOT_TLS_REASONS):
        return AuthenticationError(f"TLS with {address} failed: {reason}; {_NOT_TLS_HINT}")
    return AuthenticationError(f"TLS with {address} failed: {reason}")


# -- SASL, client side --------------------------------------------------------------------


class _Mechanism(Protocol):
    def first_message(self) -> bytes: ...

    def next_message(self, challenge: bytes) -> bytes | None:
        """The answer to the broker's bytes; None once the exchange is complete."""


class _Plain:
    """RFC 4616: one message; the broker answers it with empty bytes. The authzid is
    empty: "act as the user who authenticates", the only identity Kafka allows."""

    def __init__(self, username: str, password: Secret) -> None:
        self._username = username
        self._password = password

    def first_message(self) -> bytes:
        text = PLAIN_SEPARATOR.join(("", self._username, self._password.reveal()))
        return text.encode()

    def next_message(self, challenge: bytes) -> bytes | None:
        return None


class ScramRefused(Exception):
    """scramp refused a credential or a broker's message (its ScramException, said in our
    own type so that scramp is loaded only by connections that use SCRAM)."""


class _Scram:
    """RFC 5802 without channel binding (Kafka offers none): client-first, client-final,
    then the broker's signature must verify."""

    def __init__(
        self, mechanism: SaslMechanism, username: str, password: Secret, nonce: str | None
    ) -> None:
        from scramp import ScramClient, ScramException

        self._refused = ScramException
        try:
            # scramp applies SASLprep (RFC 4013) as RFC 5802 asks; Kafka does not.
            refuse_saslprep_changes(username=username, password=password.reveal())
            self._client = ScramClient(
                [mechanism.wire_name], username, password.reveal(), c_nonce=nonce
            )
        except ScramException as error:
            raise ScramRefused(str(error)) from None
        self._sent_final = False

    def first_message(self) -> bytes:
        return self._client.get_client_first().encode()

    def next_message(self, challenge: bytes) -> bytes | None:
        text = challenge.decode("utf-8")
        try:
            if not self._sent_final:
                self._client.set_server_first(text)
                self._sent_final = True
                return self._client.get_client_final().encode()
            self._client.set_server_final(text)
        except self._refused as error:
            raise ScramRefused(str(error)) from None
        return None


class SaslPhase(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATING = "authenticating"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SaslStep:
    """What to do after a response: send `request`, or (None) the connection is ready."""

    request: Any | None
    # From SaslAuthenticate v1+: after this long the broker closes the connection unless
    # it re-authenticates (KIP-368); 0 = no limit.
    session_lifetime_ms: int = 0


class SaslClient:
    """One SASL exchange on one connection; see the module's rules.

    `start()` gives the SaslHandshake request; each response goes to `receive()`, which
    gives the next request or says the exchange is done, or raises AuthenticationError.
    """

    def __init__(
        self,
        credentials: SaslCredentials,
        versions: NegotiatedVersions,
        *,
        broker: str,
        nonce: str | None = None,
    ) -> None:
        self.credentials = credentials
        self.broker = broker
        self.phase = SaslPhase.HANDSHAKE
        if versions.get(ApiKey.SASL_HANDSHAKE) is None:
            raise self._fail(f"{broker} offers no SaslHandshake v1: it cannot do SASL")
        version = versions.get(ApiKey.SASL_AUTHENTICATE)
        if version is None:
            raise self._fail(f"{broker} offers no SaslAuthenticate: it cannot do SASL")
        self._request_cls = _authenticate_request_class(version)
        mechanism = credentials.mechanism
        if mechanism is SaslMechanism.PLAIN:
            self._mechanism: _Mechanism = _Plain(credentials.username, credentials.password)
        else:
            try:
                self._mechanism = _Scram(
                    mechanism, credentials.username, credentials.password, nonce
                )
            except ScramRefused as error:
                # saslprep (RFC 4013) refuses some characters in names and passwords.
                raise self._fail(f"cannot use these SCRAM credentials: {error}") from None

    def start(self) -> Any:
        if self.phase is not SaslPhase.HANDSHAKE:
            raise self._fail("SASL exchange started twice")
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        return SaslHandshakeRequest(mechanism=self.credentials.mechanism.wire_name)

    def receive(self, response: Any) -> SaslStep:
        if self.phase is SaslPhase.HANDSHAKE:
            return self._on_handshake(response)
        if self.phase is SaslPhase.AUTHENTICATING:
            return self._on_authenticate(response)
        raise self._fail(f"SASL exchange already {self.phase.value}")

    def _on_handshake(self, response: Any) -> SaslStep:
        error = ErrorCode(response.error_code)
        wanted = self.credentials.mechanism.wire_name
        if error is ErrorCode.unsupported_sasl_mechanism:
            offered = ", ".join(response.mechanisms) or "none"
            raise self._fail(
                f"{self.broker} does not enable SASL mechanism {wanted} (it offers: "
                f"{offered}); set {SASL_KEYS}.mechanism"
            )
        if error is ErrorCode.illegal_sasl_state:
            raise self._fail(
                f"{self.broker} does not expect SASL on this port: check "
                "source.security.protocol against the broker's listener"
            )
        if error is not ErrorCode.none:
            raise self._fail(f"SaslHandshake with {self.broker} failed: {error.name}")
        self.phase = SaslPhase.AUTHENTICATING
        return SaslStep(self._authenticate(self._guard(self._mechanism.first_message)))

    def _on_authenticate(self, response: Any) -> SaslStep:
        error = ErrorCode(response.error_code)
        if error is not ErrorCode.none:
            said = f": {response.error_message}" if response.error_message else ""
            raise self._fail(
                f"{self.broker} refused {self.credentials.mechanism.wire_name} "
                f"authentication as {self.credentials.username!r} ({error.name}){said}"
            )
        answer = self._guard(lambda: self._mechanism.next_message(bytes(response.auth_bytes)))
        if answer is not None:
            return SaslStep(self._authenticate(answer))
        self.phase = SaslPhase.DONE
        lifetime = getattr(response, "session_lifetime", None)
        lifetime_ms = int(lifetime.total_seconds() * 1000) if lifetime is not None else 0
        return SaslStep(None, session_lifetime_ms=lifetime_ms)

    def _authenticate(self, auth_bytes: bytes) -> Any:
        return self._request_cls(auth_bytes=auth_bytes)

    def _guard(self, step: Any) -> Any:
        """Run a mechanism step; a broker message it rejects ends the exchange."""
        try:
            return step()
        except (ScramRefused, UnicodeDecodeError) as error:
            raise self._fail(
                f"{self.broker}'s {self.credentials.mechanism.wire_name} answer is refused: "
                f"{error} (not the broker holding our credential, or not Kafka's SCRAM)"
            ) from None

    def _fail(self, message: str) -> AuthenticationError:
        self.phase = SaslPhase.FAILED
        return AuthenticationError(message)
