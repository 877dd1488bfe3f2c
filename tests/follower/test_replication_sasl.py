"""TLS and SASL against the real Apache Kafka broker (tools/peers/secure_kafka.py): a broker
with SASL_SSL, SSL (client certificates required) and SASL_PLAINTEXT listeners, its
certificate from a throw-away CA, SCRAM users made at format time.

`replicad run` replicates over each mechanism and listener and the replica is compared with
the broker's own segments, byte for byte. A wrong password, an untrusted CA, a missing
client certificate and the like must give a clear error, retried with backoff, never a
traceback, and never the password in the log.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.config.model import (
    SaslConfig,
    SaslMechanism,
    Secret,
    SecurityConfig,
    SecurityProtocol,
    TlsConfig,
)
from replicad.errors import AuthenticationError
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import parse_host_port
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.requests import metadata_request
from replicad.protocol.security import connection_security
from tools.peers.pki import Pki, make_test_pki
from tools.peers.produce import produce_mixed
from tools.peers.secure_kafka import SecureKafkaBroker
from tools.replica import (
    ReplicadProcess,
    batches_from,
    end_offsets,
    log_end_offset,
    replicad_cli,
    replicad_run_config,
    segment_bytes,
    status_json,
    wait_until,
)

pytestmark = pytest.mark.kafka

USER = "replicad"
PASSWORD = "Rep1icad-Passw0rd"
WRONG_PASSWORD = "Wr0ng-Passw0rd-42"
PARTITIONS = 2
RECORDS = 3_000
# The broker ends SASL sessions after this long (KIP-368, connections.max.reauth.ms).
SESSION_LIFETIME_MS = 10_000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[SecureKafkaBroker]:
    broker = SecureKafkaBroker(
        tmp_path_factory.mktemp("secure-kafka"),
        pki=pki,
        users={USER: PASSWORD},
        broker_config={"connections.max.reauth.ms": str(SESSION_LIFETIME_MS)},
    )
    try:
        broker.start()
    except Exception:
        broker.kill()
        raise
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def topic(secure_broker: SecureKafkaBroker) -> str:
    """Mixed-codec, transactional data, produced once through the plaintext listener."""
    name = f"secured-{os.getpid():x}"
    secure_broker.create_topic(name, PARTITIONS)
    produce_mixed(secure_broker.bootstrap, name, partitions=PARTITIONS, records=RECORDS, seed=7)
    return name


# -- helpers ---------------------------------------------------------------------------------


def config_file(
    tmp_path: Path, bootstrap: str, topic: str, security: str, *, backoff_max_ms: int = 1000
) -> Path:
    path = tmp_path / "replicad.yaml"
    path.write_text(
        f"source:\n"
        f"  bootstrap_servers: {bootstrap}\n"
        f"  reconnect_backoff_ms: 100\n"
        f"  reconnect_backoff_max_ms: {backoff_max_ms}\n"
        f"  security:\n{security}"
        f"topics:\n  include: [{topic}]\n"
        f"data_dir: {tmp_path / 'data'}\n"
        f"control:\n  socket: {tmp_path / 'control.sock'}\n"
    )
    return path


def sasl_security(pki: Pki, protocol: str, mechanism: str, password_file: Path) -> str:
    tls = f"    tls: {{ca_file: {pki.ca}}}\n" if protocol == "sasl_ssl" else ""
    return (
        f"    protocol: {protocol}\n{tls}"
        f"    sasl:\n"
        f"      mechanism: {mechanism}\n"
        f"      username: {USER}\n"
        f"      password_file: {password_file}\n"
    )


def password_file(tmp_path: Path, password: str = PASSWORD) -> Path:
    path = tmp_path / "sasl-password"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


def replicate(config: Path, tmp_path: Path, env: dict[str, str] | None = None) -> ReplicadProcess:
    return replicad_run_config(config, tmp_path / "replicad.log", env=env)


def caught_up(broker: SecureKafkaBroker, topic: str, data_dir: Path) -> bool:
    got = {(tp.topic, tp.partition): end for tp, end in end_offsets(data_dir).items()}
    return all(
        got.get((topic, p)) == log_end_offset(broker.partition_dir(topic, p))
        for p in range(PARTITIONS)
    )


def assert_replica_is_the_brokers(broker: SecureKafkaBroker, topic: str, data_dir: Path) -> None:
    for p in range(PARTITIONS):
        ours = segment_bytes(data_dir / f"{topic}-{p}")
        theirs = batches_from(segment_bytes(broker.partition_dir(topic, p)))
        assert ours, f"{topic}-{p}: nothing replicated"
        assert ours == theirs, f"{topic}-{p}: replica differs from the broker's segments"


def run_to_completion(
    broker: SecureKafkaBroker, topic: str, config: Path, tmp_path: Path, **kwargs: object
) -> str:
    """Replicate until caught up, stop cleanly; the daemon's output."""
    data_dir = tmp_path / "data"
    proc = replicate(config, tmp_path, **kwargs)  # type: ignore[arg-type]
    try:
        wait_until(
            lambda: caught_up(broker, topic, data_dir) or not proc.running,
            timeout_s=120,
            what="the replica to catch up",
        )
        assert proc.running, proc.output()
    finally:
        rc = proc.stop()
    output = proc.output()
    assert rc == 0, output
    assert "Traceback" not in output
    assert_replica_is_the_brokers(broker, topic, data_dir)
    return output


