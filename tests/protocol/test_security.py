"""Client-side TLS and SASL (replicad.protocol.security): the source.security config and its
secrets, the SASL exchange as a state machine (RFC 7677's own example, replicad's SASL
server, kafka-python's view of the wire), and what a TLS failure says -- against stand-in
TLS servers made with a throw-away CA. The real Kafka broker is in
tests/follower/test_replication_sasl.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import socket
import ssl
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v0.request import (
    SaslAuthenticateRequest as SaslAuthenticateRequestV0,
)
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.static.primitive import i64Timedelta

from replicad.config import load_config
from replicad.config.model import (
    SaslConfig,
    SaslMechanism,
    Secret,
    SecurityConfig,
    SecurityProtocol,
    TlsConfig,
)
from replicad.config.tls import client_tls_context, server_tls_context
from replicad.errors import AuthenticationError, ConfigErrors, KafkaConnectionError
from replicad.leader.security import (
    ClientAuth,
    CredentialStore,
    SaslServer,
)
from replicad.protocol.apis import ApiKey, NegotiatedVersions
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.security import (
    PLAINTEXT,
    SaslClient,
    SaslCredentials,
    SaslPhase,
    connection_security,
)
from tools.peers.pki import Pki, make_test_pki

PASSWORD = "s3cret-Passw0rd"
SASL_VERSIONS = NegotiatedVersions(
    {int(ApiKey.SASL_HANDSHAKE): 1, int(ApiKey.SASL_AUTHENTICATE): 2}
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    return [str(problem) for problem in caught.value.problems]


# -- the config: secrets ----------------------------------------------------------------------


def test_sasl_ssl_config_reads_the_password_file_and_never_shows_it(
    tmp_path: Path, pki: Pki
) -> None:
    secret_file = tmp_path / "password"
    secret_file.write_text(PASSWORD + "\n")
    path = _source_security(
        tmp_path,
        f"""\
        protocol: SASL_SSL
        tls: {{ca_file: {pki.ca}}}
        sasl: {{mechanism: SCRAM-SHA-256, username: alice, password_file: {secret_file}}}
        """,
    )
    config = load_config(path)
    security = config.source.security
    assert security.protocol is SecurityProtocol.SASL_SSL
    assert security.sasl.mechanism is SaslMechanism.SCRAM_SHA_256
    assert security.sasl.password is not None
    # The trailing newline of `echo ... > file` is not part of the password.
    assert security.sasl.password.reveal() == PASSWORD
    for shown in (repr(config), str(config), repr(security.sasl), str(security.sasl.password)):
        assert PASSWORD not in shown
    assert f"file {secret_file}" in repr(security.sasl.password)


def test_password_env_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLICAD_TEST_SASL_PASSWORD", PASSWORD)
    path = _source_security(
        tmp_path,
        """\
        protocol: sasl_plaintext
        sasl: {username: alice, password_env: REPLICAD_TEST_SASL_PASSWORD}
        """,
    )
    config = load_config(path)
    password = config.source.security.sasl.password
    assert password is not None and password.reveal() == PASSWORD
    assert PASSWORD not in repr(config)


def _source_security(tmp_path: Path, body: str) -> Path:
    """A config file whose source section has `body` (YAML, any indent) as its security."""
    indented = textwrap.indent(textwrap.dedent(body), "    ")
    path = tmp_path / "replicad.yaml"
    path.write_text(
        "source:\n  bootstrap_servers: k1:9093\n  security:\n"
        + indented
        + "topics:\n  include: [orders]\n"
    )
    return path


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        # The user wrote the password where the variable's name belongs.
        ("password_env", "Hunter2_secret", "the environment variable it names is not set"),
        ("password_env", "hunter2 with spaces!", "expected the name of an environment variable"),
        ("password_file", "Hunter2_secret", "cannot read the file it names"),
        ("password_file", 987654321, "expected the path of a file holding the password"),
    ],
)
def test_a_bad_secret_setting_never_repeats_its_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: object, expected: str
) -> None:
    monkeypatch.delenv("Hunter2_secret", raising=False)
    monkeypatch.chdir(tmp_path)
    shown = value if isinstance(value, int) else f'"{value}"'
    path = _source_security(
        tmp_path, f"protocol: sasl_ssl\nsasl: {{username: alice, {key}: {shown}}}\n"
    )
    [problem] = problems_of(path)
    assert f"source.security.sasl.{key}:" in problem
    assert expected in problem
    assert str(value) not in problem
    assert str(value).lower() not in problem.lower()


def test_an_empty_secret_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("EMPTY_PASSWORD", "")
    path = _source_security(
        tmp_path,
        f"""\
        protocol: sasl_ssl
        sasl: {{username: alice, password_file: {tmp_path / "empty"}}}
        """,
    )
    assert problems_of(path) == [
        f"{path}:5: source.security.sasl.password_file: the file it names is empty"
    ]
    path = _source_security(
        tmp_path, "protocol: sasl_ssl\nsasl: {username: alice, password_env: EMPTY_PASSWORD}\n"
    )
    assert problems_of(path) == [
        f"{path}:5: source.security.sasl.password_env: the environment variable it names is empty"
    ]


# -- the config: what goes with what ----------------------------------------------------------


def test_sasl_settings_without_a_sasl_protocol_are_pointed_out(tmp_path: Path) -> None:
    path = _source_security(tmp_path, "protocol: ssl\nsasl: {username: alice}\n")
    [problem] = problems_of(path)
    assert "source.security.sasl.username: is set, but source.security.protocol is ssl" in problem
    assert "sasl_ssl" in problem


def test_tls_settings_without_a_tls_protocol_are_pointed_out(tmp_path: Path, pki: Pki) -> None:
    path = _source_security(tmp_path, f"tls: {{ca_file: {pki.ca}}}\n")
    [problem] = problems_of(path)
    assert "source.security.tls.ca_file: is set, but source.security.protocol is plaintext" in (
        problem
    )


def test_sasl_needs_a_username_and_exactly_one_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _source_security(tmp_path, "protocol: sasl_ssl\n")
    assert [p.split(": ", 1)[1] for p in problems_of(path)] == [
        "source.security.sasl.username: required when source.security.protocol is sasl_ssl",
        "source.security.sasl.password_file: give password_file or password_env when "
        "source.security.protocol is sasl_ssl",
    ]
    monkeypatch.setenv("SASL_PASSWORD", PASSWORD)
    (tmp_path / "pw").write_text(PASSWORD)
    path = _source_security(
        tmp_path,
        f"""\
        protocol: sasl_ssl
        sasl: {{username: a, password_env: SASL_PASSWORD, password_file: {tmp_path / "pw"}}}
        """,
    )
    [problem] = problems_of(path)
    assert "give only one of password_file and password_env" in problem


def test_a_key_needs_its_certificate(tmp_path: Path, pki: Pki) -> None:
    path = _source_security(tmp_path, f"protocol: ssl\ntls: {{key_file: {pki.client_key}}}\n")
    [problem] = problems_of(path)
    assert "source.security.tls.key_file: needs source.security.tls.cert_file" in problem


def test_tls_files_that_do_not_load_are_config_errors(tmp_path: Path, pki: Pki) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    cases = {
        f"tls: {{ca_file: {not_pem}}}": "source.security.tls.ca_file: ",
        f"tls: {{ca_file: {tmp_path / 'missing.pem'}}}": "source.security.tls.ca_file: cannot read",
        # An encrypted key and no password: said so, and no terminal prompt.
        f"tls: {{cert_file: {pki.client_cert}, key_file: {pki.client_key_encrypted}}}": (
            "the private key is encrypted: give key_password_file or key_password_env"
        ),
        f"tls: {{cert_file: {pki.client_cert}, key_file: {pki.stranger_key}}}": (
            "source.security.tls.cert_file: cannot load the client certificate and its key"
        ),
    }
    for body, expected in cases.items():
        [problem] = problems_of(_source_security(tmp_path, f"protocol: ssl\n{body}\n"))
        assert expected in problem, body


def test_a_wrong_key_password_is_named_and_not_shown(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_PASSWORD", "not-the-key-password")
    path = _source_security(
        tmp_path,
        f"""\
        protocol: ssl
        tls:
          cert_file: {pki.client_cert}
          key_file: {pki.client_key_encrypted}
          key_password_env: KEY_PASSWORD
        """,
    )
    [problem] = problems_of(path)
    assert "the key password does not decrypt the private key" in problem
    assert "not-the-key-password" not in problem


def test_kafka_setting_names_point_at_replicads(tmp_path: Path) -> None:
    path = tmp_path / "replicad.yaml"
    path.write_text(
        "source:\n  bootstrap_servers: k1:9093\n  security.protocol: SASL_SSL\n"
        "topics:\n  include: [orders]\n"
    )
    [problem] = problems_of(path)
    assert "Kafka's security.protocol is source.security.protocol here" in problem


# -- from the config to a connection's settings ----------------------------------------------


def test_plaintext_is_the_default() -> None:
    assert connection_security(SecurityConfig()) == PLAINTEXT
    assert PLAINTEXT.open_options("k1", 10) == {}


def test_tls_verifies_chain_and_name_by_default(pki: Pki) -> None:
    security = connection_security(SecurityConfig(SecurityProtocol.SSL, TlsConfig(ca_file=pki.ca)))
    assert security.tls is not None and security.sasl is None
    assert security.tls.verify_mode is ssl.CERT_REQUIRED
    assert security.tls.check_hostname
    assert security.tls.minimum_version is ssl.TLSVersion.TLSv1_2
    assert not security.client_certificate
    options = security.open_options("k1", 10)
    assert options["ssl"] is security.tls and options["server_hostname"] == "k1"
    named = connection_security(
        SecurityConfig(
            SecurityProtocol.SSL, TlsConfig(ca_file=pki.ca, server_hostname="kafka.test")
        )
    )
    assert named.open_options("127.0.0.1", 10)["server_hostname"] == "kafka.test"


def test_weakened_security_is_said_once_at_start(pki: Pki) -> None:
    with structlog.testing.capture_logs() as said:
        security = connection_security(
            SecurityConfig(SecurityProtocol.SSL, TlsConfig(ca_file=pki.ca, verify=False))
        )
        connection_security(
            SecurityConfig(
                SecurityProtocol.SASL_PLAINTEXT,
                sasl=SaslConfig(SaslMechanism.PLAIN, "alice", password_env=_secret()),
            )
        )
    assert security.tls is not None and security.tls.verify_mode is ssl.CERT_NONE
    assert not security.tls.check_hostname
    events = [entry["event"] for entry in said]
    assert len(events) == 2 and all(entry["log_level"] == "warning" for entry in said)
    assert "TLS certificate verification is off" in events[0]
    assert "SASL PLAIN without TLS sends the password in clear text" in events[1]


def test_sasl_credentials_keep_the_password_hidden() -> None:
    security = connection_security(
        SecurityConfig(
            SecurityProtocol.SASL_PLAINTEXT,
            sasl=SaslConfig(SaslMechanism.SCRAM_SHA_512, "alice", password_env=_secret()),
        )
    )
    assert security.sasl == SaslCredentials(SaslMechanism.SCRAM_SHA_512, "alice", _secret())
    assert PASSWORD not in repr(security)


def _secret(text: str = PASSWORD) -> Secret:
    return Secret("test", text)


# -- the SASL exchange ----------------------------------------------------------------------


def handshake_ok(*mechanisms: str) -> SaslHandshakeResponse:
    return SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=mechanisms)


def authenticated(auth_bytes: bytes = b"", lifetime_ms: int = 0) -> SaslAuthenticateResponse:
    return SaslAuthenticateResponse(
        error_code=ErrorCode.none,
        error_message=None,
        auth_bytes=auth_bytes,
        session_lifetime=i64Timedelta.parse(datetime.timedelta(milliseconds=lifetime_ms)),
    )


def test_plain_is_one_round_of_authzid_user_password() -> None:
    client = SaslClient(
        SaslCredentials(SaslMechanism.PLAIN, "alice", _secret()), SASL_VERSIONS, broker="b1"
    )
    assert client.start() == SaslHandshakeRequest(mechanism="PLAIN")
    step = client.receive(handshake_ok("PLAIN", "SCRAM-SHA-512"))
    assert step.request == SaslAuthenticateRequest(auth_bytes=f"\0alice\0{PASSWORD}".encode())
    done = client.receive(authenticated(lifetime_ms=3_600_000))
    assert done.request is None and done.session_lifetime_ms == 3_600_000
    assert client.phase is SaslPhase.DONE
    with pytest.raises(AuthenticationError, match="already done"):
        client.receive(authenticated())


def test_the_authenticate_version_follows_the_broker() -> None:
    versions = NegotiatedVersions({int(ApiKey.SASL_HANDSHAKE): 1, int(ApiKey.SASL_AUTHENTICATE): 0})
    client = SaslClient(
        SaslCredentials(SaslMechanism.PLAIN, "alice", _secret()), versions, broker="b1"
    )
    client.start()
    assert isinstance(client.receive(handshake_ok("PLAIN")).request, SaslAuthenticateRequestV0)


def test_a_broker_without_sasl_handshake_v1_is_refused() -> None:
    with pytest.raises(AuthenticationError, match="offers no SaslHandshake v1"):
        SaslClient(
            SaslCredentials(SaslMechanism.PLAIN, "alice", _secret()),
            NegotiatedVersions({int(ApiKey.SASL_AUTHENTICATE): 2}),
            broker="b1",
        )


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            SaslHandshakeResponse(
                error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=("PLAIN",)
            ),
            r"b1 does not enable SASL mechanism SCRAM-SHA-512 \(it offers: PLAIN\); "
            r"set source.security.sasl.mechanism",
        ),
        (
            SaslHandshakeResponse(error_code=ErrorCode.illegal_sasl_state, mechanisms=()),
            "b1 does not expect SASL on this port: check source.security.protocol",
        ),
    ],
)
def test_handshake_refusals_say_what_to_change(response: object, expected: str) -> None:
    client = SaslClient(
        SaslCredentials(SaslMechanism.SCRAM_SHA_512, "alice", _secret()),
        SASL_VERSIONS,
        broker="b1",
    )
    client.start()
    with pytest.raises(AuthenticationError, match=expected):
        client.receive(response)
    assert client.phase is SaslPhase.FAILED


def test_a_refused_password_names_user_and_mechanism_but_not_the_password() -> None:
    client = SaslClient(
        SaslCredentials(SaslMechanism.PLAIN, "alice", _secret()), SASL_VERSIONS, broker="b1"
    )
    client.start()
    client.receive(handshake_ok("PLAIN"))
    with pytest.raises(AuthenticationError) as caught:
        client.receive(
            SaslAuthenticateResponse(
                error_code=ErrorCode.sasl_authentication_failed,
                error_message="Authentication failed: Invalid username or password",
                auth_bytes=b"",
            )
        )
    text = str(caught.value)
    assert "b1 refused PLAIN authentication as 'alice' (sasl_authentication_failed)" in text
    assert "Invalid username or password" in text
    assert PASSWORD not in text


# RFC 7677 section 3: the SCRAM-SHA-256 exchange of user "user" with password "pencil".
RFC7677_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_FIRST = (
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC7677_CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc7677_client() -> SaslClient:
    client = SaslClient(
        SaslCredentials(SaslMechanism.SCRAM_SHA_256, "user", _secret("pencil")),
        SASL_VERSIONS,
        broker="b1",
        nonce=RFC7677_CLIENT_NONCE,
    )
    client.start()
    first = client.receive(handshake_ok("SCRAM-SHA-256")).request
    assert first.auth_bytes == b"n,,n=user,r=" + RFC7677_CLIENT_NONCE.encode()
    final = client.receive(authenticated(RFC7677_SERVER_FIRST.encode())).request
    assert final.auth_bytes == RFC7677_CLIENT_FINAL.encode()
    return client


def test_scram_sha_256_matches_rfc_7677s_example() -> None:
    client = rfc7677_client()
    done = client.receive(authenticated(RFC7677_SERVER_FINAL.encode()))
    assert done.request is None and client.phase is SaslPhase.DONE


def test_a_broker_that_cannot_prove_it_knows_the_credential_is_refused() -> None:
    client = rfc7677_client()
    forged = "v=" + base64.b64encode(b"\0" * 32).decode()
    with pytest.raises(AuthenticationError, match="SCRAM-SHA-256 answer is refused"):
        client.receive(authenticated(forged.encode()))
    assert client.phase is SaslPhase.FAILED


def test_garbage_from_the_broker_is_a_refusal_not_a_crash() -> None:
    for garbage in (b"\xff\xfe", b"r=not-our-nonce,s=AAAA,i=4096", b"nonsense"):
        broken = SaslClient(
            SaslCredentials(SaslMechanism.SCRAM_SHA_512, "alice", _secret()),
            SASL_VERSIONS,
            broker="b1",
        )
        broken.start()
        broken.receive(handshake_ok("SCRAM-SHA-512"))
        with pytest.raises(AuthenticationError, match="answer is refused"):
            broken.receive(authenticated(garbage))


def test_a_password_that_saslprep_would_change_is_refused_up_front() -> None:
    # U+00A0 (no-break space) becomes a plain space under SASLprep; Kafka hashes it as is.
    with pytest.raises(AuthenticationError, match="changes under SASLprep"):
        SaslClient(
            SaslCredentials(SaslMechanism.SCRAM_SHA_256, "alice", _secret("pass\u00a0word")),
            SASL_VERSIONS,
            broker="b1",
        )


def run_exchange(client: SaslClient, server: SaslServer) -> object:
    """Drive a client against a server in memory, as the two connections would."""
    request = client.start()
    while request is not None:
        if isinstance(request, SaslHandshakeRequest):
            reply = server.handshake(request)
        else:
            reply = server.authenticate(request)
        request = client.receive(reply.body).request
    return server.principal


@pytest.mark.parametrize("mechanism", list(SaslMechanism))
def test_client_and_replicads_server_agree(mechanism: SaslMechanism) -> None:
    store = CredentialStore.from_passwords({"alice": PASSWORD})
    server = SaslServer(list(SaslMechanism), store)
    client = SaslClient(SaslCredentials(mechanism, "alice", _secret()), SASL_VERSIONS, broker="b")
    assert str(run_exchange(client, server)) == "User:alice"
    wrong = SaslClient(
        SaslCredentials(mechanism, "alice", _secret("wrong")), SASL_VERSIONS, broker="b"
    )
    with pytest.raises(AuthenticationError, match="sasl_authentication_failed"):
        run_exchange(wrong, SaslServer(list(SaslMechanism), store))


# -- TLS failures, against stand-in TLS servers ------------------------------------------------


@contextlib.contextmanager
def tls_server(context: ssl.SSLContext) -> Iterator[int]:
    """A TLS server on 127.0.0.1 (blocking OpenSSL in a thread, which sends TLS alerts as
    a real server does) that completes handshakes and then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(5)
            with contextlib.suppress(OSError), context.wrap_socket(sock, server_side=True) as tls:
                tls.recv(1)
            sock.close()

    thread = threading.Thread(target=serve, name="tls-standin", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


async def connect_error(port: int, tls: TlsConfig) -> KafkaConnectionError:
    security = connection_security(SecurityConfig(SecurityProtocol.SSL, tls))
    conn = BrokerConnection(
        BrokerAddress(-1, "127.0.0.1", port),
        client_id="test",
        connect_timeout_s=5,
        request_timeout_s=5,
        security=security,
    )
    with pytest.raises(KafkaConnectionError) as caught:
        await conn.connect()
    assert not conn.is_open
    return caught.value


async def test_an_untrusted_ca_is_refused_with_a_pointer_to_ca_file(pki: Pki) -> None:
    with tls_server(server_tls_context(pki.broker_cert, pki.broker_key)) as port:
        error = await connect_error(port, TlsConfig(ca_file=pki.other_ca))
    assert isinstance(error, AuthenticationError)
    assert "presented a certificate we refuse" in str(error)
    assert "not signed by a CA we trust (source.security.tls.ca_file)" in str(error)


async def test_a_certificate_for_another_name_is_refused_unless_that_name_is_expected(
    pki: Pki,
) -> None:
    with tls_server(server_tls_context(pki.broker_cert, pki.broker_key)) as port:
        error = await connect_error(port, TlsConfig(ca_file=pki.ca, server_hostname="other.test"))
        assert "Hostname mismatch" in str(error)
        assert "source.security.tls.server_hostname" in str(error)
        # Expecting the certificate's own name (or not checking names) gets past TLS; the
        # stand-in then hangs up, which is an ordinary connection error.
        for tls in (
            TlsConfig(ca_file=pki.ca, server_hostname="kafka.test"),
            TlsConfig(ca_file=pki.ca, server_hostname="other.test", check_hostname=False),
        ):
            error = await connect_error(port, tls)
            assert not isinstance(error, AuthenticationError), error
            assert "closed the connection" in str(error)


async def test_a_broker_that_requires_a_client_certificate_says_so(pki: Pki) -> None:
    context = server_tls_context(
        pki.broker_cert, pki.broker_key, ca_file=pki.ca, client_auth=ClientAuth.REQUIRED
    )
    with tls_server(context) as port:
        missing = await connect_error(port, TlsConfig(ca_file=pki.ca))
        stranger = await connect_error(
            port,
            TlsConfig(ca_file=pki.ca, cert_file=pki.stranger_cert, key_file=pki.stranger_key),
        )
    assert isinstance(missing, AuthenticationError)
    assert "the broker requires a client certificate: set source.security.tls.cert_file" in str(
        missing
    )
    assert isinstance(stranger, AuthenticationError)
    assert "the broker refused our client certificate" in str(stranger)


async def test_tls_to_a_plaintext_port_says_to_check_the_protocol(pki: Pki) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(5)  # a TLS ClientHello, read as a Kafka size prefix...
        writer.transport.abort()  # ... implausible: a Kafka broker drops the connection

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        error = await connect_error(server.sockets[0].getsockname()[1], TlsConfig(ca_file=pki.ca))
    finally:
        server.close()
        await server.wait_closed()
    assert isinstance(error, AuthenticationError)
    assert "is this port a TLS listener? Check source.security.protocol" in str(error)


def test_client_tls_context_loads_an_encrypted_key_with_its_password(pki: Pki) -> None:
    tls = TlsConfig(
        ca_file=pki.ca,
        cert_file=pki.client_cert,
        key_file=pki.client_key_encrypted,
        key_password_file=_secret(pki.key_password),
    )
    assert client_tls_context(tls).verify_mode is ssl.CERT_REQUIRED
    assert connection_security(SecurityConfig(SecurityProtocol.SSL, tls)).client_certificate
