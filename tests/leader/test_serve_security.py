"""`replicad serve` with TLS and SASL (serve.security), read by clients nobody here wrote:
kafka-python and confluent-kafka (librdkafka) over SASL_SSL with PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512, over SSL with client certificates (mutual TLS), Kafka's own Java console
consumer (SCRAM-SHA-512) and kcat (PLAIN); a wrong password fails cleanly, the server keeps
serving, and the password is in no log. Then replicad followers (`replicad run`,
subprocesses) replicating from a secured `replicad serve` (subprocess, configured by its
flags) and from `replicad run`'s secured serve: section: a follower principal gets a
privileged session, any other principal claiming a replica id gets
TOPIC_AUTHORIZATION_FAILED (Kafka's answer to a follower fetch without ClusterAction) and
no session.

The served data are real producer batches (kafka-python's builder) written through the log
store; no broker is needed (the console consumer test needs Kafka's jars, marked kafka).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from kio.schema.errors import ErrorCode

from replicad.clock import wall_ms
from replicad.config.model import SaslMechanism, Secret, ServeSecurityConfig
from replicad.control.client import query
from replicad.errors import ConfigError, KafkaConnectionError
from replicad.leader.security import FAILED_MESSAGE, ServerSecurity
from replicad.leader.settings import ServeSettings, serve_security_from_options
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.requests import metadata_request
from replicad.protocol.security import ConnectionSecurity, SaslCredentials
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tests.leader.test_serve_kafka import Row, kafka_python_rows
from tools.logdata.batches import producer_batch
from tools.peers.group_member import subscribe_knowing
from tools.peers.kcat import run_kcat
from tools.peers.pki import Pki, make_test_pki
from tools.peers.process import free_port
from tools.replica import (
    ReplicadProcess,
    batches_from,
    end_offsets,
    replicad_run_config,
    replicad_serve,
    segment_bytes,
    wait_until,
)

TOPIC = "secured"
PARTITIONS = 2
BATCHES = 4
PER_BATCH = 25
FOLLOWER_ID = 7
PASSWORDS = {"replica": "Replica-Pw-8271", "reader": "Reader-Pw-5519"}
WRONG_PASSWORD = "Wrong-Pw-3307"
FOLLOWER_PRINCIPAL = "User:replica"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second CA, whose client certificate (CN=analyst) the mTLS server also trusts."""
    return make_test_pki(tmp_path_factory.mktemp("other-pki"), client_cn="analyst")


@pytest.fixture(scope="module")
def client_cas(pki: Pki, other_pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cas") / "client-cas.pem"
    path.write_bytes(pki.ca.read_bytes() + other_pki.ca.read_bytes())
    return path


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The users file: each user's password in a file of its own (mode 0600)."""
    directory = tmp_path_factory.mktemp("users")
    lines = []
    for user, password in PASSWORDS.items():
        secret = directory / f"{user}.password"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        lines.append(f"{user}:\n  password_file: {secret}\n")
    path = directory / "users.yaml"
    path.write_text("".join(lines))
    return path


def value(partition: int, offset: int) -> bytes:
    # Long enough that a 2 KiB partition limit takes several fetches.
    return f"p{partition}-v{offset}-".encode().ljust(64, b"x")


def write_replica(data_dir: Path) -> list[Row]:
    """Real producer batches on PARTITIONS partitions; the rows a consumer must read back."""
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())
    rows: list[Row] = []
    try:
        hws = {}
        for p in range(PARTITIONS):
            tp = TopicPartition(TOPIC, p)
            batches = [
                producer_batch(
                    b * PER_BATCH,
                    [value(p, b * PER_BATCH + i) for i in range(PER_BATCH)],
                    keys=[f"k{b * PER_BATCH + i}".encode() for i in range(PER_BATCH)],
                )
                for b in range(BATCHES)
            ]
            plog = logs.get_or_create(tp)
            data = b"".join(batches)
            plog.append(data, scan_batches(data).batches, now_ms=wall_ms())
            hws[tp] = plog.log_end_offset
            rows += [(p, o, f"k{o}".encode(), value(p, o)) for o in range(BATCHES * PER_BATCH)]
        logs.checkpoint(hws)
    finally:
        logs.close()
    return sorted(rows)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Row]]:
    data_dir = tmp_path_factory.mktemp("served") / "data"
    return data_dir, write_replica(data_dir)


