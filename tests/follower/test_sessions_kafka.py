"""Incremental fetch sessions and offset reconciliation against real Apache Kafka.

What is measured comes from the daemon's own status snapshot (`replicad status
--json`): the fetch frames it wrote and read, its session id and epoch, and its
recoveries by reason.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import TopicPartition as KafkaTopicPartition

from tools.peers.produce import produce_numbered as produce
from tools.replica import (
    batches_from,
    replicad_run,
    segment_bytes,
    status_json,
    wait_until,
)
from tools.replica import topic_ends as ends


def status(sock: Path) -> dict:
    snapshot = status_json(sock)
    assert snapshot is not None, f"no daemon answers on {sock}"
    return snapshot


def status_or_none(sock: Path) -> dict | None:
    """The snapshot, or None while the daemon cannot be asked yet."""
    return status_json(sock)


def partitions_of(sock: Path) -> list[dict]:
    snap = status_or_none(sock)
    return snap["partitions"] if snap else []


def start(tmp_path: Path, bootstrap: str, *args: str, config: str = "") -> tuple:
    data_dir, sock = tmp_path / "data", tmp_path / "c.sock"
    cfg = tmp_path / "replicad.yaml"
    cfg.write_text(config or "{}\n")
    proc = replicad_run(bootstrap, None, data_dir, config=cfg, control_socket=sock, extra=args)
    return proc, data_dir, sock


def test_broker_restart_recovers_within_one_round_trip(make_kafka_broker, tmp_path):
    broker = make_kafka_broker()
    topic = "restart"
    broker.create_topic(topic, 4)
    produce(broker.bootstrap, topic, 4, 100, b"a")
    proc, data_dir, sock = start(tmp_path, broker.bootstrap, "--topics", topic)
    try:
        wait_until(
            lambda: ends(data_dir, topic) == dict.fromkeys(range(4), 100),
            timeout_s=60,
            what="first data",
        )
        before = status(sock)["leaders"][0]
        assert before["sessionful"] and before["incremental_requests"] > 0
        broker.restart()  # the broker's session cache is gone
        produce(broker.bootstrap, topic, 4, 50, b"b")
        wait_until(
            lambda: ends(data_dir, topic) == dict.fromkeys(range(4), 150),
            timeout_s=90,
            what="data produced after the restart",
        )

        def new_session_in_use() -> dict | None:
            now = status(sock)["leaders"][0]
            moved_on = now["session_id"] != before["session_id"]
            round_trips = now["incremental_requests"] - before["incremental_requests"]
            return now if now["sessionful"] and moved_on and round_trips >= 3 else None

        after = wait_until(new_session_in_use, what="a few idle round trips on the new session")
    finally:
        assert proc.stop() == 0, proc.output()
    # One recovery for the lost connection; the first response afterwards was good:
    # nothing rejected, the new session is incremental again.
    assert sum(after["session_recoveries"].values()) == 1, after["session_recoveries"]
    assert after["rejected_responses"] == 0
    assert after["sessionful"] and after["session_id"] != before["session_id"]
    assert after["incremental_requests"] > before["incremental_requests"]
    for p in range(4):
        ours = segment_bytes(data_dir / f"{topic}-{p}")
        assert ours == batches_from(segment_bytes(broker.partition_dir(topic, p)))


def _delete_records(broker, topic: str, offset: int) -> None:
    admin = broker.admin()  # held: a collected client cancels its futures
    futures = admin.delete_records([KafkaTopicPartition(topic, 0, offset)])
    for future in futures.values():
        future.result(30)


def test_out_of_range_reset_skips_to_the_leaders_start(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.bootstrap, topic, 1, 100)
    proc, data_dir, _ = start(tmp_path, kafka_broker.bootstrap, "--topics", topic)
    try:
        wait_until(lambda: ends(data_dir, topic) == {0: 100}, timeout_s=60, what="first data")
    finally:
        assert proc.stop() == 0
    produce(kafka_broker.bootstrap, topic, 1, 100)  # 100..199 while we are down
    _delete_records(kafka_broker, topic, 150)  # ...and the leader drops below 150
    proc, data_dir, sock = start(tmp_path, kafka_broker.bootstrap, "--topics", topic)
    try:
        wait_until(lambda: ends(data_dir, topic) == {0: 200}, timeout_s=60, what="catch-up")
        snap = status(sock)
    finally:
        assert proc.stop() == 0
    out = proc.output()
    assert "skipping the gap (on_gap=reset)" in out
    # Counted with its size, where an operator looks: offsets 100..149 were never copied.
    (part,) = [p for p in snap["partitions"] if p["topic"] == topic]
    assert (part["gaps"], part["gap_offsets"]) == (1, 50)
    assert (snap["totals"]["gaps"], snap["totals"]["gap_offsets"]) == (1, 50)
    ours = segment_bytes(data_dir / f"{topic}-0")
    # Kafka's follower rule: everything before the leader's start is gone, and the
    # replica restarts at the batch holding the leader's log start.
    assert ours == batches_from(segment_bytes(kafka_broker.partition_dir(topic, 0)), 150)


def test_out_of_range_halt_stops_the_partition_and_says_why(kafka_broker, unique_topic, tmp_path):
    topic, other = unique_topic(), unique_topic()
    kafka_broker.create_topic(topic, 1)
    kafka_broker.create_topic(other, 1)
    produce(kafka_broker.bootstrap, topic, 1, 100)
    config = "topics:\n  on_gap: halt\n"
    topics = ("--topics", f"{topic},{other}")
    proc, data_dir, sock = start(tmp_path, kafka_broker.bootstrap, *topics, config=config)
    try:
        wait_until(lambda: ends(data_dir, topic) == {0: 100}, timeout_s=60, what="first data")
    finally:
        assert proc.stop() == 0
    produce(kafka_broker.bootstrap, topic, 1, 100)
    _delete_records(kafka_broker, topic, 150)
    proc, data_dir, sock = start(tmp_path, kafka_broker.bootstrap, *topics, config=config)
    try:
        wait_until(
            lambda: any(p["state"] == "halted" for p in partitions_of(sock)),
            timeout_s=60,
            what="the partition to halt",
        )
        produce(kafka_broker.bootstrap, other, 1, 10)  # the rest keeps replicating
        wait_until(lambda: ends(data_dir, other) == {0: 10}, timeout_s=60, what="other topic")
        snap = status(sock)
        assert proc.running
    finally:
        assert proc.stop() == 0
    halted = next(p for p in snap["partitions"] if p["topic"] == topic)
    assert halted["state"] == "halted"
    assert (halted["gaps"], halted["gap_offsets"]) == (1, 0)
    assert "gap: leader starts at 150" in halted["last_error"]
    assert ends(data_dir, topic) == {0: 100}  # nothing skipped, nothing lost
    assert "partition halted (on_gap=halt)" in proc.output()


def _idle_request_bytes(sock: Path, partitions: int) -> tuple[int, dict]:
    """The size of an idle fetch request once `partitions` are replicated and idle."""

    def steady() -> bool:
        snap = status_or_none(sock)
        if snap is None:
            return False
        totals, leaders = snap["totals"], snap["leaders"]
        return (
            totals["partitions_by_state"] == {"fetching": partitions}
            and totals["lag"] == 0
            and len(leaders) == 1
            and leaders[0]["partitions"] == partitions
        )

    wait_until(steady, timeout_s=180, what=f"{partitions} partitions fetching with no lag")

    def after_round_trips(count: int) -> dict:
        start = status(sock)["leaders"][0]["requests"]
        return wait_until(
            lambda: (now := status(sock)["leaders"][0])["requests"] >= start + count and now,
            what=f"{count} more round trips",
        )

    after_round_trips(3)  # the session has caught up with the wants
    samples = [after_round_trips(1)["last_request_bytes"] for _ in range(3)]
    return max(samples), status(sock)["leaders"][0]


def test_idle_request_size_stays_flat_as_partitions_grow(kafka_broker, unique_topic, tmp_path):
    prefix = unique_topic()
    # 10 -> 200 -> 500 idle partitions: enough that a request naming them would be kilobytes
    # (the sessionless test below measures about 20 bytes a partition); every partition
    # created here weighs on the session broker every other test shares.
    growth = [10, 190, 300]
    kafka_broker.create_topic(f"{prefix}-0", growth[0])
    produce(kafka_broker.bootstrap, f"{prefix}-0", growth[0], 1)
    config = "source:\n  metadata_max_age_ms: 1000\n"
    proc, _, sock = start(
        tmp_path, kafka_broker.bootstrap, "--topics-regex", f"{prefix}-.*", config=config
    )
    sizes = {}
    try:
        total = 0
        for i, n in enumerate(growth):
            if i:
                kafka_broker.create_topic(f"{prefix}-{i}", n, timeout_s=120)
            total += n
            sizes[total], leader = _idle_request_bytes(sock, total)
        assert leader["session_recoveries"] == {}
        assert leader["sessionful"]
    finally:
        assert proc.stop() == 0, proc.output()
    small, large = sizes[growth[0]], sizes[sum(growth)]
    # An idle incremental request names no partition: its size does not grow with them.
    assert large <= small + 16, sizes
    assert large < 200, sizes


def test_without_sessions_the_idle_request_grows(kafka_broker, unique_topic, tmp_path):
    """The measurement above can fail: sessionless full fetches grow with partitions."""
    prefix = unique_topic()
    kafka_broker.create_topic(f"{prefix}-0", 10)
    # Every partition in each request: without the share (fetch.sessionless_max_partitions,
    # 100 by default) a sessionless request names all 500.
    config = (
        "source:\n  metadata_max_age_ms: 1000\n"
        "fetch:\n  sessions: false\n  sessionless_max_partitions: 1000\n"
    )
    proc, _, sock = start(
        tmp_path, kafka_broker.bootstrap, "--topics-regex", f"{prefix}-.*", config=config
    )
    try:
        small, _ = _idle_request_bytes(sock, 10)
        kafka_broker.create_topic(f"{prefix}-1", 490, timeout_s=120)
        large, leader = _idle_request_bytes(sock, 500)
    finally:
        assert proc.stop() == 0
    assert not leader["sessionful"] and leader["incremental_requests"] == 0
    assert large > small + 490 * 20  # every partition costs bytes in every request
