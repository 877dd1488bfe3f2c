"""TLS and SASL for `replicad serve`: the server side of `replicad.protocol.security`
(what both sides keep alike: `replicad.config.tls`, `replicad.protocol.sasl`).

Sans-I/O: kio requests in, kio response bodies and decisions out; the connection of
`replicad.leader.server` does the reading, writing and closing.

Rules (Kafka's SaslServerAuthenticator and its PLAIN and SCRAM servers):
- On a SASL listener a connection starts unauthenticated. Until authentication succeeds
  only ApiVersions, SaslHandshake and SaslAuthenticate are admitted; any other request
  closes the connection. After it succeeds SaslHandshake and SaslAuthenticate are refused
  (no re-authentication, KIP-368, here) and everything else is admitted.
- SaslHandshake (v0 or v1) names one mechanism: an enabled one moves on to SaslAuthenticate
  (v0 raw tokens are not served: a v0 handshake is answered but the exchange must go
  through SaslAuthenticate); any other is UNSUPPORTED_SASL_MECHANISM with the enabled list,
  and a second handshake is ILLEGAL_SASL_STATE.
- PLAIN: one message `authzid NUL user NUL password`; an authzid other than empty or the
  user is refused. SCRAM-SHA-256/512 (RFC 5802/7677, via `scramp`): client-first ->
  server-first, client-final -> server-final; the proof decides. The client-final nonce
  must be exactly the server-first one (RFC 5802, as Kafka 4 checks since CVE-2024-56128):
  librdkafka before 2.6.1, which repeats its own nonce there, is refused as by Kafka 4.
- No plaintext password is kept: every user is a salted SCRAM credential per mechanism, and
  a PLAIN password is checked by deriving the SCRAM stored key from it.
- A wrong password and an unknown user are indistinguishable: an unknown user goes through
  SCRAM against a made-up credential and fails at the proof, with the same message as a
  wrong password. Every failure is SASL_AUTHENTICATION_FAILED, then the connection closes.
- Principals are Kafka's: "User:<name>" after SASL; after mutual TLS without SASL,
  "User:<subject DN, RFC 2253>"; "User:ANONYMOUS" otherwise.
- Followers: a Fetch claiming a replica id (>= 0) gets a privileged session only when the
  connection's principal is one of the follower principals and the id is an allowed
  follower. A principal that is not a follower principal is answered as Kafka answers a
  follower fetch without CLUSTER_ACTION: TOPIC_AUTHORIZATION_FAILED for every partition
  (and, unlike Kafka, no session is made for it). A follower principal claiming an id that
  is not allowed is answered as an unknown replica. Without authentication (no SASL, no
  client certificates) there are no principals to check: the replica id alone decides.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import hmac
import secrets
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta
from scramp import ScramException, ScramMechanism
from scramp.utils import saslprep

from replicad.config.model import ClientAuth, SaslMechanism, Secret, ServeSecurityConfig
from replicad.config.tls import server_tls_context
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import response_type
from replicad.protocol.sasl import PLAIN_SEPARATOR, SCRAM_HASHES

# Kafka's default SCRAM iteration count (ScramCredentialUtils / kafka-configs); 4096 is
# also the least RFC 7677 allows.
DEFAULT_ITERATIONS = 4096
SALT_BYTES = 32
USER = "User"
ANONYMOUS_NAME = "ANONYMOUS"
# What Kafka says to a failed SCRAM or PLAIN client; the same for every cause.
FAILED_MESSAGE = "Authentication failed: Invalid username or password"
# What may be sent before authentication completes.
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
SASL_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
# RFC 2253 names of the subject attributes Kafka shows by name (Java's X500Principal).
_DN_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_DN_SPECIALS = ',+"\\<>;'
_NO_SESSION_LIMIT = datetime.timedelta(0)


@dataclass(frozen=True, slots=True, order=True)
class Principal:
    """Who a connection is, in Kafka's `Type:name` form."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"a principal is Type:name, e.g. User:replicad, got {text!r}")
        return cls(kind, name)


ANONYMOUS = Principal(USER, ANONYMOUS_NAME)