def security(options: dict[str, object]) -> ServeSecurityConfig:
    """`serve.security` through the config's own rules (what `replicad serve` flags do)."""
    return serve_security_from_options(options)


def sasl_ssl(pki: Pki, users_file: Path, *mechanisms: str) -> dict[str, object]:
    return {
        "serve.security.tls.cert_file": str(pki.broker_cert),
        "serve.security.tls.key_file": str(pki.broker_key),
        "serve.security.sasl.mechanisms": list(mechanisms),
        "serve.security.sasl.users_file": str(users_file),
        "serve.allowed_followers": [FOLLOWER_ID],
        "serve.security.follower_principals": [FOLLOWER_PRINCIPAL],
    }


def mtls(pki: Pki, client_cas: Path) -> dict[str, object]:
    return {
        "serve.security.tls.cert_file": str(pki.broker_cert),
        "serve.security.tls.key_file": str(pki.broker_key),
        "serve.security.tls.ca_file": str(client_cas),
        "serve.security.tls.client_auth": "required",
        "serve.allowed_followers": [FOLLOWER_ID],
        "serve.security.follower_principals": [f"User:{pki.client_dn}"],
    }


@pytest.fixture
def secured(
    replica: tuple[Path, list[Row]], serve_in_thread: Callable[..., Any]
) -> Iterator[Callable[[dict[str, object]], Any]]:
    """`secured(options)`: the replica served in this process with that serve.security."""
    opened: list[LogManager] = []

    def start(options: dict[str, object]) -> Any:
        logs = LogManager.open(replica[0], LogConfig(), now_ms=wall_ms())
        opened.append(logs)
        config = security(options)
        return serve_in_thread(
            logs,
            ServeSettings(),
            allowed_followers=frozenset({FOLLOWER_ID}),
            security=ServerSecurity.from_config(config, {FOLLOWER_ID}),
        )

    try:
        yield start
    finally:
        # serve_in_thread closes the servers first (its fixture was set up before this one).
        for logs in opened:
            logs.close()


# -- real clients -----------------------------------------------------------------------------


def read_with_kafka_python(bootstrap: str, want: int, **options: Any) -> list[Row]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=2048,  # several fetches: the session's incremental path
        **options,
    )
    consumer.assign([KTP(TOPIC, p) for p in range(PARTITIONS)])
    return kafka_python_rows(consumer, want)


def librdkafka_consumer(bootstrap: str, conf: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "secured-readers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
            **conf,
        }
    )


