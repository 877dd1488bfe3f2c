"""`replicad serve` read by clients nobody here wrote, over a replica `replicad run` copied
from a real Apache Kafka broker; and the chain Kafka -> replicad A -> (A serves) -> replicad B.

The source topic holds produce_mixed's data: every codec, headers, null keys and values,
committed and aborted transactions. What a client reads from replicad must be exactly what
the source had: the same records at the same offsets (read_committed: without the aborted
ones; read_uncommitted and the old protocol: with them; the old protocol has no headers).

librdkafka note: with `api.version.request=false`, librdkafka 2.x still asks ApiVersions when
`broker.version.fallback` is 0.10.0 or newer (its documentation says so), so the old-protocol
librdkafka run uses 0.9.0: Metadata v0, ListOffsets v0 and Fetch v1, i.e. magic 0 messages.
kafka-python with api_version=(0, 10) covers Fetch v2 and magic 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.types import TopicPartition
from tools.peers.kafka import CONSOLE_CONSUMER, kafka_tool_argv
from tools.peers.kcat import kcat_binary
from tools.peers.process import free_port
from tools.peers.produce import (
    CODECS,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ConsumedRecord,
    ProduceSummary,
    consume_all,
    produce_mixed,
    records_digest,
)
from tools.replica import (
    batches_from,
    replicad_run,
    replicad_serve,
    segment_bytes,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 2
RECORDS = 3000
FOLLOWER_ID = 7
SEP = b"\x1f<sep>\x1f"
END = b"\x1e<end>\x1e\n"
NULL = b"\x1d<null>\x1d"

# What magic 0/1 can hold: ZSTD batches have no old form (UNSUPPORTED_COMPRESSION_TYPE).
LEGACY_CODECS = tuple(c for c in CODECS if c != "zstd")

Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


class Source:
    """The source topics, what Kafka's consumers read from them, and their replica."""

    def __init__(self, summaries: dict[str, ProduceSummary], data_dir: Path, broker: Any) -> None:
        self.topic, self.legacy_topic = summaries
        self.summaries = summaries
        self.summary = summaries[self.topic]
        self.data_dir = data_dir
        self.broker = broker
        self.committed = self._consume(self.topic, READ_COMMITTED)
        self.uncommitted = self._consume(self.topic, READ_UNCOMMITTED)
        self.legacy_uncommitted = self._consume(self.legacy_topic, READ_UNCOMMITTED)

    def _consume(self, topic: str, isolation: str) -> dict[int, list[ConsumedRecord]]:
        return consume_all(self.broker.bootstrap, topic, partitions=PARTITIONS, isolation=isolation)

    def rows(self, *, legacy: bool = False) -> list[Row]:
        source = self.legacy_uncommitted if legacy else self.uncommitted
        return sorted(
            (p, r.offset, r.key, r.value) for p, records in source.items() for r in records
        )


@pytest.fixture(scope="module")
def source(kafka_broker, tmp_path_factory) -> Source:
    """Two topics on the real broker -- every codec, and every codec magic 0/1 has (no ZSTD),
    for the old protocol -- and their replica, written by `replicad run`."""
    base = f"serve-{os.getpid():x}-{int(time.time() * 1000) % 100000}"
    summaries = {}
    for topic, codecs in ((base, CODECS), (f"{base}-legacy", LEGACY_CODECS)):
        kafka_broker.create_topic(topic, PARTITIONS)
        summaries[topic] = produce_mixed(
            kafka_broker.bootstrap,
            topic,
            partitions=PARTITIONS,
            records=RECORDS,
            seed=11,
            codecs=codecs,
        )
    data_dir = tmp_path_factory.mktemp("replica-a") / "data"
    replicate(kafka_broker.bootstrap, list(summaries), data_dir, tmp_path_factory.mktemp("run-a"))
    for topic in summaries:
        assert_same_as_kafka(kafka_broker, topic, data_dir)
    return Source(summaries, data_dir, kafka_broker)


def replicate(bootstrap: str, topics: list[str], data_dir: Path, work: Path, *extra: str) -> None:
    """`replicad run` until the replica holds what the source holds, then a clean stop."""
    want = {
        TopicPartition(topic, p): end
        for topic in topics
        for p, end in source_ends(bootstrap, topic).items()
    }
    with replicad_run(
        bootstrap,
        topics,
        data_dir,
        log_path=work / "replicad.log",
        control_socket=work / "control.sock",
        extra=extra,
    ) as proc:
        proc.wait_caught_up(want, timeout_s=90)


