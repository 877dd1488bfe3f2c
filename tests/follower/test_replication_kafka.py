"""`replicad run` against a real Apache Kafka broker (KRaft, from Maven Central jars).

The replica is compared with the broker's own segment files: same batches,
byte for byte, over the same offsets.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicad.control.client import query
from replicad.errors import ControlError
from replicad.types import TopicPartition
from tools.peers.produce import produce_mixed, produce_numbered
from tools.replica import (
    batches_from,
    end_offsets,
    log_end_offset,
    replicad_cli,
    replicad_run,
    segment_bytes,
    wait_until,
)

pytestmark = pytest.mark.kafka

TOPICS = ("orders", "payments", "audit")
PARTITIONS = 8
RECORDS_PER_TOPIC = 70_000  # 3 x 70,000 = 210,000 records


@pytest.fixture(scope="module")
def mixed_topics(kafka_broker):
    """Three topics x 8 partitions of mixed-codec, transactional data, produced once."""
    names = [f"{t}-{os.getpid()}" for t in TOPICS]
    for seed, name in enumerate(names):
        kafka_broker.create_topic(name, PARTITIONS)
        produce_mixed(
            kafka_broker.bootstrap,
            name,
            partitions=PARTITIONS,
            records=RECORDS_PER_TOPIC,
            seed=seed,
        )
    return names


def broker_ends(broker, topics) -> dict:
    return {
        (t, p): log_end_offset(broker.partition_dir(t, p))
        for t in topics
        for p in range(PARTITIONS)
    }


def replica_ends(data_dir: Path) -> dict:
    return {(tp.topic, tp.partition): end for tp, end in end_offsets(data_dir).items()}


def caught_up(broker, topics, data_dir: Path) -> bool:
    want = broker_ends(broker, topics)
    got = replica_ends(data_dir)
    return all(got.get(k) == v for k, v in want.items())


def assert_byte_identical(broker, topics, data_dir: Path) -> None:
    for t in topics:
        for p in range(PARTITIONS):
            ours = segment_bytes(data_dir / f"{t}-{p}")
            theirs = batches_from(segment_bytes(broker.partition_dir(t, p)))
            assert len(ours) == len(theirs), f"{t}-{p}: {len(ours)} vs {len(theirs)} bytes"
            assert ours == theirs, f"{t}-{p}: replica differs from the broker's segments"


def test_replica_is_byte_identical_to_the_brokers_segments(kafka_broker, mixed_topics, tmp_path):
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, mixed_topics, data_dir) as proc:
        proc.wait_for(
            lambda: caught_up(kafka_broker, mixed_topics, data_dir),
            timeout_s=180,
            what="replica to catch up",
        )
    assert "Traceback" not in proc.output()
    total = sum(replica_ends(data_dir).values())
    assert total >= 200_000  # offsets include the transaction markers
    assert_byte_identical(kafka_broker, mixed_topics, data_dir)
    # a clean stop leaves Kafka's checkpoint files behind
    for name in ("replication-offset-checkpoint", "recovery-point-offset-checkpoint"):
        assert (data_dir / name).exists(), name
    # and our own offline check agrees
    verify = replicad_cli("verify", str(data_dir), timeout_s=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_sigkill_mid_replication_resumes_without_gap_or_duplicate(
    kafka_broker, mixed_topics, tmp_path
):
    data_dir = tmp_path / "data"
    # Small responses so that the kill lands mid-replication.
    config = {"fetch": {"response_max_bytes": 65536, "partition_max_bytes": 16384}}
    want = sum(broker_ends(kafka_broker, mixed_topics).values())
    kills = 0
    for _ in range(3):
        proc = replicad_run(kafka_broker.bootstrap, mixed_topics, data_dir, config=config)
        before = sum(replica_ends(data_dir).values())
        # A tenth more, or all that is left when less is.
        target = min(before + want // 10 + 1, want)
        try:
            wait_until(
                lambda t=target: sum(replica_ends(data_dir).values()) >= t,
                timeout_s=120,
                what="progress before the kill",
            )
        finally:
            proc.kill()
        kills += 1
        if sum(replica_ends(data_dir).values()) >= want:
            break
    assert kills >= 1
    restarted = replicad_run(
        kafka_broker.bootstrap, mixed_topics, data_dir, log_path=tmp_path / "r2.log"
    )
    with restarted:
        # The kills may already have left a complete replica: what is checked is that the
        # restarted daemon runs (recovery, metadata) and ends with a clean stop.
        restarted.wait_ready(timeout_s=120)
        restarted.wait_for(
            lambda: caught_up(kafka_broker, mixed_topics, data_dir),
            timeout_s=180,
            what="replica to catch up after SIGKILL",
        )
    assert_byte_identical(kafka_broker, mixed_topics, data_dir)


def test_hot_partition_does_not_starve_cold_ones(kafka_broker, tmp_path):
    """KIP-74: with a response limit far below the hot partition's backlog, the
    cold partitions still finish long before the hot one (rotation)."""
    topic = f"hotcold-{os.getpid()}"
    partitions = 12
    kafka_broker.create_topic(topic, partitions)
    from tools.peers.produce import CheckedProducer

    producer = CheckedProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5, "batch.size": 16384}
    )
    value = os.urandom(1000)
    for i in range(16_000):  # ~16 MB into partition 0
        producer.produce(topic, value=value, partition=0)
        if i % 1000 == 0:
            producer.poll(0)
    for p in range(1, partitions):
        for _ in range(20):
            producer.produce(topic, value=value, partition=p)
    producer.flush(60)

    data_dir = tmp_path / "data"
    # One 16 KiB batch a response: the hot backlog takes about a thousand round trips.
    config = {
        "fetch": {
            "response_max_bytes": 16384,
            "partition_max_bytes": 16384,
            "buffer_memory": 1048576,
        }
    }
    sock = tmp_path / "replicad.sock"

    def ends_now() -> dict[int, int]:
        # The daemon's own view, asked every few milliseconds: replication of the whole
        # topic takes about a second, far less than reading the segments back would.
        try:
            return {p["partition"]: p["log_end_offset"] for p in query(sock)["partitions"]}
        except ControlError:
            return {}

    hot_end_when_cold_done: list[int] = []

    def cold_done() -> bool:
        ends = ends_now()
        if ends and all(ends.get(p) == 20 for p in range(1, partitions)):
            hot_end_when_cold_done.append(ends[0])
        return bool(hot_end_when_cold_done)

    with replicad_run(
        kafka_broker.bootstrap, [topic], data_dir, config=config, control_socket=sock
    ) as proc:
        proc.wait_for(cold_done, timeout_s=120, interval_s=0.003, what="cold partitions done")
        proc.wait_for(
            lambda: replica_ends(data_dir).get((topic, 0)) == 16_000,
            timeout_s=180,
            what="hot partition to catch up",
        )
    # The cold partitions were served while the hot one still had a backlog.
    assert hot_end_when_cold_done[0] < 16_000 * 0.9, hot_end_when_cold_done


def test_bad_config_names_the_key_and_exits_78(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "source:\n  bootstrap_servers: [127.0.0.1:9092]\n  bootstap: x\n"
        "topics:\n  include: [a]\nfetch:\n  partition_max_bytes: big\n"
    )
    result = replicad_cli("run", "-c", str(bad))
    assert result.returncode == 78
    assert "source.bootstap" in result.stderr
    assert "fetch.partition_max_bytes" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_unreachable_bootstrap_retries_with_a_clear_message(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with replicad_run(f"127.0.0.1:{port}", "x", tmp_path / "data") as proc:
        # Each attempt says so: a second message is a retry, the daemon still running.
        proc.wait_for(
            lambda: proc.output().count("metadata unavailable") >= 2, what="a second attempt"
        )
        assert proc.running, proc.output()
    out = proc.output()
    assert f"127.0.0.1:{port}" in out
    assert "Traceback" not in out


def test_start_from_latest_skips_existing_data(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    produce_numbered(kafka_broker.bootstrap, topic, 2, 30)
    data_dir = tmp_path / "data"
    latest = replicad_run(
        kafka_broker.bootstrap, [topic], data_dir, extra=["--start-from", "latest"]
    )
    with latest as proc:
        proc.wait_for(lambda: "starting partition" in proc.output(), timeout_s=30, what="start")
        proc.wait_for(
            lambda: proc.output().count("starting partition") == 2, timeout_s=30, what="both"
        )
        produce_numbered(kafka_broker.bootstrap, topic, 2, 5)
        proc.wait_caught_up({TopicPartition(topic, 0): 35, TopicPartition(topic, 1): 35})
    for p in range(2):
        ours = segment_bytes(data_dir / f"{topic}-{p}")
        theirs = batches_from(segment_bytes(kafka_broker.partition_dir(topic, p)), 30)
        assert ours == theirs  # only what came after the start, byte for byte
        # the local log starts where replication started: Kafka's own name for it
        assert sorted(f.name for f in (data_dir / f"{topic}-{p}").glob("*.log")) == [
            f"{30:020d}.log"
        ]


def test_partitions_added_while_running_are_picked_up(kafka_broker, unique_topic, tmp_path):
    from confluent_kafka.admin import NewPartitions

    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    produce_numbered(kafka_broker.bootstrap, topic, 2, 10)
    data_dir = tmp_path / "data"
    config = {"source": {"metadata_max_age_ms": 1000}}
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=config) as proc:
        proc.wait_caught_up({TopicPartition(topic, 0): 10, TopicPartition(topic, 1): 10})
        admin = kafka_broker.admin()  # held: a collected client cancels its futures
        futures = admin.create_partitions([NewPartitions(topic, 4)])
        futures[topic].result(30)
        produce_numbered(kafka_broker.bootstrap, topic, 4, 7)
        proc.wait_caught_up({TopicPartition(topic, p): 17 if p < 2 else 7 for p in range(4)})


def test_recreated_topic_halts_the_partition_and_keeps_the_replica(
    kafka_broker, unique_topic, tmp_path
):

    topic = unique_topic()
    kafka_broker.create_topic(topic, 1)
    produce_numbered(kafka_broker.bootstrap, topic, 1, 40)
    data_dir, sock = tmp_path / "data", tmp_path / "c.sock"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, control_socket=sock) as proc:
        proc.wait_caught_up({TopicPartition(topic, 0): 40}, timeout_s=60)
    before = segment_bytes(data_dir / f"{topic}-0")

    admin = kafka_broker.admin()
    admin.delete_topics([topic])[topic].result(30)
    wait_until(
        lambda: topic not in admin.list_topics(timeout=5).topics,
        timeout_s=60,
        what="topic deletion",
    )
    kafka_broker.create_topic(topic, 1)  # same name, new topic id, new history
    produce_numbered(kafka_broker.bootstrap, topic, 1, 5)

    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, control_socket=sock) as proc:

        def halted() -> bool:
            snap = proc.status()
            return snap is not None and [p["state"] for p in snap["partitions"]] == ["halted"]

        proc.wait_for(halted, what="the partition to halt")
        proc.wait_for(
            lambda: "topic recreated upstream" in proc.output(), what="the halt's reason logged"
        )
    assert segment_bytes(data_dir / f"{topic}-0") == before  # the old replica is untouched