def read_with_librdkafka(bootstrap: str, want: int, conf: dict[str, Any]) -> list[Row]:
    from confluent_kafka import OFFSET_BEGINNING
    from confluent_kafka import TopicPartition as KTP

    errors: list[Any] = []
    consumer = librdkafka_consumer(bootstrap, {**conf, "error_cb": errors.append})
    got: list[Row] = []
    try:
        consumer.assign([KTP(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while len(got) < want and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        consumer.close()
    assert len(got) == want, errors
    return sorted(got)


def librdkafka_sasl(pki: Pki, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(pki.ca),
    }


def first_error(bootstrap: str, conf: dict[str, Any], timeout_s: float = 30) -> Any:
    """The first error librdkafka reports while trying to use the server."""
    errors: list[Any] = []
    consumer = librdkafka_consumer(bootstrap, {**conf, "error_cb": errors.append})
    try:
        deadline = time.monotonic() + timeout_s
        while not errors and time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    assert errors, "librdkafka reported no error"
    return errors[0]


def server_said(error: Any) -> str:
    """The server's own message in a librdkafka SASL error."""
    found = re.search(r"SASL authentication error: (.*?) \(after", error.str())
    assert found is not None, error.str()
    return found.group(1)


MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_reads_over_sasl_ssl(
    secured, replica, pki, users_file, mechanism: str
) -> None:
    served = secured(sasl_ssl(pki, users_file, mechanism.lower()))
    rows = replica[1]
    got = read_with_kafka_python(
        served.bootstrap,
        len(rows),
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_plain_username="reader",
        sasl_plain_password=PASSWORDS["reader"],
        ssl_cafile=str(pki.ca),
    )
    assert got == rows
    metrics = served.metrics()
    assert metrics["authentications_total"] >= 1
    assert metrics["requests_total"]["SASL_HANDSHAKE v1"] >= 1
    assert metrics["incremental_fetches_total"] >= 1
    assert metrics.get("authentication_failures_total", 0) == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_reads_over_sasl_ssl(secured, replica, pki, users_file, mechanism) -> None:
    # Every mechanism enabled at once: the client's choice is the one used.
    served = secured(sasl_ssl(pki, users_file, *(m.lower() for m in MECHANISMS)))
    rows = replica[1]
    conf = librdkafka_sasl(pki, mechanism, "replica", PASSWORDS["replica"])
    assert read_with_librdkafka(served.bootstrap, len(rows), conf) == rows
    assert served.metrics()["authentications_total"] >= 1


@pytest.mark.kafka  # Kafka's own jars (tools/kafka), no broker
def test_kafkas_console_consumer_reads_over_sasl_ssl(
    secured, replica, pki, users_file, tmp_path
) -> None:
    """Kafka's Java client (the SCRAM reference), SCRAM-SHA-512 over TLS."""
    from tools.peers.kafka import CONSOLE_CONSUMER, kafka_tool_argv

    served = secured(sasl_ssl(pki, users_file, *(m.lower() for m in MECHANISMS)))
    properties = tmp_path / "client.properties"
    properties.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="reader" password="{PASSWORDS["reader"]}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
    )
    rows = replica[1]
    got: list[Row] = []
    for p in range(PARTITIONS):
        count = sum(1 for row in rows if row[0] == p)
        result = subprocess.run(
            kafka_tool_argv(
                CONSOLE_CONSUMER,
                "--bootstrap-server", served.bootstrap, "--command-config", str(properties),
                "--topic", TOPIC, "--partition", str(p), "--offset", "earliest",
                "--max-messages", str(count), "--timeout-ms", "30000",
                "--formatter-property", "print.key=true",
                "--formatter-property", "print.offset=true",
                "--formatter-property", "key.separator= ",
            ),
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
        for line in result.stdout.decode().splitlines():
            offset, key, value = line.split(" ")
            got.append((p, int(offset.removeprefix("Offset:")), key.encode(), value.encode()))
    assert sorted(got) == rows
    assert served.metrics()["authentications_total"] >= PARTITIONS


def test_kcat_reads_over_sasl_ssl(secured, replica, pki, users_file) -> None:
    # PLAIN: Debian's kcat links librdkafka 2.0.2, whose SCRAM client-final repeats the
    # client nonce (fixed in librdkafka 2.6.1); replicad, like Kafka 4 (RFC 5802, the
    # CVE-2024-56128 fix), refuses such a proof. Newer librdkafka does SCRAM above.
    served = secured(sasl_ssl(pki, users_file, "plain"))
    rows = replica[1]
    result = run_kcat(
        "-b", served.bootstrap,
        "-X", "security.protocol=SASL_SSL",
        "-X", "sasl.mechanisms=PLAIN",
        "-X", "sasl.username=reader",
        "-X", f"sasl.password={PASSWORDS['reader']}",
        "-X", f"ssl.ca.location={pki.ca}",
        "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q",
        "-f", "%p %o %k %s\\n",
    )  # fmt: skip
    got = sorted(
        (int(p), int(o), k.encode(), v.encode())
        for p, o, k, v in (line.split(" ") for line in result.stdout.decode().splitlines())
    )
    assert got == rows


def test_librdkafka_reads_over_mutual_tls(secured, replica, pki, client_cas) -> None:
    served = secured(mtls(pki, client_cas))
    rows = replica[1]
    conf = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
    }
    assert read_with_librdkafka(served.bootstrap, len(rows), conf) == rows


def test_kafka_python_reads_over_mutual_tls(secured, replica, pki, client_cas) -> None:
    served = secured(mtls(pki, client_cas))
    rows = replica[1]
    got = read_with_kafka_python(
        served.bootstrap,
        len(rows),
        security_protocol="SSL",
        ssl_cafile=str(pki.ca),
        ssl_certfile=str(pki.client_cert),
        ssl_keyfile=str(pki.client_key),
    )
    assert got == rows


def test_mutual_tls_refuses_a_client_without_a_certificate(secured, pki, client_cas) -> None:
    from confluent_kafka import KafkaError

    served = secured(mtls(pki, client_cas))
    error = first_error(
        served.bootstrap, {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
    )
    assert error.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
    metrics = served.metrics()
    assert metrics["requests_total"] == {}  # nothing got past the handshake
    assert metrics["tls_handshake_failures_total"] >= 1


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_fails_cleanly_and_the_server_keeps_serving(
    secured, replica, pki, users_file, mechanism
) -> None:
    from confluent_kafka import KafkaError

    served = secured(sasl_ssl(pki, users_file, *(m.lower() for m in MECHANISMS)))
    with structlog.testing.capture_logs() as logged:
        error = first_error(
            served.bootstrap, librdkafka_sasl(pki, mechanism, "replica", WRONG_PASSWORD)
        )
        unknown = first_error(
            served.bootstrap, librdkafka_sasl(pki, mechanism, "nobody", WRONG_PASSWORD)
        )
    assert error.code() == KafkaError._AUTHENTICATION, error
    # An unknown user is told exactly the same: no way to probe for names.
    assert unknown.code() == KafkaError._AUTHENTICATION
    assert server_said(unknown) == server_said(error) == FAILED_MESSAGE
    failures = [e for e in logged if e["event"].startswith("SASL authentication failed")]
    assert failures and all(e["log_level"] == "warning" for e in failures)
    text = repr(logged)
    for secret in (WRONG_PASSWORD, *PASSWORDS.values()):
        assert secret not in text
    assert served.metrics()["authentication_failures_total"] >= 2
    # The server is still there for a client that knows its password.
    rows = replica[1]
    conf = librdkafka_sasl(pki, mechanism, "replica", PASSWORDS["replica"])
    assert read_with_librdkafka(served.bootstrap, len(rows), conf) == rows


# -- the shell, with replicad's own client ----------------------------------------------------


def connection(served: Any, pki: Pki, sasl: SaslCredentials | None) -> BrokerConnection:
    context = ssl.create_default_context(cafile=str(pki.ca))
    return BrokerConnection(
        BrokerAddress(0, "127.0.0.1", served.server.port),
        client_id="test",
        connect_timeout_s=5,
        request_timeout_s=10,
        security=ConnectionSecurity(tls=context, sasl=sasl),
    )


def follower_fetch() -> Any:
    spec = FetchRequest(
        replica_id=FOLLOWER_ID,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=0,
        partitions=(RequestedPartition.of(TopicPartition(TOPIC, 0), 0, 1 << 20),),
    )
    return fetch_request(12, spec)


def test_a_request_before_authentication_closes_the_connection(secured, pki, users_file) -> None:
    served = secured(sasl_ssl(pki, users_file, "scram-sha-512"))

    async def metadata_without_sasl() -> None:
        conn = connection(served, pki, None)
        await conn.connect()  # ApiVersions is answered before authentication
        try:
            with pytest.raises(KafkaConnectionError):
                await conn.request(metadata_request(12, [TOPIC]))
        finally:
            await conn.close()

    served.run(metadata_without_sasl())
    metrics = served.metrics()
    assert metrics["unauthenticated_requests_total"] == 1
    assert "METADATA v12" not in metrics["requests_total"]


def test_a_large_frame_before_authentication_closes_the_connection(
    secured, pki, users_file
) -> None:
    served = secured(sasl_ssl(pki, users_file, "scram-sha-512"))
    context = ssl.create_default_context(cafile=str(pki.ca))
    with (
        socket.create_connection(("127.0.0.1", served.server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        # 1 MiB announced: far below serve's request limit, above Kafka's 512 KiB for SASL.
        tls.sendall(struct.pack(">i", 1 << 20))
        try:
            closed = tls.recv(1) == b""
        except (ssl.SSLError, ConnectionError):
            closed = True
    assert closed
    assert served.metrics()["requests_total"] == {}


@pytest.mark.parametrize(("user", "privileged"), [("replica", True), ("reader", False)])
def test_only_a_follower_principal_fetches_as_a_follower(
    secured, pki, users_file, user: str, privileged: bool
) -> None:
    served = secured(sasl_ssl(pki, users_file, "scram-sha-512"))
    credentials = SaslCredentials(
        SaslMechanism.SCRAM_SHA_512, user, Secret("test", PASSWORDS[user])
    )

    async def fetch_as_follower() -> Any:
        conn = connection(served, pki, credentials)
        await conn.connect()
        try:
            return await conn.request(follower_fetch())
        finally:
            await conn.close()

    body = served.run(fetch_as_follower())
    (partition,) = body.responses[0].partitions
    metrics = served.metrics()
    if privileged:
        assert partition.error_code == ErrorCode.none and partition.records
        assert int(body.session_id) != 0
        assert metrics["privileged_sessions_created_total"] == 1
    else:
        # Kafka's answer to a follower fetch without ClusterAction; no session is made.
        assert partition.error_code == ErrorCode.topic_authorization_failed
        assert not partition.records and int(body.session_id) == 0
        assert metrics.get("privileged_sessions_created_total", 0) == 0
        assert metrics["unauthorized_follower_fetches_total"] == 1
        assert metrics["sessions"] == 0


# -- replicad followers of a secured `replicad serve` ------------------------------------------


def serve_process(data_dir: Path, port: int, flags: list[str], log_path: Path) -> ReplicadProcess:
    return replicad_serve(
        data_dir, port, allow_followers=[FOLLOWER_ID], flags=flags, log_path=log_path
    )


def follower_config(
    tmp_path: Path, port: int, security_yaml: str, *, replica_id: int = FOLLOWER_ID, extra: str = ""
) -> Path:
    path = tmp_path / "follower.yaml"
    path.write_text(
        f"source:\n"
        f"  bootstrap_servers: ['127.0.0.1:{port}']\n"
        f"  reconnect_backoff_ms: 100\n"
        f"  reconnect_backoff_max_ms: 1000\n"
        f"  security:\n{security_yaml}"
        f"topics:\n  include: [{TOPIC}]\n"
        f"fetch:\n  replica_id: {replica_id}\n  partition_max_bytes: 2048\n"
        f"data_dir: {tmp_path / 'follower-data'}\n"
        f"control:\n  socket: {tmp_path / 'follower.sock'}\n"
        f"checkpoint_interval_ms: 500\n{extra}"
    )
    return path


def start_follower(tmp_path: Path, port: int, security_yaml: str) -> ReplicadProcess:
    """`replicad run` replicating TOPIC from the serve on `port` as follower FOLLOWER_ID."""
    config = follower_config(tmp_path, port, security_yaml)
    return replicad_run_config(config, tmp_path / "follower.log")


def sasl_follower_yaml(
    pki: Pki, user: str, password_file: Path, mechanism: str = "scram-sha-512"
) -> str:
    return (
        "    protocol: sasl_ssl\n"
        f"    tls: {{ca_file: {pki.ca}}}\n"
        "    sasl:\n"
        f"      mechanism: {mechanism}\n"
        f"      username: {user}\n"
        f"      password_file: {password_file}\n"
    )


def stopped_metrics(serve: ReplicadProcess) -> dict[str, Any]:
    assert serve.stop() == 0, serve.output()[-3000:]
    lines = [line for line in serve.output().splitlines() if "serve stopped" in line]
    assert lines, serve.output()[-3000:]
    return json.loads(lines[-1])


@dataclass(frozen=True)
class Followed:
    """A follower that ran against a serve, both stopped: its process, serve's last metrics."""

    follower: ReplicadProcess
    metrics: dict[str, Any]


def follow(
    serve: ReplicadProcess,
    tmp_path: Path,
    port: int,
    security_yaml: str,
    until: Callable[[ReplicadProcess], bool],
    what: str,
) -> Followed:
    """A replicad follower of `serve` (on `port`) until `until(follower)` holds; then both
    stop, each cleanly."""
    follower = start_follower(tmp_path, port, security_yaml)
    try:
        follower.wait_for(lambda: until(follower), timeout_s=60, what=what)
    finally:
        assert follower.stop() == 0, follower.output()[-3000:]
        metrics = stopped_metrics(serve)
    return Followed(follower, metrics)


def assert_same_replica(served_dir: Path, follower_dir: Path) -> None:
    for p in range(PARTITIONS):
        name = f"{TOPIC}-{p}"
        assert segment_bytes(follower_dir / name) == batches_from(
            segment_bytes(served_dir / name)
        ), name


def caught_up(follower_dir: Path, rows: list[Row]) -> bool:
    ends = {tp.partition: end for tp, end in end_offsets(follower_dir).items()}
    want = {p: 1 + max(o for q, o, _, _ in rows if q == p) for p in range(PARTITIONS)}
    return ends == want


def sasl_serve_flags(pki: Pki, users_file: Path) -> list[str]:
    return [
        "--tls-cert-file", str(pki.broker_cert),
        "--tls-key-file", str(pki.broker_key),
        "--sasl-mechanism", "scram-sha-512",
        "--sasl-mechanism", "scram-sha-256",
        "--sasl-users-file", str(users_file),
        "--follower-principal", FOLLOWER_PRINCIPAL,
    ]  # fmt: skip


def test_a_replicad_follower_over_sasl_ssl_gets_a_privileged_session(
    replica, pki, users_file, tmp_path
) -> None:
    data_dir, rows = replica
    port = free_port()
    serve = serve_process(data_dir, port, sasl_serve_flags(pki, users_file), tmp_path / "s.log")
    password = users_file.parent / "replica.password"
    followed = follow(
        serve,
        tmp_path,
        port,
        sasl_follower_yaml(pki, "replica", password),
        lambda _: caught_up(tmp_path / "follower-data", rows),
        "the follower to replicate from the secured serve",
    )
    follower, metrics = followed.follower, followed.metrics
    assert_same_replica(data_dir, tmp_path / "follower-data")
    assert metrics["privileged_sessions_created_total"] >= 1
    assert metrics["incremental_fetches_total"] >= 1
    assert metrics["authentications_total"] >= 1
    assert metrics.get("unauthorized_follower_fetches_total", 0) == 0
    for secret in PASSWORDS.values():
        assert secret not in serve.output() and secret not in follower.output()


def test_a_replicad_follower_with_another_principal_is_not_a_follower(
    replica, pki, users_file, tmp_path
) -> None:
    data_dir, _ = replica
    port = free_port()
    serve = serve_process(data_dir, port, sasl_serve_flags(pki, users_file), tmp_path / "s.log")
    password = users_file.parent / "reader.password"
    metrics = follow(
        serve,
        tmp_path,
        port,
        sasl_follower_yaml(pki, "reader", password),
        lambda follower: "topic_authorization_failed" in follower.output(),
        "the follower to be refused as a follower",
    ).metrics
    assert metrics.get("privileged_sessions_created_total", 0) == 0
    assert metrics["unauthorized_follower_fetches_total"] >= 1
    assert metrics["authentications_total"] >= 1
    assert all(end == 0 for end in end_offsets(tmp_path / "follower-data").values())
    assert "may not follow" in serve.output() and "User:reader" in serve.output()


def test_a_replicad_follower_over_mutual_tls_gets_a_privileged_session(
    replica, pki, client_cas, tmp_path
) -> None:
    data_dir, rows = replica
    port = free_port()
    flags = [
        "--tls-cert-file", str(pki.broker_cert),
        "--tls-key-file", str(pki.broker_key),
        "--tls-ca-file", str(client_cas),
        "--tls-client-auth", "required",
        "--follower-principal", f"User:{pki.client_dn}",
    ]  # fmt: skip
    serve = serve_process(data_dir, port, flags, tmp_path / "s.log")
    tls_yaml = (
        "    protocol: ssl\n"
        "    tls:\n"
        f"      ca_file: {pki.ca}\n"
        f"      cert_file: {pki.client_cert}\n"
        f"      key_file: {pki.client_key}\n"
    )
    metrics = follow(
        serve,
        tmp_path,
        port,
        tls_yaml,
        lambda _: caught_up(tmp_path / "follower-data", rows),
        "the follower to replicate over mutual TLS",
    ).metrics
    assert_same_replica(data_dir, tmp_path / "follower-data")
    assert metrics["privileged_sessions_created_total"] >= 1


def test_replicad_runs_serve_section_is_secured_too(replica, pki, users_file, tmp_path) -> None:
    """Chain: `replicad serve` S (plaintext) -> `replicad run` A, whose serve: section has
    SASL_SSL -> `replicad run` B, a follower of A as User:replica with replica id 8."""
    data_dir, rows = replica
    s_port, a_port = free_port(), free_port()
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a_serves = f"""serve:
  listen: 127.0.0.1:{a_port}
  allowed_followers: [8]
  security:
    tls: {{cert_file: {pki.broker_cert}, key_file: {pki.broker_key}}}
    sasl: {{mechanisms: [scram-sha-256], users_file: {users_file}}}
    follower_principals: ["{FOLLOWER_PRINCIPAL}"]
"""
    a_config = follower_config(a_dir, s_port, "    protocol: plaintext\n", extra=a_serves)
    password = users_file.parent / "replica.password"
    b_security = sasl_follower_yaml(pki, "replica", password, "scram-sha-256")
    b_config = follower_config(b_dir, a_port, b_security, replica_id=8)
    serve = serve_process(data_dir, s_port, [], tmp_path / "s.log")
    a = b = None
    try:
        a = replicad_run_config(a_config, a_dir / "a.log")
        # B asks A for the topic at start (then every metadata_max_age_ms): A has it first.
        wait_until(lambda: caught_up(a_dir / "follower-data", rows), timeout_s=60, what="A")
        b = replicad_run_config(b_config, b_dir / "b.log")
        wait_until(
            lambda: caught_up(b_dir / "follower-data", rows),
            timeout_s=60,
            what="B to replicate from A's secured serve section",
        )
        status = query(a_dir / "follower.sock")
    finally:
        for proc in (b, a):
            if proc is not None:
                assert proc.stop() == 0, proc.output()[-3000:]
        stopped_metrics(serve)
    assert_same_replica(data_dir, b_dir / "follower-data")
    assert status["serve"]["privileged_sessions_created_total"] >= 1
    assert status["serve"]["authentications_total"] >= 1
    assert a is not None and '"security_protocol": "SASL_SSL"' in a.output()


def test_requested_client_certificates_are_optional(secured, replica, pki, client_cas) -> None:
    options = {**mtls(pki, client_cas), "serve.security.tls.client_auth": "requested"}
    served = secured(options)
    rows = replica[1]
    got = read_with_kafka_python(
        served.bootstrap, len(rows), security_protocol="SSL", ssl_cafile=str(pki.ca)
    )
    assert got == rows


def group_read(bootstrap: str, group: str, want: int, **options: Any) -> list[tuple[int, int]]:
    """A kafka-python consumer of `group` subscribed to the topic: reads `want` records,
    commits, leaves; what it read, as (partition, offset)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **options,
    )
    # Not before its metadata names the topic: kafka-python 3.0.12 strands a leader that
    # rejoins on a metadata change (tools/peers/rejoin_race.py).
    subscribe_knowing(consumer, [TOPIC])
    read: list[tuple[int, int]] = []

    def enough() -> bool:
        for tp, messages in consumer.poll(timeout_ms=500).items():
            read.extend((tp.partition, m.offset) for m in messages)
        return len(read) >= want

    try:
        if want > 0:
            wait_until(enough, interval_s=0, what=f"{want} records of group {group}")
        consumer.commit()
    finally:
        consumer.close(autocommit=False)
    return read


def test_consumer_groups_need_an_authenticated_principal(secured, replica, pki, client_cas) -> None:
    """serve.security on: over TLS without a client certificate (User:ANONYMOUS) a group
    consumer is refused with GROUP_AUTHORIZATION_FAILED, while reading without a group still
    works; with a certificate (mutual TLS) the same consumer joins, reads and commits."""
    from kafka.errors import GroupAuthorizationFailedError

    options = {**mtls(pki, client_cas), "serve.security.tls.client_auth": "requested"}
    served = secured(options)
    rows = replica[1]
    tls = {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)}
    with pytest.raises(GroupAuthorizationFailedError):
        group_read(served.bootstrap, "anonymous-app", len(rows), **tls)
    assert served.metrics()["anonymous_group_requests_total"] >= 1
    assert read_with_kafka_python(served.bootstrap, len(rows), **tls) == rows
    certified = {
        **tls,
        "ssl_certfile": str(pki.client_cert),
        "ssl_keyfile": str(pki.client_key),
    }
    read = group_read(served.bootstrap, "certified-app", len(rows), **certified)
    assert len(read) == len(rows) == len(set(read))


def test_sasl_plaintext_with_plain_warns_and_still_authenticates(
    secured, replica, users_file
) -> None:
    options = {
        "serve.security.sasl.mechanisms": ["plain"],
        "serve.security.sasl.users_file": str(users_file),
    }
    with structlog.testing.capture_logs() as logged:
        served = secured(options)
    assert any(e["event"].startswith("SASL PLAIN without TLS") for e in logged)
    rows = replica[1]
    conf = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "reader",
        "sasl.password": PASSWORDS["reader"],
    }
    assert read_with_librdkafka(served.bootstrap, len(rows), conf) == rows


def test_replicad_serve_names_a_bad_security_flag(replica, tmp_path) -> None:
    proc = ReplicadProcess(
        ["serve", "--data-dir", str(replica[0]), "--listen", "127.0.0.1:0",
         "--tls-client-auth", "required", "--follower-principal", "replica"],
        log_path=tmp_path / "serve.log",
    ).start()  # fmt: skip
    assert proc.proc is not None and proc.proc.wait(60) == 64
    out = proc.output()
    assert "--tls-client-auth (serve.security.tls.client_auth)" in out
    assert "--follower-principal (serve.security.follower_principals[0])" in out


def test_replicad_serve_on_a_taken_port_says_so(replica, pki, tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = ReplicadProcess(
            ["serve", "--data-dir", str(replica[0]), "--listen", f"127.0.0.1:{port}",
             "--tls-cert-file", str(pki.broker_cert), "--tls-key-file", str(pki.broker_key)],
            log_path=tmp_path / "serve.log",
        ).start()  # fmt: skip
        assert proc.proc is not None and proc.proc.wait(60) == 1
    out = proc.output()
    assert "replicad serve: " in out and "Traceback" not in out


def test_the_flags_build_the_same_security_as_the_config_file(pki, users_file) -> None:
    config = security(sasl_ssl(pki, users_file, "plain"))
    assert config.tls.cert_file == pki.broker_cert
    assert config.follower_principals == (FOLLOWER_PRINCIPAL,)
    users = config.sasl.users_file
    assert users is not None and sorted(users.as_mapping()) == sorted(PASSWORDS)
    for secret in PASSWORDS.values():
        assert secret not in repr(config) and secret not in str(users)
    with pytest.raises(ConfigError, match=r"serve\.security\.sasl\.users_file"):
        security({"serve.security.sasl.mechanisms": ["plain"]})