def source_ends(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(KTP(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def assert_same_as_kafka(broker: Any, topic: str, data_dir: Path) -> None:
    for p in range(PARTITIONS):
        theirs = batches_from(segment_bytes(broker.partition_dir(topic, p)))
        ours = segment_bytes(data_dir / f"{topic}-{p}")
        assert ours == theirs, f"{topic}-{p}: replica differs from the broker's segments"


@pytest.fixture
def served(source: Source, serve_in_thread: Callable[..., Any]) -> Iterator[Any]:
    """The replica served on a thread of this process (its metrics can be read directly)."""
    logs = LogManager.open(source.data_dir, LogConfig(), now_ms=wall_ms())
    try:
        yield serve_in_thread(logs)
    finally:
        logs.close()


# -- clients of today ---------------------------------------------------------------------------


def test_kafka_python_reads_every_record_through_an_incremental_session(source, served) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=served.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=16 * 1024,  # many fetches, so the session is used
    )
    got: dict[int, list[ConsumedRecord]] = {p: [] for p in range(PARTITIONS)}
    want = sum(len(r) for r in source.committed.values())
    try:
        consumer.assign([KTP(source.topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while sum(len(r) for r in got.values()) < want and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                got[tp.partition] += [
                    ConsumedRecord(m.offset, m.key, m.value, tuple(m.headers or ()), m.timestamp)
                    for m in messages
                ]
    finally:
        consumer.close()
    for p in range(PARTITIONS):
        assert records_digest(got[p]) == source.summary.partitions[p].committed_digest, p
    metrics = served.metrics()
    assert metrics["sessions_created_total"] >= 1
    assert metrics["incremental_fetches_total"] > 10


@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED])
def test_librdkafka_reads_every_record(source, served, isolation) -> None:
    got = consume_all(served.bootstrap, source.topic, partitions=PARTITIONS, isolation=isolation)
    for p in range(PARTITIONS):
        summary = source.summary.partitions[p]
        digest = (
            summary.committed_digest if isolation == READ_COMMITTED else summary.uncommitted_digest
        )
        assert records_digest(got[p]) == digest, p


def test_kcat_reads_every_record(source, served) -> None:
    result = subprocess.run(
        [
            kcat_binary(),
            "-C",
            "-b",
            served.bootstrap,
            "-t",
            source.topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-X",
            "isolation.level=read_uncommitted",
            "-f",
            "%p %o %K %S\n%k%s",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert sorted(parse_kcat(result.stdout)) == source.rows()


def parse_kcat(out: bytes) -> list[Row]:
    rows, pos = [], 0
    while pos < len(out):
        line_end = out.index(b"\n", pos)
        partition, offset, key_len, value_len = (int(x) for x in out[pos:line_end].split())
        pos = line_end + 1
        key = out[pos : pos + key_len] if key_len >= 0 else None
        pos += max(key_len, 0)
        value = out[pos : pos + value_len] if value_len >= 0 else None
        pos += max(value_len, 0)
        rows.append((partition, offset, key, value))
    return rows


def test_kafkas_java_console_consumer_reads_every_record(source, served) -> None:
    rows: list[Row] = []
    expected = source.rows()
    for p in range(PARTITIONS):
        count = sum(1 for row in expected if row[0] == p)
        out = run_console_consumer(served.bootstrap, source.topic, p, count)
        rows += parse_console(out)
    assert sorted(rows) == expected


def run_console_consumer(bootstrap: str, topic: str, partition: int, count: int) -> bytes:
    argv = kafka_tool_argv(
        CONSOLE_CONSUMER,
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--partition",
        str(partition),
        "--offset",
        "earliest",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "30000",
    )
    for prop in (
        "print.partition=true",
        "print.offset=true",
        "print.key=true",
        "print.value=true",
        f"key.separator={SEP.decode()}",
        f"line.separator={END.decode()}",
        f"null.literal={NULL.decode()}",
    ):
        argv.extend(["--formatter-property", prop])
    result = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result.stdout


def parse_console(out: bytes) -> list[Row]:
    rows = []
    for entry in out.split(END):
        if not entry:
            continue
        partition, offset, key, value = entry.split(SEP)
        rows.append(
            (
                int(partition.removeprefix(b"Partition:")),
                int(offset.removeprefix(b"Offset:")),
                None if key == NULL else key,
                None if value == NULL else value,
            )
        )
    return rows


# -- clients of the old protocol: down-converted records ---------------------------------------


def kafka_python_rows(consumer: Any, want: int, timeout_s: float = 60) -> list[Row]:
    """The rows an assigned kafka-python consumer reads, until it has `want` (sorted); the
    consumer is closed."""
    got: list[Row] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                got += [(tp.partition, m.offset, m.key, m.value) for m in messages]
    finally:
        consumer.close()
    return sorted(got)


def test_kafka_python_speaking_0_10_reads_down_converted_records(source, served) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=served.bootstrap,
        api_version=(0, 10),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    expected = source.rows(legacy=True)
    consumer.assign([KTP(source.legacy_topic, p) for p in range(PARTITIONS)])
    assert kafka_python_rows(consumer, len(expected)) == expected
    metrics = served.metrics()
    assert metrics["requests_total"].get("FETCH v2", 0) > 0
    assert metrics["downconverted_records_total"] >= len(expected)


def test_serve_without_downconversion_refuses_old_consumers_and_serves_new_ones(
    source, tmp_path
) -> None:
    """`replicad serve --no-message-downconversion` (KIP-283's message.downconversion.enable
    off): kafka-python speaking 0.10 (Fetch v2, magic 1) gets UNSUPPORTED_VERSION for the
    partition, as Kafka answers it, while kafka-python speaking today's protocol reads every
    record from the same server."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    from kafka.errors import UnsupportedVersionError

    port = free_port()
    partitions = [KTP(source.legacy_topic, p) for p in range(PARTITIONS)]
    common = {
        "bootstrap_servers": f"127.0.0.1:{port}",
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,
    }
    expected = source.rows(legacy=True)
    with replicad_serve(
        source.data_dir,
        port,
        log_path=tmp_path / "serve.log",
        flags=["--no-message-downconversion"],
    ):
        old = KafkaConsumer(api_version=(0, 10), **common)
        try:
            old.assign(partitions)
            deadline = time.monotonic() + 30
            with pytest.raises(UnsupportedVersionError):
                while time.monotonic() < deadline:
                    assert not old.poll(timeout_ms=500), "records reached the old protocol"
        finally:
            old.close()
        new = KafkaConsumer(**common)
        new.assign(partitions)
        got = kafka_python_rows(new, len(expected))
    assert got == expected


def test_librdkafka_without_api_versions_reads_down_converted_records(source, served) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer(
        {
            "bootstrap.servers": served.bootstrap,
            "group.id": "old-protocol",
            "api.version.request": False,
            "broker.version.fallback": "0.9.0",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    expected = source.rows(legacy=True)
    got: list[Row] = []
    try:
        consumer.assign([KTP(source.legacy_topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while len(got) < len(expected) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        consumer.close()
    assert sorted(got) == expected
    requests = served.metrics()["requests_total"]
    assert requests.get("FETCH v1", 0) > 0 and "API_VERSIONS v3" not in requests


# -- the chain: Kafka -> A -> (A serves) -> B ------------------------------------------------------


def test_a_replicad_follower_chained_behind_replicad_is_byte_identical_to_kafka(
    source, tmp_path
) -> None:
    port = free_port()
    log_path = tmp_path / "serve.log"
    b_dir = tmp_path / "b"
    with replicad_serve(source.data_dir, port, allow_followers=[FOLLOWER_ID], log_path=log_path):
        config = tmp_path / "b.yaml"
        config.write_text(
            f"source:\n  bootstrap_servers: ['127.0.0.1:{port}']\n"
            f"fetch:\n  replica_id: {FOLLOWER_ID}\n  partition_max_bytes: 65536\n"
            "checkpoint_interval_ms: 500\n"
        )
        replicate(f"127.0.0.1:{port}", [source.topic], b_dir, tmp_path, "-c", str(config))
    assert_same_as_kafka(source.broker, source.topic, b_dir)
    stopped = [line for line in log_path.read_text().splitlines() if "serve stopped" in line]
    assert stopped and '"privileged_sessions_created_total": ' in stopped[-1], log_path.read_text()[
        -2000:
    ]
    metrics = json.loads(stopped[-1])
    assert metrics["privileged_sessions_created_total"] >= 1
    assert metrics["incremental_fetches_total"] >= 1


def test_max_timestamp_offsets_equal_what_kafka_answers(
    kafka_broker, tmp_path, serve_in_thread
) -> None:
    """ListOffsets MAX_TIMESTAMP (-3) through librdkafka's admin client: the replica answers
    what the broker answers -- the first record carrying the largest timestamp, which the
    producer here puts mid-batch (and twice), not the batch's last offset."""
    from confluent_kafka import TopicPartition as KTP
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from tools.peers.produce import CheckedProducer

    topic = f"maxts-{os.getpid():x}-{int(time.time() * 1000) % 100000}"
    kafka_broker.create_topic(topic, PARTITIONS)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 200})
    base = int(time.time() * 1000) - 60_000
    for p in range(PARTITIONS):
        # One batch per partition: the peak is the 3rd of 8 records and repeats at the 6th.
        for i, delta in enumerate((1, 5, 40 + p, 7, 2, 40 + p, 9, 3)):
            producer.produce(topic, value=b"%d" % i, partition=p, timestamp=base + delta)
    assert producer.flush(30) == 0
    data_dir = tmp_path / "data"
    replicate(kafka_broker.bootstrap, [topic], data_dir, tmp_path)
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())

    def answers(bootstrap: str) -> dict[int, tuple[int, int]]:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        asked = {KTP(topic, p): OffsetSpec.max_timestamp() for p in range(PARTITIONS)}
        found = {}
        for tp, future in admin.list_offsets(asked, request_timeout=30).items():
            info = future.result(timeout=60)
            found[tp.partition] = (info.offset, info.timestamp)
        return found

    try:
        served = serve_in_thread(logs)
        kafka = answers(kafka_broker.bootstrap)
        ours = answers(served.bootstrap)
    finally:
        logs.close()
    assert kafka == {p: (2, base + 40 + p) for p in range(PARTITIONS)}  # the first peak
    assert ours == kafka
