"""`replicad run` with a `mirror:` section, from a real Apache Kafka source (the session's
single broker) into a real Apache Kafka destination (the session's three-node cluster).

What a consumer reads from the destination must be what one reads from the source:
read_committed on both sides, the same records (keys, values, headers, timestamps) in the
same order per partition; for topics without transactions the same offsets too; and the
destination's batches keep the source's codecs (read from the destination's own segment
files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicad.types import TopicPartition
from tools.peers.produce import (
    CODECS,
    READ_COMMITTED,
    ConsumedRecord,
    consume_all,
    produce_mixed,
)
from tools.peers.segments import broker_batches
from tools.replica import ReplicadProcess, replicad_run

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def mirror_config(destination: str, data_dir: Path, **mirror: Any) -> dict[str, Any]:
    return {
        "data_dir": str(data_dir),
        "mirror": {
            "bootstrap_servers": destination.split(","),
            "progress_interval_ms": 200,
            **mirror,
        },
    }


def start(source: Any, destination: Any, topics: list[str], work: Path) -> ReplicadProcess:
    data_dir = work / "data"
    return replicad_run(
        source.bootstrap,
        topics,
        data_dir,
        config=mirror_config(destination.bootstrap, data_dir),
        control_socket=work / "control.sock",
        start=True,
    )


def mirror_rows(proc: ReplicadProcess) -> dict[TopicPartition, dict[str, Any]]:
    status = proc.status() or {}
    return {
        TopicPartition(p["topic"], p["partition"]): p
        for p in (status.get("mirror") or {}).get("partitions", ())
    }


def wait_mirrored(
    proc: ReplicadProcess, ends: dict[TopicPartition, int], timeout_s: float = 90
) -> None:
    """Until every partition is mirrored up to the source's log end `ends`."""

    def done() -> bool:
        rows = mirror_rows(proc)
        for tp, end in ends.items():
            row = rows.get(tp)
            if row is None or row["error"]:
                assert row is None or not row["error"], f"{tp}: {row['error']}"
                return False
            if row["mirrored_offset"] < end:
                return False
        return True

    proc.wait_for(done, timeout_s=timeout_s, what=f"mirrored to {ends}")


def source_ends(broker: Any, topic: str) -> dict[TopicPartition, int]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ends"})
    try:
        return {
            TopicPartition(topic, p): consumer.get_watermark_offsets(KTP(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def without_offsets(records: list[ConsumedRecord]) -> list[tuple[Any, ...]]:
    return [(r.key, r.value, r.headers, r.timestamp) for r in records]


def test_mirror_keeps_records_codecs_and_offsets(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    plain, mixed = unique_topic("plain"), unique_topic("txn")
    for topic in (plain, mixed):
        kafka_broker.create_topic(topic, PARTITIONS)
    produce_mixed(
        kafka_broker.bootstrap,
        plain,
        partitions=PARTITIONS,
        records=1500,
        seed=3,
        transactional=False,
    )
    produce_mixed(kafka_broker.bootstrap, mixed, partitions=PARTITIONS, records=1500, seed=4)
    ends = {**source_ends(kafka_broker, plain), **source_ends(kafka_broker, mixed)}
    with start(kafka_broker, kafka_cluster, [plain, mixed], tmp_path) as proc:
        wait_mirrored(proc, ends)
        rows = mirror_rows(proc)
    for topic in (plain, mixed):
        want = consume_all(kafka_broker.bootstrap, topic, isolation=READ_COMMITTED)
        got = consume_all(kafka_cluster.bootstrap, topic, isolation=READ_COMMITTED)
        assert sorted(got) == list(range(PARTITIONS))
        for p in range(PARTITIONS):
            assert without_offsets(got[p]) == without_offsets(want[p]), f"{topic}-{p}"
            assert len(got[p]) > 0
            kept = rows[TopicPartition(topic, p)]["offsets_kept"]
            if topic == plain:
                # No markers, nothing aborted: every record keeps its offset.
                assert [r.offset for r in got[p]] == [r.offset for r in want[p]]
                assert kept is True
            else:
                # Markers and aborted records are not mirrored: offsets move, status says so.
                assert kept is False
    # The destination stores the source's codecs: no batch was re-compressed.
    for p in range(PARTITIONS):
        leader = kafka_cluster.leaders(plain)[p]
        dest = broker_batches(kafka_cluster.node(leader).log_dir, plain, p)
        src = broker_batches(kafka_broker.log_dir, plain, p)
        assert [b.codec for b in dest] == [b.codec for b in src]
        assert {b.codec for b in src} == set(CODECS)
