"""The source's retention, by size and by time, racing `replicad run` on real Kafka.

Kafka checks retention every `log.retention.check.interval.ms` (5 minutes by default, a
broker setting no topic can lower), so these tests run on a broker of their own config that
checks every half second, from the start (the one the tiered-storage test shares: the topics
here are not tiered). Topics roll small segments; size retention is `retention.bytes`. Time
retention is `retention.ms`, lowered to 1 ms once the follower has copied what it should
remove (Kafka then deletes every closed segment at its next check) and raised to an hour
again: it removes what the test says when the test says, where records stamped older than
now waited a fixed 20 s for the clock, in each round.

- Following: while the follower keeps up, the source's log start moves forward under it
  segment by segment; the follower never meets a gap (on_gap=halt would stop it), keeps every
  offset it copied (our own retention is separate and off), and `verify --against-source`
  reports what the source dropped as no longer there, the rest identical.
- Down while retention passes its end: the restarted follower meets the gap; on_gap=reset
  counts it with its size and starts again at the source's log start, in order; on_gap=halt
  stops the partition, says why, and leaves the replica as it was.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition

from replicad.types import TopicPartition
from tools.peers.admin import probe_consumer
from tools.peers.produce import CheckedProducer
from tools.replica import replicad_cli, replicad_run, segment_bytes, status_json, topic_ends
from tools.wait import wait_until

pytestmark = pytest.mark.kafka

SEGMENT_BYTES = 8 * 1024
ROUND_RECORDS = 40
VALUE = b"x" * 200
# Size: keep about four segments. Time: an hour, lowered to 1 ms when a test wants the
# closed segments gone (expire_by_time).
HOLD_MS = 3_600_000
EXPIRE_MS = 1
POLICIES = {
    "bytes": {"retention.bytes": str(4 * SEGMENT_BYTES)},
    "ms": {"retention.ms": str(HOLD_MS)},
}


@pytest.fixture
def broker(tiered_kafka_broker):
    """The broker checking retention every 500 ms (tests/follower/conftest.py); the topics
    here are not tiered."""
    return tiered_kafka_broker[0]


def produce_round(bootstrap: str, topic: str, first: int) -> int:
    """ROUND_RECORDS records into partition 0 (more than a segment: the last one rolls);
    the next record's number."""
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 2048})
    for i in range(first, first + ROUND_RECORDS):
        producer.produce(topic, value=b"%08d" % i + VALUE, partition=0)
    assert producer.flush(60) == 0
    return first + ROUND_RECORDS


def set_retention_ms(broker, topic: str, ms: int) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    change = ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[change])
    admin = broker.admin()  # held: futures fail once their client is gone
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(60)


def expire_by_time(broker, topic: str) -> int:
    """Kafka's time retention of every closed segment of partition 0: retention.ms 1 ms
    until the source's log start has moved, then an hour again. The new log start."""
    before = source_bounds(broker.bootstrap, topic)[0]
    set_retention_ms(broker, topic, EXPIRE_MS)
    try:
        return wait_until(
            lambda: (start := source_bounds(broker.bootstrap, topic)[0]) > before and start,
            interval_s=0.2,
            what="time retention to move the source's log start",
        )
    finally:
        set_retention_ms(broker, topic, HOLD_MS)