def log_events(output: str) -> list[dict[str, object]]:
    events = []
    for line in output.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


# -- replication over each mechanism and listener ------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        ("sasl_ssl", "PLAIN"),
        ("sasl_ssl", "SCRAM-SHA-256"),
        ("sasl_ssl", "SCRAM-SHA-512"),
        ("sasl_plaintext", "SCRAM-SHA-256"),
    ],
)
def test_replicates_over_sasl(
    secure_broker: SecureKafkaBroker, topic: str, tmp_path: Path, protocol: str, mechanism: str
) -> None:
    bootstrap = secure_broker.listener_bootstrap(protocol.upper())
    security = sasl_security(secure_broker.pki, protocol, mechanism, password_file(tmp_path))
    output = run_to_completion(
        secure_broker, topic, config_file(tmp_path, bootstrap, topic, security), tmp_path
    )
    assert PASSWORD not in output
    assert not [e for e in log_events(output) if "refused" in str(e.get("error", ""))], output


def test_replicates_over_mutual_tls_with_an_encrypted_key(
    secure_broker: SecureKafkaBroker, topic: str, tmp_path: Path
) -> None:
    pki = secure_broker.pki
    security = (
        "    protocol: ssl\n"
        "    tls:\n"
        f"      ca_file: {pki.ca}\n"
        f"      cert_file: {pki.client_cert}\n"
        f"      key_file: {pki.client_key_encrypted}\n"
        "      key_password_env: REPLICAD_TEST_KEY_PASSWORD\n"
        # The broker's certificate names kafka.test too; expect that name, not the IP.
        "      server_hostname: kafka.test\n"
    )
    config = config_file(tmp_path, secure_broker.ssl_bootstrap, topic, security)
    output = run_to_completion(
        secure_broker,
        topic,
        config,
        tmp_path,
        env={"REPLICAD_TEST_KEY_PASSWORD": pki.key_password},
    )
    assert pki.key_password not in output


def test_expiring_sasl_sessions_are_renewed_between_requests(
    secure_broker: SecureKafkaBroker, tmp_path: Path
) -> None:
    """Kafka closes a connection at its first request after the session expired; replicad
    opens a fresh connection before that, so no request fails."""
    topic = f"renewed-{os.getpid():x}"
    secure_broker.create_topic(topic, PARTITIONS)
    produce_mixed(secure_broker.bootstrap, topic, partitions=PARTITIONS, records=300, seed=1)
    security = sasl_security(
        secure_broker.pki, "sasl_ssl", "SCRAM-SHA-256", password_file(tmp_path)
    )
    config = config_file(tmp_path, secure_broker.sasl_ssl_bootstrap, topic, security)
    data_dir = tmp_path / "data"
    proc = replicate(config, tmp_path)
    try:
        wait_until(lambda: caught_up(secure_broker, topic, data_dir), timeout_s=60, what="catch-up")
        # Idle long polls go on past the session's end: a fresh connection before it ...
        wait_until(
            lambda: proc.output().count('"connected to leader"') >= 2,
            what="a fresh connection before the SASL session's end",
        )
        # ... and what is produced then still arrives.
        produce_mixed(secure_broker.bootstrap, topic, partitions=PARTITIONS, records=300, seed=2)
        wait_until(lambda: caught_up(secure_broker, topic, data_dir), timeout_s=60, what="more")
        assert proc.running, proc.output()
    finally:
        rc = proc.stop()
    output = proc.output()
    assert rc == 0, output
    assert_replica_is_the_brokers(secure_broker, topic, data_dir)
    events = log_events(output)
    assert sum(e["event"] == "connected to leader" for e in events) >= 2, output
    assert not [e for e in events if e["level"] in ("warning", "error")], output


