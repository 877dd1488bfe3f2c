"""Server-side SASL and TLS helpers for `replicad serve` (replicad.leader.security): RFC 7677's
own example, kafka-python's SCRAM and PLAIN clients (written by others, for Kafka) against
the SASL server, the follower policy, and principals from a real TLS handshake."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import ssl
import threading
from pathlib import Path

import pytest
from kafka.net.sasl.plain import SaslMechanismPlain
from kafka.net.sasl.scram import ScramClient as KafkaPythonScramClient
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v0.request import (
    SaslAuthenticateRequest as SaslAuthenticateRequestV0,
)
from kio.schema.sasl_authenticate.v0.response import (
    SaslAuthenticateResponse as SaslAuthenticateResponseV0,
)
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeRequestV0
from kio.schema.sasl_handshake.v0.response import (
    SaslHandshakeResponse as SaslHandshakeResponseV0,
)
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from replicad.config.model import (
    SaslMechanism,
    SaslUsers,
    Secret,
    ServeSaslConfig,
    ServeSecurityConfig,
    ServeTlsConfig,
)
from replicad.config.tls import server_tls_context
from replicad.leader.security import (
    ANONYMOUS,
    FAILED_MESSAGE,
    Admission,
    AuthPhase,
    ClientAuth,
    CredentialStore,
    FollowerPolicy,
    Principal,
    SaslServer,
    ScramCredential,
    ServerSecurity,
    tls_principal,
)
from replicad.protocol.apis import ApiKey
from tools.peers.pki import Pki, make_test_pki

PASSWORD = "alice-Secret-1"
SCRAMS = (SaslMechanism.SCRAM_SHA_256, SaslMechanism.SCRAM_SHA_512)


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    return CredentialStore.from_passwords({"alice": Secret("test", PASSWORD), "bob": "bob-pw"})


def server(store: CredentialStore, *mechanisms: SaslMechanism) -> SaslServer:
    sasl = SaslServer(mechanisms or tuple(SaslMechanism), store)
    reply = sasl.handshake(SaslHandshakeRequest(mechanism=(mechanisms or SCRAMS)[0].wire_name))
    assert reply.body.error_code == ErrorCode.none and not reply.close
    return sasl


def authenticate(sasl: SaslServer, auth_bytes: bytes):  # -> ServerReply
    return sasl.authenticate(SaslAuthenticateRequest(auth_bytes=auth_bytes))


# -- the order of things ------------------------------------------------------------------------


def test_only_sasl_and_api_versions_before_authentication(store: CredentialStore) -> None:
    sasl = SaslServer([SaslMechanism.PLAIN], store)
    for api in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
        assert sasl.admission(api) is Admission.ADMIT
    for api in (ApiKey.METADATA, ApiKey.FETCH, ApiKey.LIST_OFFSETS):
        assert sasl.admission(api) is Admission.CLOSE
    sasl.handshake(SaslHandshakeRequest(mechanism="PLAIN"))
    assert sasl.admission(ApiKey.FETCH) is Admission.CLOSE
    reply = authenticate(sasl, f"\0alice\0{PASSWORD}".encode())
    assert reply.principal == Principal("User", "alice") == sasl.principal
    assert sasl.admission(ApiKey.FETCH) is Admission.ADMIT
    # No re-authentication here: a second handshake is out of order.
    again = sasl.handshake(SaslHandshakeRequest(mechanism="PLAIN"))
    assert again.body.error_code == ErrorCode.illegal_sasl_state


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones(store: CredentialStore) -> None:
    sasl = SaslServer(SCRAMS, store)
    reply = sasl.handshake(SaslHandshakeRequest(mechanism="PLAIN"))
    assert reply.body.error_code == ErrorCode.unsupported_sasl_mechanism
    assert reply.body.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert reply.close
    assert sasl.phase is AuthPhase.AWAITING_HANDSHAKE


def test_authenticate_before_handshake_is_out_of_order(store: CredentialStore) -> None:
    reply = SaslServer(SCRAMS, store).authenticate(SaslAuthenticateRequest(auth_bytes=b"x"))
    assert reply.body.error_code == ErrorCode.illegal_sasl_state and reply.close


def test_answers_come_in_the_requests_version(store: CredentialStore) -> None:
    sasl = SaslServer([SaslMechanism.PLAIN], store)
    handshake = sasl.handshake(SaslHandshakeRequestV0(mechanism="PLAIN"))
    assert isinstance(handshake.body, SaslHandshakeResponseV0)
    reply = sasl.authenticate(SaslAuthenticateRequestV0(auth_bytes=f"\0alice\0{PASSWORD}".encode()))
    assert isinstance(reply.body, SaslAuthenticateResponseV0)
    assert reply.body.error_code == ErrorCode.none


# -- PLAIN ----------------------------------------------------------------------------------------


def kafka_python_plain(user: str, password: str) -> bytes:
    mechanism = SaslMechanismPlain(
        sasl_plain_username=user, sasl_plain_password=password, security_protocol="SASL_SSL"
    )
    return bytes(mechanism.auth_bytes())


def test_plain_from_kafka_python(store: CredentialStore) -> None:
    sasl = server(store, SaslMechanism.PLAIN)
    reply = authenticate(sasl, kafka_python_plain("alice", PASSWORD))
    assert reply.body.error_code == ErrorCode.none and reply.principal is not None
    assert str(reply.principal) == "User:alice"


@pytest.mark.parametrize(
    "auth_bytes",
    [
        b"\0alice\0wrong",
        b"\0carol\0" + PASSWORD.encode(),  # no such user
        b"bob\0alice\0" + PASSWORD.encode(),  # acting as another user
        b"\0alice",  # malformed
        b"\0\xff\xfe\0x",  # not UTF-8
        b"\0\0" + PASSWORD.encode(),  # no user
    ],
)
def test_plain_refusals_look_alike_and_close(store: CredentialStore, auth_bytes: bytes) -> None:
    sasl = server(store, SaslMechanism.PLAIN)
    reply = authenticate(sasl, auth_bytes)
    assert reply.body.error_code == ErrorCode.sasl_authentication_failed
    assert reply.body.error_message == FAILED_MESSAGE
    assert reply.close and reply.principal is None and sasl.principal is None
    assert sasl.admission(ApiKey.FETCH) is Admission.CLOSE


# -- SCRAM ----------------------------------------------------------------------------------------


def scram_with_kafka_python(
    store: CredentialStore, mechanism: SaslMechanism, user: str, password: str
) -> tuple[SaslServer, list[object]]:
    """kafka-python's SCRAM client against the server; the replies, in order."""
    sasl = server(store, mechanism)
    client = KafkaPythonScramClient(user, password, mechanism.wire_name)
    first = authenticate(sasl, client.first_message())
    replies: list[object] = [first]
    if first.body.error_code != ErrorCode.none:
        return sasl, replies
    client.process_server_first_message(first.body.auth_bytes)
    final = authenticate(sasl, client.final_message())
    replies.append(final)
    if final.body.error_code == ErrorCode.none:
        # Raises unless the server proved it holds the credential.
        client.process_server_final_message(final.body.auth_bytes)
    return sasl, replies


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_from_kafka_python(store: CredentialStore, mechanism: SaslMechanism) -> None:
    sasl, replies = scram_with_kafka_python(store, mechanism, "alice", PASSWORD)
    assert [r.body.error_code for r in replies] == [ErrorCode.none, ErrorCode.none]
    assert replies[-1].principal == Principal("User", "alice")
    assert sasl.phase is AuthPhase.AUTHENTICATED


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_wrong_password_and_unknown_user_fail_alike(
    store: CredentialStore, mechanism: SaslMechanism
) -> None:
    outcomes = []
    for user, password in (("alice", "wrong"), ("carol", "wrong")):
        sasl, replies = scram_with_kafka_python(store, mechanism, user, password)
        # Both get a server-first (an unknown name is not given away there) ...
        assert len(replies) == 2 and replies[0].body.error_code == ErrorCode.none
        # ... and the same refusal at the proof.
        final = replies[1]
        outcomes.append((final.body.error_code, final.body.error_message, final.close))
        assert sasl.principal is None
    assert (
        outcomes[0]
        == outcomes[1]
        == (
            ErrorCode.sasl_authentication_failed,
            FAILED_MESSAGE,
            True,
        )
    )


