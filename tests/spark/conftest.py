"""Fixtures of the Spark source's tests.

- `make_batches` / `write_partition`: synthetic partitions written by replicad's own log
  store (PartitionLog: real segments and indexes), from real producer batches
  (kafka-python's builder, tools.logdata), plus transactional batches and markers.
- `replicated`: real data, once per session: topics filled by a real producer
  (tools.peers.produce_mixed: every codec, headers, null keys/values, committed and aborted
  transactions) on the Kafka broker, replicated by a real `replicad run` with small
  segments, and read back by a real consumer under both isolation levels.
- `listener`: Spark's side of a driver-side worker's connection, a socket on loopback
  (stub_worker.py, for test_connect_first.py and test_forkserver.py).
- `spark`: one local[2] SparkSession for the session's Spark tests, with Spark's Kafka
  source on its classpath (`make spark-kafka-jars`), the peer of the failover test, and the
  S3 test server's credentials in its environment (the archive tests' bucket reads).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from crc32c import crc32c

from replicad.log.config import LogConfig
from replicad.log.partition import PartitionLog
from replicad.records.batch import MAGIC_V2, V2_CRC_START, Compression, scan_batches
from replicad.records.records import ControlType
from replicad.types import TopicPartition

TIMESTAMP_MS = 1_700_000_000_000
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_POSITION = 21
_CRC = struct.Struct(">I")
_CRC_POSITION = 17
_CONTROL_FLAG = 0x20
_UNLIMITED = 1 << 30


class Batches:
    """Record batches as producers and transaction coordinators write them."""

    @staticmethod
    def data(
        base_offset: int,
        count: int,
        *,
        codec: Compression = Compression.NONE,
        timestamp_ms: int = TIMESTAMP_MS,
        value_size: int = 100,
    ) -> bytes:
        from tools.logdata.batches import producer_batch

        values = [(b"v%d-" % (base_offset + i)).ljust(value_size, b"x") for i in range(count)]
        keys = [b"k%d" % (base_offset + i) for i in range(count)]
        return producer_batch(
            base_offset,
            values,
            codec=codec,
            keys=keys,
            timestamps=[timestamp_ms + i for i in range(count)],
        )

    @staticmethod
    def transactional(
        base_offset: int, count: int, producer_id: int, *, timestamp_ms: int = TIMESTAMP_MS
    ) -> bytes:
        return _build(
            base_offset,
            producer_id,
            [(b"k%d" % (base_offset + i), b"t%d" % (base_offset + i)) for i in range(count)],
            timestamp_ms,
            control=False,
        )

    @staticmethod
    def marker(
        offset: int, producer_id: int, kind: ControlType, *, timestamp_ms: int = TIMESTAMP_MS
    ) -> bytes:
        key = struct.pack(">hh", 0, int(kind))
        value = struct.pack(">hi", 0, 7)  # version, coordinator epoch
        return _build(offset, producer_id, [(key, value)], timestamp_ms, control=True)


def _build(
    base_offset: int,
    producer_id: int,
    records: Sequence[tuple[bytes, bytes]],
    timestamp_ms: int,
    *,
    control: bool,
) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=MAGIC_V2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=-1 if control else 0,
        batch_size=_UNLIMITED,
    )
    for i, (key, value) in enumerate(records):
        assert builder.append(i, timestamp_ms + i, key, value, []) is not None
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if control:
        # kafka-python builds no control batches: set the flag, then the CRC it covers.
        (attributes,) = _ATTRIBUTES.unpack_from(data, _ATTRIBUTES_POSITION)
        _ATTRIBUTES.pack_into(data, _ATTRIBUTES_POSITION, attributes | _CONTROL_FLAG)
        _CRC.pack_into(data, _CRC_POSITION, crc32c(bytes(data[V2_CRC_START:])))
    return bytes(data)


@pytest.fixture
def make_batches() -> type[Batches]:
    return Batches


@pytest.fixture
def write_partition() -> Callable[..., Path]:
    """`write_partition(data_dir, tp, batches, segment_bytes=..., index_interval_bytes=...)`."""

    def write(
        data_dir: Path,
        tp: TopicPartition,
        batches: Sequence[bytes],
        *,
        segment_bytes: int = 64 * 1024,
        index_interval_bytes: int = 1024,
    ) -> Path:
        directory = data_dir / f"{tp.topic}-{tp.partition}"
        config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
        log = PartitionLog.create(directory, tp, config, now_ms=0)
        try:
            for raw in batches:
                log.append(raw, scan_batches(raw).batches, now_ms=0)
        finally:
            log.close()
        return directory

    return write


# -- real data: Kafka -> replicad --------------------------------------------------------

MIXED_PARTITIONS = 3
MIXED_RECORDS = 9000
PLAIN_PARTITIONS = 2
PLAIN_RECORDS = 1500
REPLICA_SEGMENT_BYTES = 64 * 1024
PRODUCER_BATCH_BYTES = 16 * 1024


@dataclass(frozen=True)
class Replicated:
    data_dir: Path
    bootstrap: str  # the broker the topics were produced to, still serving them
    mixed: str  # every codec, transactions committed and aborted
    plain: str  # no transactions, uncompressed
    partitions: dict[str, int]
    # topic -> partition -> records, as a real consumer read them
    committed: dict[str, dict[int, list]]
    uncommitted: dict[str, dict[int, list]]
    summaries: dict[str, object]  # topic -> tools.peers.produce.ProduceSummary


@pytest.fixture(scope="session")
def replicated(kafka_broker, tmp_path_factory: pytest.TempPathFactory) -> Replicated:
    from tools.peers.produce import READ_COMMITTED, READ_UNCOMMITTED, consume_all, produce_mixed
    from tools.replica import replicad_run

    root = tmp_path_factory.mktemp("spark-replica")
    tag = f"{os.getpid():x}"
    mixed, plain = f"spark-mixed-{tag}", f"spark-plain-{tag}"
    partitions = {mixed: MIXED_PARTITIONS, plain: PLAIN_PARTITIONS}
    kafka_broker.create_topic(mixed, MIXED_PARTITIONS)
    kafka_broker.create_topic(plain, PLAIN_PARTITIONS)
    summaries = {
        mixed: produce_mixed(
            kafka_broker.bootstrap,
            mixed,
            partitions=MIXED_PARTITIONS,
            records=MIXED_RECORDS,
            seed=7,
            max_batch_bytes=PRODUCER_BATCH_BYTES,
        ),
        plain: produce_mixed(
            kafka_broker.bootstrap,
            plain,
            partitions=PLAIN_PARTITIONS,
            records=PLAIN_RECORDS,
            seed=8,
            codecs=("none",),
            transactional=False,
            max_batch_bytes=PRODUCER_BATCH_BYTES,
        ),
    }
    want = {
        TopicPartition(topic, p): end
        for topic, summary in summaries.items()
        for p, end in summary.log_end_offsets.items()
    }
    data_dir = root / "data"
    config = {"log": {"segment_bytes": REPLICA_SEGMENT_BYTES, "index_interval_bytes": 1024}}
    with replicad_run(kafka_broker.bootstrap, [mixed, plain], data_dir, config=config) as proc:
        proc.wait_caught_up(want)
    uncommitted = {
        t: consume_all(kafka_broker.bootstrap, t, isolation=READ_UNCOMMITTED) for t in partitions
    }
    committed = {
        t: consume_all(kafka_broker.bootstrap, t, isolation=READ_COMMITTED) for t in partitions
    }
    return Replicated(
        data_dir,
        kafka_broker.bootstrap,
        mixed,
        plain,
        partitions,
        committed,
        uncommitted,
        summaries,
    )


# -- Spark ---------------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """Where a stand-in worker (stub_worker.py) connects back, as to Spark's factory."""
    from tests.spark.stub_worker import DEADLINE_S

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(DEADLINE_S)
    try:
        yield server
    finally:
        server.close()