# -- refusals: clear, retried, quiet about secrets --------------------------------------------


def test_a_wrong_password_is_a_clear_error_retried_with_backoff(
    secure_broker: SecureKafkaBroker, topic: str, tmp_path: Path
) -> None:
    security = sasl_security(
        secure_broker.pki, "sasl_ssl", "SCRAM-SHA-512", password_file(tmp_path, WRONG_PASSWORD)
    )
    config = config_file(tmp_path, secure_broker.sasl_ssl_bootstrap, topic, security)
    proc = replicate(config, tmp_path)
    try:

        def refusals() -> list[dict[str, object]]:
            return [
                e
                for e in log_events(proc.output())
                if "authentication as 'replicad'" in str(e.get("error", ""))
            ]

        wait_until(
            lambda: len(refusals()) >= 4 or not proc.running,
            timeout_s=60,
            what="four refused attempts",
        )
        assert proc.running, proc.output()
        # `replicad status` says it too: down, the source refusing us, exit 2.
        status = replicad_cli("status", "-c", str(config))
    finally:
        rc = proc.stop()
    assert status.returncode == 2, status.stdout + status.stderr
    headline = status.stdout.splitlines()[:2]
    assert headline[0] == "health: DOWN", status.stdout
    assert headline[1].startswith("  - the source refuses us (for "), status.stdout
    assert "SCRAM-SHA-512 authentication as 'replicad'" in headline[1], status.stdout
    assert WRONG_PASSWORD not in status.stdout
    output = proc.output()
    assert rc == 0, output
    assert "Traceback" not in output
    assert WRONG_PASSWORD not in output
    seen = refusals()
    assert "refused SCRAM-SHA-512 authentication as 'replicad' (sasl_authentication_failed)" in (
        str(seen[0]["error"])
    )
    assert all(e["level"] == "warning" for e in seen)
    delays = [int(str(e["retry_in_ms"])) for e in seen]
    # Backoff: the pause grows (with jitter) from about 100 ms towards the 1 s cap.
    assert delays[-1] > delays[0] and max(delays) <= 1000 * 1.25, delays
    assert not end_offsets(tmp_path / "data")


def test_a_password_from_the_environment_is_never_logged(
    secure_broker: SecureKafkaBroker, topic: str, tmp_path: Path
) -> None:
    security = (
        "    protocol: sasl_ssl\n"
        f"    tls: {{ca_file: {secure_broker.pki.ca}}}\n"
        f"    sasl: {{mechanism: PLAIN, username: {USER}, password_env: REPLICAD_SASL}}\n"
    )
    config = config_file(tmp_path, secure_broker.sasl_ssl_bootstrap, topic, security)
    output = run_to_completion(
        secure_broker, topic, config, tmp_path, env={"REPLICAD_SASL": PASSWORD}
    )
    assert PASSWORD not in output


# -- TLS and SASL failures on one connection, in process ----------------------------------------


async def connect(bootstrap: str, security: SecurityConfig) -> BrokerConnection:
    conn = BrokerConnection(
        BrokerAddress(-1, *parse_host_port(bootstrap)),
        client_id="test",
        connect_timeout_s=10,
        request_timeout_s=10,
        security=connection_security(security),
    )
    await conn.connect()
    return conn