def test_an_unknown_users_salt_is_stable(store: CredentialStore) -> None:
    def salt_for(user: str) -> str:
        sasl = server(store, SaslMechanism.SCRAM_SHA_256)
        first = authenticate(sasl, f"n,,n={user},r=abcdefgh".encode())
        attributes = dict(p.split("=", 1) for p in first.body.auth_bytes.decode().split(","))
        return attributes["s"]

    assert salt_for("carol") == salt_for("carol") != salt_for("dave")


def test_garbage_scram_messages_are_refusals(store: CredentialStore) -> None:
    for garbage in (b"hello", b"\xff", b"n,,n=alice", b"p=x,,n=alice,r=abc"):
        sasl = server(store, SaslMechanism.SCRAM_SHA_512)
        reply = authenticate(sasl, garbage)
        assert reply.body.error_code == ErrorCode.sasl_authentication_failed and reply.close


def test_scram_server_matches_rfc_7677s_example() -> None:
    # RFC 7677 section 3: user "user", password "pencil", this salt, 4096 iterations.
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = ScramCredential.from_password(
        SaslMechanism.SCRAM_SHA_256, "pencil", iterations=4096, salt=salt
    )
    assert "pencil" not in repr(credential) and str(salt) not in repr(credential)
    assert credential.matches(SaslMechanism.SCRAM_SHA_256, "pencil")
    assert not credential.matches(SaslMechanism.SCRAM_SHA_256, "pencil2")
    store = CredentialStore({(SaslMechanism.SCRAM_SHA_256, "user"): credential})
    sasl = SaslServer(
        [SaslMechanism.SCRAM_SHA_256], store, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    sasl.handshake(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    first = authenticate(sasl, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first.body.auth_bytes == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = authenticate(
        sasl,
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    )
    assert final.body.auth_bytes == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert final.principal == Principal("User", "user")


def test_the_store_keeps_no_password(store: CredentialStore) -> None:
    assert store.users() == {"alice", "bob"}
    for mechanism in SCRAMS:
        credential = store.lookup(mechanism, "alice")
        assert credential is not None
        assert PASSWORD.encode() not in credential.salt + credential.stored_key
        assert credential.matches(mechanism, PASSWORD)
    assert store.lookup(SaslMechanism.SCRAM_SHA_256, "carol") is None
    assert store.check_plain("bob", "bob-pw") and not store.check_plain("bob", "alice-Secret-1")


# -- followers ---------------------------------------------------------------------------------


def test_only_follower_principals_may_fetch_as_replicas() -> None:
    policy = FollowerPolicy(
        follower_principals=frozenset({Principal.parse("User:replicad-east")}),
        replica_ids=frozenset({1, 2}),
    )
    assert policy.allowed_replica_ids(Principal("User", "replicad-east")) == {1, 2}
    assert policy.allowed_replica_ids(Principal("User", "alice")) == frozenset()
    assert policy.allowed_replica_ids(ANONYMOUS) == frozenset()
    assert policy.allowed_replica_ids(None) == frozenset()
    with pytest.raises(ValueError, match="Type:name"):
        Principal.parse("replicad-east")


# -- TLS principals -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def peer_certificate_after_handshake(pki: Pki, client_auth: ClientAuth, with_cert: bool) -> object:
    """What the server side of a real TLS handshake sees of the client (getpeercert())."""
    server_context = server_tls_context(
        pki.broker_cert, pki.broker_key, ca_file=pki.ca, client_auth=client_auth
    )
    client_context = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        client_context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[object] = []

    def serve() -> None:
        sock, _ = listener.accept()
        with server_context.wrap_socket(sock, server_side=True) as tls:
            seen.append(tls.getpeercert())
            tls.sendall(b"k")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=5) as raw,
            client_context.wrap_socket(raw, server_hostname="kafka.test") as tls,
        ):
            assert tls.recv(1) == b"k"
        thread.join(5)
    finally:
        listener.close()
    return seen[0]


def test_a_client_certificate_is_its_subject_dn_as_kafka_writes_it(pki: Pki) -> None:
    seen = peer_certificate_after_handshake(pki, ClientAuth.REQUIRED, with_cert=True)
    assert tls_principal(seen) == Principal("User", pki.client_dn)
    assert str(tls_principal(seen)) == "User:CN=replicad-follower,O=replicad tests"


def test_no_client_certificate_is_anonymous(pki: Pki) -> None:
    seen = peer_certificate_after_handshake(pki, ClientAuth.REQUESTED, with_cert=False)
    assert tls_principal(seen) is ANONYMOUS
    assert tls_principal(None) is ANONYMOUS


def test_dn_special_characters_are_escaped() -> None:
    subject = (
        (("countryName", "NL"),),
        (("organizationName", "Acme, Inc."),),
        (("commonName", "#follower "), ("userId", 'a+b"c')),
    )
    assert str(tls_principal({"subject": subject})) == (
        'User:CN=\\#follower\\ +UID=a\\+b\\"c,O=Acme\\, Inc.,C=NL'
    )


def test_server_tls_context_needs_a_ca_to_check_clients(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ca_file"):
        server_tls_context(pki.broker_cert, pki.broker_key, client_auth=ClientAuth.REQUIRED)
    context = server_tls_context(pki.broker_cert, pki.broker_key)
    assert context.verify_mode is ssl.CERT_NONE
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


# -- ServerSecurity: one listener's settings from serve.security ---------------------------------


def serve_security_config(**sections: object) -> ServeSecurityConfig:
    tls = sections.get("tls", ServeTlsConfig())
    sasl = sections.get("sasl", ServeSaslConfig())
    principals = sections.get("follower_principals", ())
    assert isinstance(tls, ServeTlsConfig) and isinstance(sasl, ServeSaslConfig)
    assert isinstance(principals, tuple)
    return ServeSecurityConfig(tls, sasl, principals)


def users(**passwords: str) -> SaslUsers:
    return SaslUsers("test", tuple((u, Secret("test", p)) for u, p in passwords.items()))


def test_a_plain_only_listener_still_checks_passwords() -> None:
    # PLAIN keeps no password either: it is checked against a SCRAM credential made for it.
    config = serve_security_config(
        sasl=ServeSaslConfig((SaslMechanism.PLAIN,), users(alice=PASSWORD))
    )
    security = ServerSecurity.from_config(config, ())
    assert security.protocol == "SASL_PLAINTEXT" and security.tls is None
    for password, principal in ((PASSWORD, Principal("User", "alice")), ("nope", None)):
        sasl = security.new_sasl()
        assert sasl is not None
        sasl.handshake(SaslHandshakeRequest(mechanism="PLAIN"))
        reply = authenticate(sasl, kafka_python_plain("alice", password))
        assert reply.principal == principal
    assert PASSWORD not in repr(security)


def test_followers_are_checked_only_when_connections_authenticate(pki: Pki) -> None:
    open_listener = ServerSecurity.from_config(
        serve_security_config(tls=ServeTlsConfig(pki.broker_cert, pki.broker_key)), {7}
    )
    assert open_listener.protocol == "SSL" and open_listener.new_sasl() is None
    assert open_listener.followers is None and open_listener.may_follow(ANONYMOUS)

    mutual = ServerSecurity.from_config(
        serve_security_config(
            tls=ServeTlsConfig(
                pki.broker_cert, pki.broker_key, ca_file=pki.ca, client_auth=ClientAuth.REQUIRED
            ),
            follower_principals=(f"User:{pki.client_dn}",),
        ),
        {7},
    )
    assert mutual.tls is not None and mutual.tls.verify_mode == ssl.CERT_REQUIRED
    client = Principal.parse(f"User:{pki.client_dn}")
    assert mutual.may_follow(client) and not mutual.may_follow(ANONYMOUS)
    assert mutual.followers is not None
    assert mutual.followers.allowed_replica_ids(client) == {7}
    assert mutual.followers.allowed_replica_ids(Principal("User", "other")) == frozenset()


def scram_client_final(
    client_first_bare: str, server_first: str, nonce: str, password: str
) -> bytes:
    """RFC 5802's client-final-message for `nonce`, its proof computed over exactly that."""
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, hashlib.sha256)
    proof = bytes(a ^ b for a, b in zip(client_key, signature.digest(), strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


@pytest.mark.parametrize("repeat_client_nonce", [False, True])
def test_scram_nonce_must_be_exactly_the_servers(
    store: CredentialStore, repeat_client_nonce: bool
) -> None:
    # librdkafka before 2.6.1 (Debian's kcat links 2.0.2) sends the client nonce twice in
    # client-final; Kafka 4 refuses that (RFC 5802, the CVE-2024-56128 fix), and so do we.
    client_nonce = "fyko+d2lbbFgONRv9qkxdawL"
    client_first_bare = f"n=alice,r={client_nonce}"
    sasl = server(store, SaslMechanism.SCRAM_SHA_256)
    first = authenticate(sasl, f"n,,{client_first_bare}".encode())
    server_first = bytes(first.body.auth_bytes).decode()
    combined = dict(part.split("=", 1) for part in server_first.split(","))["r"]
    nonce = client_nonce + combined if repeat_client_nonce else combined
    final = authenticate(sasl, scram_client_final(client_first_bare, server_first, nonce, PASSWORD))
    if repeat_client_nonce:
        assert final.body.error_code == ErrorCode.sasl_authentication_failed and final.close
    else:
        assert final.body.error_code == ErrorCode.none and final.principal is not None