def source_bounds(bootstrap: str, topic: str) -> tuple[int, int]:
    """The source's (log start, high watermark) of partition 0."""
    consumer = probe_consumer(bootstrap)
    try:
        return consumer.get_watermark_offsets(KafkaTopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()


def partition_status(sock: Path, topic: str) -> dict | None:
    snapshot = status_json(sock)
    if snapshot is None:
        return None
    return next((p for p in snapshot["partitions"] if p["topic"] == topic), None)


def config_file(tmp_path: Path, on_gap: str) -> Path:
    path = tmp_path / "replicad.yaml"
    path.write_text(f"topics:\n  on_gap: {on_gap}\n")
    return path


def verify_against_source(data_dir: Path, bootstrap: str) -> dict:
    done = replicad_cli(
        "verify", str(data_dir), "--against-source", "--bootstrap-servers", bootstrap, "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["partitions"][0]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_follower_keeps_up_while_retention_moves_the_source_start(
    broker, unique_topic, tmp_path, policy
):
    topic = unique_topic(policy)
    broker.create_topic(topic, 1, POLICIES[policy], segment_bytes=SEGMENT_BYTES)
    data_dir, sock = tmp_path / "data", tmp_path / "c.sock"
    proc = replicad_run(
        broker.bootstrap,
        [topic],
        data_dir,
        config=config_file(tmp_path, "halt"),
        control_socket=sock,
    )
    produced = 0
    rounds_after_start_moved = 0
    with proc:
        proc.wait_ready()

        def one_round() -> bool:
            """A round produced and copied; done once retention moved the source's start
            several times under the follower."""
            nonlocal produced, rounds_after_start_moved
            produced = produce_round(broker.bootstrap, topic, produced)
            proc.wait_caught_up({TopicPartition(topic, 0): produced})
            if policy == "ms":
                expire_by_time(broker, topic)
            if source_bounds(broker.bootstrap, topic)[0] > 0:
                rounds_after_start_moved += 1
            return rounds_after_start_moved >= 3

        wait_until(one_round, interval_s=0, what="retention to move the source's log start")
        part = partition_status(sock, topic)
    log_start, high_watermark = source_bounds(broker.bootstrap, topic)
    assert 0 < log_start <= high_watermark == produced
    assert part is not None
    assert part["state"] == "fetching" and part["last_error"] is None
    assert (part["gaps"], part["gap_offsets"]) == (0, 0)
    assert part["leader_log_start_offset"] > 0
    # Everything copied is kept: the replica still starts at 0.
    assert part["log_start_offset"] == 0 and topic_ends(data_dir, topic) == {0: produced}
    assert replicad_cli("verify", str(data_dir)).returncode == 0

    entry = verify_against_source(data_dir, broker.bootstrap)
    # Time retention goes on while nothing is produced: the start verify met lies between.
    start_after = source_bounds(broker.bootstrap, topic)[0]
    assert entry["mismatches"] == [] and entry["clean"]
    ((gone),) = entry["gone_at_source"]
    assert gone["start"] == 0 and log_start <= gone["end"] <= start_after
    assert entry["verified_to"] == produced


@pytest.mark.parametrize(("on_gap", "policy"), [("reset", "bytes"), ("halt", "ms")])
def test_retention_past_a_stopped_followers_end_is_a_gap_by_on_gap(
    broker, unique_topic, tmp_path, on_gap, policy
):
    topic = unique_topic(on_gap)
    broker.create_topic(topic, 1, POLICIES[policy], segment_bytes=SEGMENT_BYTES)
    data_dir, sock = tmp_path / "data", tmp_path / "c.sock"
    config = config_file(tmp_path, on_gap)
    with replicad_run(broker.bootstrap, [topic], data_dir, config=config) as proc:
        proc.wait_ready()
        produced = produce_round(broker.bootstrap, topic, 0)
        proc.wait_caught_up({TopicPartition(topic, 0): produced})
    copied = produced
    before = segment_bytes(data_dir / f"{topic}-0")

    def retention_passed_our_end() -> bool:
        nonlocal produced
        if source_bounds(broker.bootstrap, topic)[0] > copied:
            return True
        produced = produce_round(broker.bootstrap, topic, produced)
        if policy == "ms":
            expire_by_time(broker, topic)
        return False

    wait_until(retention_passed_our_end, interval_s=0.5, what="retention past the replica's end")
    log_start = source_bounds(broker.bootstrap, topic)[0]

    proc = replicad_run(broker.bootstrap, [topic], data_dir, config=config, control_socket=sock)
    with proc:
        if on_gap == "reset":
            proc.wait_caught_up({TopicPartition(topic, 0): produced})
        else:
            proc.wait_for(
                lambda: (partition_status(sock, topic) or {}).get("state") == "halted",
                what="the partition to halt",
            )
        part = partition_status(sock, topic)
        totals = (status_json(sock) or {}).get("totals", {})
    assert part is not None
    assert replicad_cli("verify", str(data_dir)).returncode == 0  # nothing out of order
    if on_gap == "reset":
        assert (part["gaps"], part["gap_offsets"]) == (1, log_start - copied)
        assert (totals["gaps"], totals["gap_offsets"]) == (1, log_start - copied)
        assert part["log_start_offset"] == log_start and part["state"] == "fetching"
        assert "skipping the gap (on_gap=reset)" in proc.output()
        entry = verify_against_source(data_dir, broker.bootstrap)
        assert entry["clean"] and entry["verified_to"] == produced
        assert entry["replica"]["start"] >= log_start
    else:
        assert (part["gaps"], part["gap_offsets"]) == (1, 0)
        # (Time retention may have moved the start further by the time it was asked.)
        said = re.search(
            r"gap: leader starts at (\d+), local log ends at (\d+)", part["last_error"]
        )
        assert said is not None, part["last_error"]
        assert int(said[1]) >= log_start and int(said[2]) == copied
        assert segment_bytes(data_dir / f"{topic}-0") == before  # kept as it was
        assert topic_ends(data_dir, topic) == {0: copied}