async def refusal(bootstrap: str, security: SecurityConfig) -> str:
    with pytest.raises(AuthenticationError) as caught:
        conn = await connect(bootstrap, security)
        await conn.close()
    return str(caught.value)


def sasl_ssl(pki: Pki, mechanism: SaslMechanism, password: str, **tls: object) -> SecurityConfig:
    return SecurityConfig(
        SecurityProtocol.SASL_SSL,
        TlsConfig(ca_file=pki.ca, **tls),  # type: ignore[arg-type]
        SaslConfig(mechanism, USER, password_env=Secret("test", password)),
    )


async def test_each_mechanism_authenticates_and_metadata_follows(
    secure_broker: SecureKafkaBroker, topic: str
) -> None:
    for mechanism in SaslMechanism:
        conn = await connect(
            secure_broker.sasl_ssl_bootstrap, sasl_ssl(secure_broker.pki, mechanism, PASSWORD)
        )
        try:
            assert conn.versions is not None
            version = conn.versions.require(ApiKey.METADATA)
            body = await conn.request(metadata_request(version, [topic]))
            assert [t.name for t in body.topics] == [topic]
            # Kafka answers with the listener the request came in on.
            assert [f"{b.host}:{b.port}" for b in body.brokers] == [
                secure_broker.sasl_ssl_bootstrap
            ]
        finally:
            await conn.close()


async def test_an_untrusted_ca_is_a_clear_tls_error(secure_broker: SecureKafkaBroker) -> None:
    pki = secure_broker.pki
    text = await refusal(
        secure_broker.sasl_ssl_bootstrap,
        SecurityConfig(
            SecurityProtocol.SASL_SSL,
            TlsConfig(ca_file=pki.other_ca),
            SaslConfig(SaslMechanism.PLAIN, USER, password_env=Secret("t", PASSWORD)),
        ),
    )
    assert "presented a certificate we refuse: self-signed certificate in certificate chain" in (
        text
    )
    assert "source.security.tls.ca_file" in text


async def test_the_certificates_name_is_checked(secure_broker: SecureKafkaBroker) -> None:
    pki = secure_broker.pki
    text = await refusal(
        secure_broker.sasl_ssl_bootstrap,
        sasl_ssl(pki, SaslMechanism.SCRAM_SHA_256, PASSWORD, server_hostname="other.test"),
    )
    assert "Hostname mismatch, certificate is not valid for 'other.test'" in text
    conn = await connect(
        secure_broker.sasl_ssl_bootstrap,
        sasl_ssl(pki, SaslMechanism.SCRAM_SHA_256, PASSWORD, server_hostname="kafka.test"),
    )
    await conn.close()


async def test_mutual_tls_refusals_say_what_is_missing(secure_broker: SecureKafkaBroker) -> None:
    pki = secure_broker.pki
    # Kafka (TLS 1.3) refuses a missing certificate after the handshake, at the first read.
    missing = await refusal(
        secure_broker.ssl_bootstrap, SecurityConfig(SecurityProtocol.SSL, TlsConfig(ca_file=pki.ca))
    )
    assert "the broker requires a client certificate: set source.security.tls.cert_file" in (
        missing
    )
    stranger = await refusal(
        secure_broker.ssl_bootstrap,
        SecurityConfig(
            SecurityProtocol.SSL,
            TlsConfig(ca_file=pki.ca, cert_file=pki.stranger_cert, key_file=pki.stranger_key),
        ),
    )
    assert "the broker refused our client certificate" in stranger


async def test_a_mismatched_protocol_is_named(secure_broker: SecureKafkaBroker) -> None:
    pki = secure_broker.pki
    # SASL towards a listener without it.
    text = await refusal(
        secure_broker.bootstrap,
        SecurityConfig(
            SecurityProtocol.SASL_PLAINTEXT,
            sasl=SaslConfig(SaslMechanism.SCRAM_SHA_256, USER, password_env=Secret("t", "x")),
        ),
    )
    assert "does not expect SASL on this port: check source.security.protocol" in text
    # TLS towards a plaintext listener.
    text = await refusal(
        secure_broker.bootstrap, SecurityConfig(SecurityProtocol.SSL, TlsConfig(ca_file=pki.ca))
    )
    assert "is this port a TLS listener? Check source.security.protocol" in text