# The client compiler only: a JVM that lives for a test run is done before C2 would pay off,
# and C2's compile threads compete with the tests for two cores (spark-submit: 65 s -> 36 s).
QUICK_JVM = "-XX:TieredStopAtLevel=1"
# The Spark of a process a test starts (`replicad pipeline`, spark-submit): one core, the
# client compiler only, no web UI.
LOCAL_SPARK_ARGS = (
    "--master",
    "local[1]",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    f"spark.driver.extraJavaOptions={QUICK_JVM}",
)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] session for all Spark tests, the `replicad` format registered and
    Spark's Kafka source on the classpath (jars are fixed when a session starts, and a
    session of its own would cost the failover test a JVM's start)."""
    from replicad.spark.pipeline import spark_session
    from tools.bench.spark_kafka import connector_jars

    try:
        jars = connector_jars()
    except Exception as error:
        from tools.peers.process import PeerNotInstalledError

        if isinstance(error, PeerNotInstalledError):
            pytest.fail(f"real peer not installed: {error}", pytrace=False)
        raise
    # Spark's Python workers (planning and reading alike) inherit the JVM's environment,
    # fixed when the session starts: the S3 test server's credentials are set now, so that
    # the archive tests' executors read the bucket as a cluster's would, through the AWS
    # credential chain (tools/peers/s3.py; test-only values).
    from tools.peers.s3 import client_environ

    os.environ.update(client_environ())
    session = spark_session(
        "local[2]",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": "1g",
            "spark.driver.extraJavaOptions": QUICK_JVM,
            "spark.jars": jars,
        },
        app_name="replicad tests",
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
