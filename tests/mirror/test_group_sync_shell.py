"""Consumer groups fail over with the data: `replicad run` mirrors from the session's
Kafka broker into the session's three-node cluster and syncs group offsets
(replicad/mirror/group_sync_shell.py); real consumers nobody here wrote read part of a
topic at the source, commit, and go on at the destination with the same group id: every
record after their last commit exactly once, none before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.peers.produce import produce_numbered
from tools.replica import ReplicadProcess, replicad_run

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 60
PREFIX = "dr."
# Records read of each partition at the source before the application stops.
READ_EACH = 20
# What the application commits with its offsets; the destination must keep it.
METADATA = "app-meta"


def start(source: Any, destination: Any, topics: list[str], work: Path) -> ReplicadProcess:
    data_dir = work / "data"
    return replicad_run(
        source.bootstrap,
        topics,
        data_dir,
        config={
            "data_dir": str(data_dir),
            "mirror": {
                "bootstrap_servers": destination.bootstrap.split(","),
                "progress_interval_ms": 200,
                "topic_prefix": PREFIX,
            },
            "groups": {"enabled": True, "sync_interval_ms": 300},
        },
        control_socket=work / "control.sock",
        start=True,
    )


def group_row(proc: ReplicadProcess, group: str) -> dict[str, Any]:
    status = proc.status() or {}
    return ((status.get("mirror") or {}).get("groups") or {}).get("groups", {}).get(group) or {}


def wait_synced(proc: ReplicadProcess, group: str, partitions: int = PARTITIONS) -> None:
    """Until `group`'s every partition is synced, none held back, its commits taken."""

    def done() -> bool:
        row = group_row(proc, group)
        assert row.get("state") != "failed_over", row
        return (
            row.get("partitions") == partitions
            and row.get("held_back_partitions") == 0
            and row.get("sync_lag_ms") == 0
            and row.get("last_sync_ms") is not None
            and not row.get("error")
        )

    try:
        proc.wait_for(done, timeout_s=90, what=f"group {group} synced")
    except TimeoutError as exc:
        mirror = (proc.status() or {}).get("mirror")
        raise AssertionError(f"{exc}; the mirror: {mirror}") from None


def transactional_topic(bootstrap: str, topic: str) -> None:
    """Committed and aborted transactions in each partition: values p<partition>-<i> for
    committed records, "aborted" for the others, so offsets shift at the destination."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 5}
    )
    producer.init_transactions(30)
    counts = [0] * PARTITIONS
    for round_ in range(6):
        for abort in (False, True):
            producer.begin_transaction()
            for partition in range(PARTITIONS):
                for _ in range(PER_PARTITION // 6 if not abort else 3):
                    if abort:
                        value = b"aborted"
                    else:
                        value = b"p%d-%d" % (partition, counts[partition])
                        counts[partition] += 1
                    producer.produce(topic, value=value, partition=partition)
            if abort:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        del round_
    producer.flush(30)


def read_part_with_kafka_python(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """A group member (subscribe, read_committed) reads until it has READ_EACH records of
    every partition, commits what it read (with metadata) and leaves; returns the
    committed offsets."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_poll_records=7,
        consumer_timeout_ms=60_000,
    )
    consumer.subscribe([topic])
    counts = [0] * PARTITIONS
    next_offset: dict[int, int] = {}
    for message in consumer:
        counts[message.partition] += 1
        next_offset[message.partition] = message.offset + 1
        if min(counts) >= READ_EACH:
            break
    consumer.commit(
        {KTP(topic, p): OffsetAndMetadata(o, METADATA, -1) for p, o in next_offset.items()}
    )
    consumer.close()
    return next_offset


def consume_rest_with_kafka_python(bootstrap: str, topic: str, group: str, expected: int) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        # A missing or wrong commit shows: earliest re-reads, so the records differ.
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=60_000,
    )
    consumer.subscribe([topic])
    read = []
    for message in consumer:
        read.append((message.partition, message.value))
        if len(read) >= expected:
            break
    consumer.close()
    return read


def all_values(bootstrap: str, topic: str) -> list[tuple[int, int, bytes]]:
    """Every committed record of `topic` at the source: (partition, offset, value)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=5_000,
    )
    parts = [KTP(topic, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    ends = consumer.end_offsets(parts)
    out: list[tuple[int, int, bytes]] = []
    for p in parts:
        while consumer.position(p) < ends[p]:
            for records in consumer.poll(timeout_ms=2_000, max_records=500).values():
                out.extend((r.partition, r.offset, r.value) for r in records)
    consumer.close()
    return out


def destination_committed(bootstrap: str, topic: str, group: str) -> dict[int, Any]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        return {p: consumer.committed(KTP(topic, p), metadata=True) for p in range(PARTITIONS)}
    finally:
        consumer.close()


@pytest.mark.parametrize("kind", ["kept", "mapped"])
def test_kafka_python_group_fails_over_exactly(
    kind: str, kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    topic = unique_topic(kind)
    group = f"app-{topic}"
    kafka_broker.create_topic(topic, PARTITIONS)
    if kind == "kept":
        produce_numbered(kafka_broker.bootstrap, topic, PARTITIONS, PER_PARTITION)
    else:
        transactional_topic(kafka_broker.bootstrap, topic)
    everything = all_values(kafka_broker.bootstrap, topic)
    assert b"aborted" not in {v for _, _, v in everything}
    committed = read_part_with_kafka_python(kafka_broker.bootstrap, topic, group)
    assert sorted(committed) == list(range(PARTITIONS))
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_synced(proc, group)
        rows = proc.status()["mirror"]["partitions"]
        assert all(r["offsets_kept"] is (kind == "kept") for r in rows), rows
    there = destination_committed(kafka_cluster.bootstrap, PREFIX + topic, group)
    assert {p: c.metadata for p, c in there.items()} == dict.fromkeys(range(PARTITIONS), METADATA)
    if kind == "kept":
        assert {p: c.offset for p, c in there.items()} == committed
    else:
        assert {p: c.offset for p, c in there.items()} != committed  # translated
    expected = [(p, v) for p, o, v in everything if o >= committed[p]]
    rest = consume_rest_with_kafka_python(
        kafka_cluster.bootstrap, PREFIX + topic, group, len(expected)
    )
    assert sorted(rest) == sorted(expected)
    assert len(rest) == len(set(rest))