# -- credentials ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps of a SCRAM password (RFC 5802 section 3); no password in it."""

    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int = DEFAULT_ITERATIONS

    @classmethod
    def from_password(
        cls,
        mechanism: SaslMechanism,
        password: str,
        *,
        iterations: int = DEFAULT_ITERATIONS,
        salt: bytes | None = None,
    ) -> ScramCredential:
        made_salt, stored, server, count = ScramMechanism(mechanism.wire_name).make_auth_info(
            password, iteration_count=iterations, salt=salt or secrets.token_bytes(SALT_BYTES)
        )
        return cls(made_salt, stored, server, count)

    def matches(self, mechanism: SaslMechanism, password: str) -> bool:
        """Whether `password` derives this credential's stored key (constant time)."""
        digest = SCRAM_HASHES[mechanism]
        try:
            prepared = saslprep(password).encode()
        except ScramException:
            return False
        salted = hashlib.pbkdf2_hmac(digest().name, prepared, self.salt, self.iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        return hmac.compare_digest(digest(client_key).digest(), self.stored_key)


class CredentialStore:
    """The users a server accepts: a SCRAM credential per user and mechanism."""

    def __init__(
        self, credentials: Mapping[tuple[SaslMechanism, str], ScramCredential] | None = None
    ) -> None:
        self._credentials = dict(credentials or {})
        # Made-up credentials for unknown users come from this key, so that the same unknown
        # name always gets the same salt (a changing salt would give the name away).
        self._decoy_key = secrets.token_bytes(32)

    @classmethod
    def from_passwords(
        cls,
        users: Mapping[str, Secret | str],
        mechanisms: Iterable[SaslMechanism] = tuple(SCRAM_HASHES),
        *,
        iterations: int = DEFAULT_ITERATIONS,
    ) -> CredentialStore:
        """Salted credentials for each user and SCRAM mechanism; the passwords are dropped."""
        credentials: dict[tuple[SaslMechanism, str], ScramCredential] = {}
        for mechanism in mechanisms:
            if mechanism is SaslMechanism.PLAIN:
                continue
            for user, password in users.items():
                text = password.reveal() if isinstance(password, Secret) else password
                credentials[(mechanism, user)] = ScramCredential.from_password(
                    mechanism, text, iterations=iterations
                )
        return cls(credentials)

    def users(self) -> frozenset[str]:
        return frozenset(user for _, user in self._credentials)

    def lookup(self, mechanism: SaslMechanism, user: str) -> ScramCredential | None:
        return self._credentials.get((mechanism, user))

    def check_plain(self, user: str, password: str) -> bool:
        """PLAIN: the password is right if it derives any SCRAM credential of the user."""
        found = [
            (mechanism, credential)
            for (mechanism, name), credential in self._credentials.items()
            if name == user
        ]
        if not found:
            # The same work as for a known user, so timing does not tell names apart.
            self.decoy(SaslMechanism.SCRAM_SHA_512, user).matches(
                SaslMechanism.SCRAM_SHA_512, password
            )
            return False
        mechanism, credential = found[0]
        return credential.matches(mechanism, password)

    def decoy(self, mechanism: SaslMechanism, user: str) -> ScramCredential:
        """A credential no password matches, stable per (mechanism, user)."""
        seed = hmac.new(self._decoy_key, f"{mechanism}\0{user}".encode(), hashlib.sha256)
        salt = seed.digest()
        keys = hmac.new(self._decoy_key, salt, hashlib.sha512).digest()
        return ScramCredential(salt, keys[:32], keys[32:], DEFAULT_ITERATIONS)


# -- the SASL server -------------------------------------------------------------------------


class AuthPhase(enum.Enum):
    AWAITING_HANDSHAKE = "awaiting handshake"
    AWAITING_AUTHENTICATE = "awaiting authenticate"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class Admission(enum.Enum):
    """What the connection does with a request, by its API, before handling it."""

    ADMIT = "admit"
    # Kafka closes a connection that sends anything but SASL before authenticating.
    CLOSE = "close"


@dataclass(frozen=True, slots=True)
class ServerReply:
    """A kio response body to send; then close the connection if `close` is set."""

    body: Any
    close: bool = False
    # Set once the exchange has succeeded: who the connection now is.
    principal: Principal | None = None


class SaslServer:
    """The SASL state of one server connection; see the module's rules."""

    def __init__(
        self,
        enabled: Sequence[SaslMechanism],
        store: CredentialStore,
        *,
        server_nonce: str | None = None,
    ) -> None:
        if not enabled:
            raise ValueError("a SASL server needs at least one enabled mechanism")
        self.enabled = tuple(enabled)
        self.store = store
        self.phase = AuthPhase.AWAITING_HANDSHAKE
        self.principal: Principal | None = None
        self._mechanism: SaslMechanism | None = None
        self._server_nonce = server_nonce
        self._scram: Any = None
        self._scram_user: str | None = None
        self._scram_decoy = False

    @property
    def mechanism(self) -> SaslMechanism | None:
        """The mechanism the handshake chose, once it has."""
        return self._mechanism

    @property
    def done(self) -> bool:
        """Whether the exchange has succeeded (the connection may send anything now)."""
        return self.phase is AuthPhase.AUTHENTICATED

    def admission(self, api_key: int) -> Admission:
        if self.phase is AuthPhase.AUTHENTICATED or api_key in PRE_AUTH_APIS:
            return Admission.ADMIT
        return Admission.CLOSE

    # -- SaslHandshake ----------------------------------------------------------------------

    def handshake(self, request: Any) -> ServerReply:
        mechanisms = tuple(m.wire_name for m in self.enabled)
        if self.phase is not AuthPhase.AWAITING_HANDSHAKE:
            return self._handshake_reply(request, ErrorCode.illegal_sasl_state, mechanisms)
        wanted = {m.wire_name: m for m in self.enabled}.get(str(request.mechanism))
        if wanted is None:
            # Kafka answers, then closes: the client may try another connection.
            return self._handshake_reply(
                request, ErrorCode.unsupported_sasl_mechanism, mechanisms, close=True
            )
        self._mechanism = wanted
        self.phase = AuthPhase.AWAITING_AUTHENTICATE
        return self._handshake_reply(request, ErrorCode.none, mechanisms)

    def _handshake_reply(
        self, request: Any, error: ErrorCode, mechanisms: tuple[str, ...], *, close: bool = False
    ) -> ServerReply:
        cls = response_type(int(ApiKey.SASL_HANDSHAKE), int(request.__version__))
        return ServerReply(cls(error_code=error, mechanisms=mechanisms), close=close)

    # -- SaslAuthenticate -------------------------------------------------------------------

    def authenticate(self, request: Any) -> ServerReply:
        if self.phase is not AuthPhase.AWAITING_AUTHENTICATE or self._mechanism is None:
            return self._authenticate_reply(
                request,
                ErrorCode.illegal_sasl_state,
                message=f"SaslAuthenticate while {self.phase.value}",
                close=True,
            )
        auth_bytes = bytes(request.auth_bytes)
        if self._mechanism is SaslMechanism.PLAIN:
            return self._plain(request, auth_bytes)
        return self._scram_step(request, auth_bytes)

    def _plain(self, request: Any, auth_bytes: bytes) -> ServerReply:
        parts = auth_bytes.split(PLAIN_SEPARATOR.encode())
        if len(parts) != 3:
            return self._failed(request)
        try:
            authzid, user, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError:
            return self._failed(request)
        if not user or (authzid and authzid != user):
            return self._failed(request)
        if not self.store.check_plain(user, password):
            return self._failed(request)
        return self._succeeded(request, user, b"")

    def _scram_step(self, request: Any, auth_bytes: bytes) -> ServerReply:
        assert self._mechanism is not None
        try:
            text = auth_bytes.decode("utf-8")
            if self._scram is None:
                self._scram = ScramMechanism(self._mechanism.wire_name).make_server(
                    self._auth_info, s_nonce=self._server_nonce
                )
                self._scram.set_client_first(text)
                return self._authenticate_reply(
                    request, ErrorCode.none, auth_bytes=self._scram.get_server_first().encode()
                )
            self._scram.set_client_final(text)
            final = self._scram.get_server_final().encode()
        except (ScramException, UnicodeDecodeError):
            return self._failed(request)
        if self._scram_decoy or self._scram_user is None:
            # Unreachable in practice: no proof matches a decoy. Refuse all the same.
            return self._failed(request)
        return self._succeeded(request, self._scram_user, final)

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        assert self._mechanism is not None
        self._scram_user = user
        credential = self.store.lookup(self._mechanism, user)
        if credential is None:
            self._scram_decoy = True
            credential = self.store.decoy(self._mechanism, user)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _succeeded(self, request: Any, user: str, auth_bytes: bytes) -> ServerReply:
        self.phase = AuthPhase.AUTHENTICATED
        self.principal = Principal(USER, user)
        reply = self._authenticate_reply(request, ErrorCode.none, auth_bytes=auth_bytes)
        return ServerReply(reply.body, principal=self.principal)

    def _failed(self, request: Any) -> ServerReply:
        self.phase = AuthPhase.FAILED
        return self._authenticate_reply(
            request, ErrorCode.sasl_authentication_failed, message=FAILED_MESSAGE, close=True
        )

    def _authenticate_reply(
        self,
        request: Any,
        error: ErrorCode,
        *,
        message: str | None = None,
        auth_bytes: bytes = b"",
        close: bool = False,
    ) -> ServerReply:
        version = int(request.__version__)
        cls = response_type(int(ApiKey.SASL_AUTHENTICATE), version)
        fields: dict[str, Any] = {
            "error_code": error,
            "error_message": message,
            "auth_bytes": auth_bytes,
        }
        if version >= 1:
            # 0 = the session does not expire (no connections.max.reauth.ms here).
            fields["session_lifetime"] = i64Timedelta.parse(_NO_SESSION_LIMIT)
        return ServerReply(cls(**fields), close=close)


# -- who may fetch as a follower ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FollowerPolicy:
    """Which principals may fetch as followers (privileged KIP-227 sessions, reads up to the
    log end), and as which replica ids."""

    follower_principals: frozenset[Principal]
    replica_ids: frozenset[int]

    def allowed_replica_ids(self, principal: Principal | None) -> frozenset[int]:
        """The `allowed_followers` for a connection's Fetch requests: the configured ids
        for a follower principal, none for anyone else (or an unauthenticated one)."""
        if principal is not None and principal in self.follower_principals:
            return self.replica_ids
        return frozenset()


# -- TLS, server side (contexts: replicad.config.tls) ---------------------------------------


def tls_principal(peer_certificate: Mapping[str, Any] | None) -> Principal:
    """Kafka's default principal for a TLS client: its subject DN (RFC 2253), or ANONYMOUS.

    `peer_certificate` is `SSLObject.getpeercert()` (a dict only for a verified certificate).
    """
    if not peer_certificate or not peer_certificate.get("subject"):
        return ANONYMOUS
    rdns = []
    # getpeercert lists RDNs in certificate order; RFC 2253 writes them last first.
    for rdn in reversed(peer_certificate["subject"]):
        parts = [f"{_DN_KEYWORDS.get(key, key)}={_dn_escape(value)}" for key, value in rdn]
        rdns.append("+".join(parts))
    return Principal(USER, ",".join(rdns))


def _dn_escape(value: str) -> str:
    escaped = "".join(f"\\{char}" if char in _DN_SPECIALS else char for char in value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


# -- what `replicad serve` asks of its connections ----------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """TLS, SASL and the follower policy of one listener, built once when serving starts.

    `followers` is None when connections do not authenticate: then the replica id alone
    decides who is a follower (the allowed_followers of the server).
    """

    tls: ssl.SSLContext | None = None
    mechanisms: tuple[SaslMechanism, ...] = ()
    store: CredentialStore | None = field(default=None, repr=False)
    client_auth: ClientAuth = ClientAuth.NONE
    followers: FollowerPolicy | None = None

    @classmethod
    def from_config(
        cls, config: ServeSecurityConfig, allowed_followers: Iterable[int]
    ) -> ServerSecurity:
        """From a validated `serve.security` section (files load; the passwords become
        salted SCRAM credentials here and are not kept)."""
        tls = None
        if config.tls.cert_file is not None:
            tls = server_tls_context(
                config.tls.cert_file,
                config.tls.key_file,
                ca_file=config.tls.ca_file,
                client_auth=config.tls.client_auth,
                key_password=config.tls.key_password,
            )
        store = None
        mechanisms = tuple(config.sasl.mechanisms)
        if mechanisms:
            users = config.sasl.users_file.as_mapping() if config.sasl.users_file else {}
            # PLAIN checks a password against a SCRAM credential, so it needs one too.
            scrams = tuple(m for m in mechanisms if m in SCRAM_HASHES) or (
                SaslMechanism.SCRAM_SHA_256,
            )
            store = CredentialStore.from_passwords(users, scrams)
        followers = None
        if config.authenticates:
            followers = FollowerPolicy(
                frozenset(Principal.parse(text) for text in config.follower_principals),
                frozenset(allowed_followers),
            )
        return cls(tls, mechanisms, store, config.tls.client_auth, followers)

    @property
    def protocol(self) -> str:
        """Kafka's name for the listener's security protocol, for logs."""
        if self.mechanisms:
            return "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"
        return "SSL" if self.tls is not None else "PLAINTEXT"

    def new_sasl(self) -> SaslServer | None:
        """The SASL state of a new connection (None: no SASL on this listener)."""
        if not self.mechanisms:
            return None
        assert self.store is not None
        return SaslServer(self.mechanisms, self.store)

    def may_follow(self, principal: Principal) -> bool:
        """Whether `principal` may fetch as a follower at all (its replica id is checked
        against the allowed followers afterwards)."""
        return self.followers is None or principal in self.followers.follower_principals