async def test_a_wrong_password_is_refused_for_every_mechanism(
    secure_broker: SecureKafkaBroker,
) -> None:
    pki = secure_broker.pki
    for mechanism in SaslMechanism:
        text = await refusal(
            secure_broker.sasl_ssl_bootstrap, sasl_ssl(pki, mechanism, WRONG_PASSWORD)
        )
        assert f"refused {mechanism.wire_name} authentication as 'replicad'" in text
        assert WRONG_PASSWORD not in text


def test_mirror_into_a_sasl_ssl_destination(
    kafka_broker: Any, secure_broker: SecureKafkaBroker, tmp_path: Path
) -> None:
    """The mirror's destination over SASL_SSL (SCRAM-SHA-512, the test CA), with the same
    settings as the source's; the broker of this module is the destination, so no other
    JVM is started (replicad/mirror; its own tests are under tests/mirror)."""
    from tools.peers.produce import READ_COMMITTED, consume_all
    from tools.replica import status_json

    topic = f"to-secure-{os.getpid():x}-{time.monotonic_ns() % 100_000}"
    kafka_broker.create_topic(topic, PARTITIONS)
    produce_mixed(
        kafka_broker.bootstrap, topic, partitions=PARTITIONS, records=400, seed=9,
        transactional=False,
    )  # fmt: skip
    security = sasl_security(
        secure_broker.pki, "sasl_ssl", "SCRAM-SHA-512", password_file(tmp_path)
    )
    config = tmp_path / "replicad.yaml"
    config.write_text(
        f"source:\n  bootstrap_servers: {kafka_broker.bootstrap}\n"
        f"topics:\n  include: [{topic}]\n"
        f"data_dir: {tmp_path / 'data'}\n"
        f"control:\n  socket: {tmp_path / 'control.sock'}\n"
        f"mirror:\n  bootstrap_servers: {secure_broker.sasl_ssl_bootstrap}\n"
        f"  progress_interval_ms: 200\n"
        f"  security:\n{security}"
    )
    want = consume_all(kafka_broker.bootstrap, topic, isolation=READ_COMMITTED)
    with replicate(config, tmp_path) as proc:

        def mirrored() -> bool:
            status = status_json(tmp_path / "control.sock", 10) or {}
            rows = (status.get("mirror") or {}).get("partitions", ())
            done = {r["partition"]: r["mirrored_offset"] for r in rows}
            return all(done.get(p, -1) >= len(want[p]) for p in range(PARTITIONS))

        proc.wait_for(mirrored, timeout_s=90, what="mirrored over SASL_SSL")
        assert PASSWORD not in proc.output()
    got = consume_all(secure_broker.bootstrap, topic, isolation=READ_COMMITTED)
    assert got == want


# -- certificates rotated without a restart -------------------------------------------------

REREAD = "TLS files read again"


def test_serve_and_source_certificates_rotate_under_load_without_a_restart(
    secure_broker: SecureKafkaBroker, unique_topic: str, tmp_path: Path, free_port: int
) -> None:
    """`replicad run` fetching over mutual TLS and serving over TLS, a producer writing to
    the source and a confluent-kafka consumer reading from serve all along: both
    certificates are rotated in place (same files, a new key and certificate from the same
    CA) and SIGHUP read. New connections to serve get the new certificate, the consumer's
    connection goes on, and no fetch fails, on either side."""
    import signal
    import socket
    import ssl
    import threading

    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
    from confluent_kafka import TopicPartition as KTP
    from cryptography import x509

    from tools.peers.pki import reissue

    pki = secure_broker.pki
    secure_broker.create_topic(unique_topic, 1)
    files = {
        name: tmp_path / f"{name}.pem" for name in ("client", "client-key", "serve", "serve-key")
    }
    for name, origin in zip(
        files, (pki.client_cert, pki.client_key, pki.broker_cert, pki.broker_key), strict=True
    ):
        files[name].write_bytes(origin.read_bytes())
    security = (
        "    protocol: ssl\n"
        f"    tls: {{ca_file: {pki.ca}, cert_file: {files['client']}, "
        f"key_file: {files['client-key']}}}\n"
    )
    config = config_file(tmp_path, secure_broker.ssl_bootstrap, unique_topic, security)
    with config.open("a") as f:
        f.write(
            f"serve:\n  listen: 127.0.0.1:{free_port}\n  security:\n    tls:\n"
            f"      cert_file: {files['serve']}\n      key_file: {files['serve-key']}\n"
            # Client certificates: serve's groups are for authenticated principals only.
            f"      ca_file: {pki.ca}\n      client_auth: required\n"
        )
    served = f"127.0.0.1:{free_port}"

    def serve_certificate() -> int:
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(pki.client_cert, pki.client_key)
        raw = socket.create_connection(("127.0.0.1", free_port), timeout=30)
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            der = conn.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    stop = threading.Event()
    produced = [0]
    failed: list[Any] = []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": secure_broker.bootstrap, "linger.ms": 5})
        while not stop.is_set() and not failed:
            for i in range(50):
                producer.produce(
                    unique_topic,
                    value=b"r%d" % (produced[0] + i),
                    partition=0,
                    on_delivery=lambda error, _: failed.append(error) if error else None,
                )
            producer.flush(60)
            produced[0] += 50

    errors: list[Any] = []
    offsets: list[int] = []
    proc = replicate(config, tmp_path)
    producer = threading.Thread(target=produce, daemon=True)
    consumer = None
    try:
        proc.wait_serving()
        # Made once serve listens: librdkafka connects at once, and would count the refusals.
        consumer = Consumer(
            {
                "bootstrap.servers": served,
                "group.id": "rotation",
                "enable.auto.commit": False,
                "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca),
                "ssl.certificate.location": str(pki.client_cert),
                "ssl.key.location": str(pki.client_key),
                "error_cb": errors.append,
                "log_level": 3,
            }
        )
        before = serve_certificate()
        producer.start()
        # Assigned once the replica has the partition (before, serve does not know it).
        wait_until(
            lambda: sum(end_offsets(tmp_path / "data").values()) > 0 or not proc.running,
            timeout_s=120,
            what="the first records replicated",
        )
        consumer.assign([KTP(unique_topic, 0, OFFSET_BEGINNING)])

        def read_past(count: int) -> bool:
            for m in consumer.consume(num_messages=500, timeout=0.5):
                assert m.error() is None, m.error()
                offsets.append(m.offset())
            return len(offsets) >= count or not proc.running

        wait_until(lambda: read_past(500), timeout_s=120, what="500 records read from serve")
        reissue(pki, files["client"], files["client-key"], common_name="rotated", server=False)
        serve = reissue(
            pki, files["serve"], files["serve-key"], common_name="serve", server=True,
            dns=["localhost"], ips=["127.0.0.1"],
        )  # fmt: skip
        os.kill(proc.pid, signal.SIGHUP)

        def reread() -> dict[str, object]:
            events = log_events(proc.output())
            return {e["section"]: e["contexts"] for e in events if e.get("event") == REREAD}

        wait_until(
            lambda: set(reread()) == {"source.security.tls", "serve.security.tls"},
            timeout_s=60,
            what="both sections' TLS files read again",
        )
        # The follower's client and serve's listener (and the config check's, gone by now).
        assert all(isinstance(n, int) and n >= 1 for n in reread().values()), reread()
        assert serve_certificate() == serve.serial_number != before
        read_so_far = len(offsets)
        wait_until(
            lambda: read_past(read_so_far + 500), timeout_s=120, what="500 more records read"
        )
        stop.set()
        producer.join(timeout=120)
        total = produced[0]
        wait_until(lambda: read_past(total), timeout_s=120, what="every record read")
        assert proc.running, proc.output()
        status = status_json(tmp_path / "control.sock")
    finally:
        stop.set()
        if consumer is not None:
            consumer.close()
        rc = proc.stop()
    output = proc.output()
    assert rc == 0, output
    assert failed == []
    assert offsets == list(range(total))
    assert errors == []
    assert status is not None
    assert [leader["errors"] for leader in status["leaders"]] == [0]
    assert "TLS files refused" not in output and "Traceback" not in output
