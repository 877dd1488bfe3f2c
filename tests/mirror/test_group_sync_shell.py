"""Consumer groups fail over with the data: `replicad run` mirrors from the session's
Kafka broker into the session's three-node cluster and syncs group offsets
(replicad/mirror/group_sync_shell.py); real consumers nobody here wrote read part of a
topic at the source, commit, and go on at the destination with the same group id: every
record after their last commit exactly once, none before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from replicad.types import TopicPartition
from tools.peers.group_member import subscribe_knowing
from tools.peers.kafka import CONSOLE_CONSUMER, run_kafka_class
from tools.peers.produce import CheckedProducer, produce_numbered
from tools.replica import ReplicadProcess, replicad_run
from tools.wait import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 60
PREFIX = "dr."
# Records read of each partition at the source before the application stops.
READ_EACH = 20
# What the application commits with its offsets; the destination must keep it.
METADATA = "app-meta"
# Every wait's deadline: what only a hang reaches. A kafka-python member's first assignment
# on the destination took over 60 s at load 64 (a fresh-clone run beside six engineers).
HANG_S = 300


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
        proc.wait_for(done, timeout_s=HANG_S, what=f"group {group} synced")
    except TimeoutError as exc:
        mirror = (proc.status() or {}).get("mirror")
        raise AssertionError(f"{exc}; the mirror: {mirror}") from None


def transactional_topic(bootstrap: str, topic: str) -> None:
    """Committed and aborted transactions in each partition: values p<partition>-<i> for
    committed records, "aborted" for the others, so offsets shift at the destination."""
    producer = CheckedProducer(
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
                # Written before the abort (which would purge what is still queued, and
                # CheckedProducer's flush would count those as lost).
                producer.flush(30)
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        del round_
    producer.flush(30)  # PeerError unless every record was delivered


def committed_reader(bootstrap: str, topic: str, group: str, **settings: Any) -> Any:
    """A kafka-python member of `group` subscribed to `topic`: read_committed, from the
    group's commit, commits by hand; its iteration ends after 60 s without a record."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        # A missing or wrong commit shows: earliest re-reads, so the records differ.
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=60_000,
        **settings,
    )
    subscribe_knowing(consumer, [topic])
    return consumer


def read_part_with_kafka_python(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """A group member (subscribe, read_committed) reads until it has READ_EACH records of
    every partition, commits what it read (with metadata) and leaves; returns the
    committed offsets."""
    consumer = committed_reader(bootstrap, topic, group, max_poll_records=7)
    counts = [0] * PARTITIONS
    next_offset: dict[int, int] = {}
    for message in consumer:
        counts[message.partition] += 1
        next_offset[message.partition] = message.offset + 1
        if min(counts) >= READ_EACH:
            break
    consumer.commit(kafka_python_offsets(topic, next_offset, METADATA))
    consumer.close()
    return next_offset


def consume_rest_with_kafka_python(bootstrap: str, topic: str, group: str, expected: int) -> list:
    consumer = committed_reader(bootstrap, topic, group)
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


def mirror_cli(proc: ReplicadProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicad.cli", "mirror", *args,
         "--socket", str(proc.control_socket)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def groups_of(proc: ReplicadProcess) -> dict[str, Any]:
    return ((proc.status() or {}).get("mirror") or {}).get("groups") or {}


def wait_running(proc: ReplicadProcess) -> None:
    proc.wait_for(
        lambda: ((proc.status() or {}).get("mirror") or {}).get("running") is True,
        timeout_s=HANG_S,
        what="the mirror running",
    )


def wait_rounds(proc: ReplicadProcess, more: int) -> None:
    """Until the group sync has run `more` more rounds."""
    start_round = groups_of(proc).get("rounds", 0)
    try:
        proc.wait_for(
            lambda: groups_of(proc).get("rounds", 0) >= start_round + more,
            timeout_s=HANG_S,
            what=f"{more} more group sync rounds",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc} (from {start_round}): {groups_of(proc)}") from None


def dest_offset(bootstrap: str, topic: str, group: str, partition: int = 0) -> int | None:
    committed = destination_committed(bootstrap, topic, group)[partition]
    return None if committed is None else committed.offset


def commit_at(bootstrap: str, topic: str, group: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` for `group` without joining it (assign, as an admin would)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    commits = kafka_python_offsets(topic, offsets)
    consumer.assign(list(commits))
    consumer.commit(commits)
    consumer.close()


def kafka_python_offsets(topic: str, offsets: dict[int, int], metadata: str = "") -> dict:
    """`offsets` (partition -> offset) as kafka-python's commit() takes them, no leader epoch."""
    from kafka import OffsetAndMetadata
    from kafka import TopicPartition as KTP

    return {KTP(topic, p): OffsetAndMetadata(o, metadata, -1) for p, o in offsets.items()}


def every_partition(offset: int) -> dict[int, int]:
    """`offset` on each of the test topic's PARTITIONS."""
    return dict.fromkeys(range(PARTITIONS), offset)


class Names(NamedTuple):
    """A test's source topic, its copy at the destination, and the application's group."""

    topic: str
    dest_topic: str
    group: str


def plain_topic(bootstrap: str, topic: str) -> None:
    produce_numbered(bootstrap, topic, PARTITIONS, PER_PARTITION)


def source_topic(
    broker: Any,
    unique_topic: Any,
    label: str,
    partitions: int = PARTITIONS,
    *,
    records: Callable[[str, str], None] | None = None,
    committed: int | None = None,
) -> Names:
    """A new topic `label` at the source `broker`, filled by `records(bootstrap, topic)`
    (None: empty), with the application's group committed at `committed` on every
    partition (None: no commit)."""
    topic = unique_topic(label)
    names = Names(topic, PREFIX + topic, f"app-{topic}")
    broker.create_topic(topic, partitions)
    if records is not None:
        records(broker.bootstrap, topic)
    if committed is not None:
        offsets = dict.fromkeys(range(partitions), committed)
        commit_at(broker.bootstrap, topic, names.group, offsets)
    return names


def destination_member(bootstrap: str, group: str, topic: str) -> Any:
    """A kafka-python member of `group` at the destination, subscribed to `topic`."""
    from kafka import KafkaConsumer

    member = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        # A join whose metadata lacked the new topic is assigned nothing until the
        # metadata is refreshed (seen: "No partition metadata" and no assignment).
        metadata_max_age_ms=1_000,
    )
    subscribe_knowing(member, [topic])
    return member


def test_a_live_group_is_never_written_and_a_failed_over_one_only_after_resume(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    topic, dest_topic, group = source_topic(
        kafka_broker, unique_topic, "live", records=plain_topic, committed=10
    )
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_synced(proc, group)
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 10
        # The application moves: it joins at the destination and stays.
        member = destination_member(kafka_cluster.bootstrap, group, dest_topic)
        try:
            kafka_wait_assigned(member, proc)
            # Its own commit, 10 on every partition: named, because a poll that fetched
            # records has moved the consumer's position past them (up to 60).
            member.commit(kafka_python_offsets(dest_topic, every_partition(10)))
            # The source group goes on meanwhile; the destination's must not follow.
            commit_at(kafka_broker.bootstrap, topic, group, every_partition(30))
            wait_rounds(proc, 10)
            row = group_row(proc, group)
            assert row["state"] == "failed_over", row
            assert "member" in row["reason"]
            assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 10
        finally:
            member.close()
        # Its members left: still never written.
        commit_at(kafka_broker.bootstrap, topic, group, every_partition(40))
        wait_rounds(proc, 3)
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 10
        assert "group failed over at the destination" in proc.output()
        # The operator resumes it: the next rounds sync the source's offsets again.
        resumed = mirror_cli(proc, "groups", "resume", group)
        assert resumed.returncode == 0, resumed.stderr
        assert "synced again" in resumed.stdout
        proc.wait_for(
            lambda: dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 40,
            timeout_s=HANG_S,
            what="the resumed group synced",
        )
        assert group_row(proc, group)["state"] == "syncing"


def test_promote_hands_the_topic_over_with_every_record_and_the_final_offsets(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    topic, dest_topic, group = source_topic(
        kafka_broker, unique_topic, "promote", records=transactional_topic, committed=15
    )
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_running(proc)
        # The producers stop (transactional_topic returned); promote waits for the rest.
        result = mirror_cli(proc, "promote", "--topics", topic, "--timeout", "120", "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert report["promoted"] is True and report["left_behind"] == {}
        probe = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "probe"})
        try:
            ends = {
                p: probe.get_watermark_offsets(KTP(dest_topic, p), timeout=10)[1]
                for p in range(PARTITIONS)
            }
        finally:
            probe.close()
        source = all_values(kafka_broker.bootstrap, topic)
        for row in report["partitions"]:
            p = row["partition"]
            assert row["destination_log_end"] == ends[p], row
            assert row["mirrored_offset"] == row["source_high_watermark"], row
            assert row["left_behind"] == 0
            # Every committed source record is there; aborted ones and markers are not.
            assert ends[p] == sum(1 for q, _, _ in source if q == p)
        assert set(report["groups"][group].values()) < set(range(15))  # translated below 15
        # Producing to the promoted topic at the destination is not disturbed by replicad.
        producer = CheckedProducer({"bootstrap.servers": kafka_cluster.bootstrap})
        for p in range(PARTITIONS):
            producer.produce(dest_topic, value=b"after-promotion", partition=p)
        assert producer.flush(30) == 0
        wait_rounds(proc, 3)
        status = proc.status()["mirror"]
        assert topic in status["groups"]["promoted_topics"]
        assert all(r["topic"] != topic for r in status["partitions"])
        assert all(r["state"] != "halted" for r in status["partitions"])
    # A restart does not resume the promoted topic.
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_running(proc)
        assert all(r["topic"] != topic for r in proc.status()["mirror"]["partitions"])
    probe = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "probe"})
    try:
        after = {
            p: probe.get_watermark_offsets(KTP(dest_topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        probe.close()
    assert after == {p: ends[p] + 1 for p in range(PARTITIONS)}


CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def describe_offsets(broker: Any, topic: str, group: str) -> dict[int, tuple[int, int]]:
    """kafka-consumer-groups --describe: partition -> (CURRENT-OFFSET, LAG)."""
    out = run_kafka_class(
        CONSUMER_GROUP_COMMAND, "--bootstrap-server", broker.bootstrap, "--describe",
        "--group", group, timeout_s=HANG_S,
    ).stdout  # fmt: skip
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[1] == topic:
            rows[int(cells[2])] = (int(cells[3]), int(cells[5]))
    return rows


def source_committed(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    committed = destination_committed(bootstrap, topic, group)
    return {p: (0 if c is None else c.offset) for p, c in committed.items()}


def confluent_members(bootstrap: str, group: str, count: int) -> list[Any]:
    from confluent_kafka import Consumer

    return [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        for _ in range(count)
    ]


def read_with_members(members: list[Any], topic: str, until: Callable[[list], bool]) -> list:
    """Members poll in turn (each its own librdkafka threads) until `until(read)`."""
    for m in members:
        m.subscribe([topic])
    read: list[tuple[int, bytes]] = []

    def done() -> bool:
        if until(read):
            return True
        for m in members:
            message = m.poll(0.1)
            if message is not None and message.error() is None:
                read.append((message.partition(), message.value()))
        return False

    wait_until(done, interval_s=0, what="the members to read what the test waits for")
    return read


@pytest.mark.parametrize("kind", ["kept", "mapped"])
def test_every_client_and_a_three_member_group_fail_over_exactly(
    kind: str, kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    """One mirror, one topic, four groups: kafka-python, confluent-kafka with one member
    and with three, Kafka's console consumer. `kept`: plain records, the same offsets at
    the destination; `mapped`: committed and aborted transactions, offsets translated."""
    records = plain_topic if kind == "kept" else transactional_topic
    topic, dest_topic, _ = source_topic(kafka_broker, unique_topic, kind, records=records)
    everything = all_values(kafka_broker.bootstrap, topic)
    assert b"aborted" not in {v for _, _, v in everything}
    kp, single, trio, java = f"kp-{topic}", f"cf-{topic}", f"trio-{topic}", f"java-{topic}"
    # kafka-python (subscribe, read_committed) commits what it read, with metadata.
    assert sorted(read_part_with_kafka_python(kafka_broker.bootstrap, topic, kp)) == list(
        range(PARTITIONS)
    )
    # confluent-kafka, one member (subscribe, manual commit); then three members.
    for group, count in ((single, 1), (trio, 3)):
        members = confluent_members(kafka_broker.bootstrap, group, count)
        read_with_members(
            members,
            topic,
            lambda read, count=count, members=members: (
                len(read) >= 25 * count and all(m.assignment() for m in members)
            ),
        )
        for m in members:
            m.commit(asynchronous=False)
            m.close()
    # Kafka's console consumer: --group, commits what it consumed when it stops.
    run_kafka_class(
        CONSOLE_CONSUMER, "--bootstrap-server", kafka_broker.bootstrap, "--topic", topic,
        "--group", java, "--from-beginning", "--max-messages", "40",
        "--consumer-property", "isolation.level=read_committed", timeout_s=HANG_S,
    )  # fmt: skip
    groups = (kp, single, trio, java)
    committed = {g: source_committed(kafka_broker.bootstrap, topic, g) for g in groups}
    # A member commits only the partitions it read (librdkafka); the others start at the
    # earliest at the destination as at the source.
    with_commits = {
        g: sum(1 for c in destination_committed(kafka_broker.bootstrap, topic, g).values() if c)
        for g in groups
    }
    expected = {
        g: sorted((p, v) for p, o, v in everything if o >= c[p]) for g, c in committed.items()
    }
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        for group in groups:
            wait_synced(proc, group, with_commits[group])
        rows = proc.status()["mirror"]["partitions"]
        assert all(r["offsets_kept"] is (kind == "kept") for r in rows), rows
    there = destination_committed(kafka_cluster.bootstrap, dest_topic, kp)
    assert {p: c.metadata for p, c in there.items()} == dict.fromkeys(range(PARTITIONS), METADATA)
    if kind == "kept":
        assert {p: c.offset for p, c in there.items()} == committed[kp]
        # kafka-consumer-groups --describe shows the same offsets and lag on both sides.
        assert describe_offsets(kafka_cluster, dest_topic, kp) == describe_offsets(
            kafka_broker, topic, kp
        )
    else:
        assert {p: c.offset for p, c in there.items()} != committed[kp]  # translated
    rest = consume_rest_with_kafka_python(
        kafka_cluster.bootstrap, dest_topic, kp, len(expected[kp])
    )
    assert sorted(rest) == expected[kp]
    for group, count in ((single, 1), (trio, 3)):
        members = confluent_members(kafka_cluster.bootstrap, group, count)
        want = len(expected[group])
        # Three members that join one by one rebalance while they read and commit nothing
        # meanwhile, so a record may come twice (Kafka's at-least-once between commits):
        # what failover decides is where each partition starts, so the records read, once
        # each, are exactly those after the group's commit, none before.
        rest = read_with_members(
            members, dest_topic, lambda read, want=want: len(set(read)) >= want
        )
        for m in members:
            m.close()
        assert sorted(set(rest)) == expected[group], group
    printed = run_kafka_class(
        CONSOLE_CONSUMER, "--bootstrap-server", kafka_cluster.bootstrap, "--topic", dest_topic,
        "--group", java, "--max-messages", str(len(expected[java])),
        "--property", "print.partition=true", "--timeout-ms", "60000", timeout_s=HANG_S,
    ).stdout  # fmt: skip
    rest = []
    for line in printed.splitlines():
        if line.startswith("Partition:"):
            head, _, value = line.partition("\t")
            rest.append((int(head.split(":")[1]), value.encode()))
    assert sorted(rest) == expected[java]


def test_a_group_that_fails_over_while_replicad_is_stopped_is_left_alone_at_restart(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    topic, dest_topic, group = source_topic(
        kafka_broker, unique_topic, "stopped", records=plain_topic, committed=10
    )
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_synced(proc, group)
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 10
    # replicad is stopped. The application moves: it joins at the destination, reads,
    # commits 25 and stops; its group has no members when replicad starts again.
    app = destination_member(kafka_cluster.bootstrap, group, dest_topic)
    try:
        kafka_wait_assigned(app)
        app.commit(kafka_python_offsets(dest_topic, every_partition(25)))
    finally:
        app.close()
    # The source group goes on meanwhile: a sync that forgot what it wrote would follow it.
    commit_at(kafka_broker.bootstrap, topic, group, every_partition(40))
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        proc.wait_for(
            lambda: group_row(proc, group).get("state") == "failed_over",
            timeout_s=HANG_S,
            what="the group recognised as failed over",
        )
        assert "commits there itself" in group_row(proc, group)["reason"]
        wait_rounds(proc, 3)
        assert {
            p: dest_offset(kafka_cluster.bootstrap, dest_topic, group, p) for p in range(PARTITIONS)
        } == every_partition(25)
        # The group is deleted at the source, then at the destination: replicad forgets it
        # (its failover, what it wrote) once it is gone on both sides.
        delete_group(kafka_broker.bootstrap, group)
        proc.wait_for(
            lambda: group_row(proc, group).get("absent_since_ms") is not None,
            timeout_s=HANG_S,
            what="the group gone at the source",
        )
        assert group_row(proc, group)["state"] == "failed_over"
        delete_group(kafka_cluster.bootstrap, group)
        saved = tmp_path / "data" / "mirror-groups.json"

        def forgotten() -> bool:
            # Status first, then the file (saved at the end of the round that forgot it).
            shown = groups_of(proc).get("groups")
            stored = json.loads(saved.read_text())
            return (
                shown is not None
                and group not in shown
                and group not in stored["failed_over"]
                and group not in stored["written"]
            )

        proc.wait_for(forgotten, timeout_s=HANG_S, what="the group forgotten")
        assert "group forgotten: gone at the source and at the destination" in proc.output()


def delete_group(bootstrap: str, group: str) -> None:
    """kafka-consumer-groups --delete, through the Admin API (confluent-kafka)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result(timeout=60)


def kafka_wait_assigned(consumer: Any, proc: ReplicadProcess | None = None) -> None:
    """Poll until the group gave `consumer` its partitions (failing at once should `proc`,
    the replicad running meanwhile, exit)."""
    wait = wait_until if proc is None else proc.wait_for
    wait(
        lambda: consumer.poll(timeout_ms=200) is not None and bool(consumer.assignment()),
        timeout_s=HANG_S,
        what="the member's assignment",
    )


def open_transaction(producer: Any, topic: str, records: int) -> None:
    """`records` records in a transaction left open: the mirror holds at its first one."""
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, value=b"t%d" % i, partition=0)
    assert producer.flush(30) == 0


def dest_end(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return probe.get_watermark_offsets(KTP(topic, 0), timeout=10)[1]
    finally:
        probe.close()


def wait_held(proc: ReplicadProcess, group: str, offsets: int) -> None:
    """Until the sync has held `group`'s one partition back by `offsets` source offsets."""
    proc.wait_for(
        lambda: (
            group_row(proc, group).get("held_back_offsets") == offsets
            and group_row(proc, group).get("last_sync_ms") is not None
        ),
        timeout_s=HANG_S,
        what=f"group {group} held back by {offsets}",
    )


def test_offsets_wait_at_the_mirrored_end_while_the_mirror_lags_and_promote_force_stops_there(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    topic, dest_topic, group = source_topic(kafka_broker, unique_topic, "lag", 1)
    source = kafka_broker.bootstrap
    txn = CheckedProducer(
        {
            "bootstrap.servers": source,
            "transactional.id": f"{topic}-txn",
            "transaction.timeout.ms": 600_000,
        }
    )
    txn.init_transactions(30)
    # Source offsets: 0-19 plain, 20-29 an open transaction, 30-59 plain. The mirror
    # produces 0-19 and holds at 20 (docs/mirror.md, transactions); the group read to 50.
    produce_numbered(source, topic, 1, 20)
    open_transaction(txn, topic, 10)
    produce_numbered(source, topic, 1, 30, b"w")
    commit_at(source, topic, group, {0: 50})
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        # The mirror lags: the group's offset waits at the mirrored end, never ahead of it.
        wait_held(proc, group, 50 - 20)
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 20
        assert dest_end(kafka_cluster.bootstrap, dest_topic) == 20
        # Held only by the mirror: the local replica has everything (a replica behind the
        # source is another reason promotion names).
        proc.wait_caught_up({TopicPartition(topic, 0): 60})
        # Promotion without --force waits for the held records; on timeout nothing changes.
        waited = mirror_cli(proc, "promote", "--topics", topic, "--timeout", "1", "--json")
        assert waited.returncode == 1, waited.stdout + waited.stderr
        assert "mirrored to 20 of 60" in json.loads(waited.stdout)["waiting"][f"{topic}-0"]
        # The transaction commits (its marker at 60): mirror and group catch up exactly.
        txn.commit_transaction(30)
        wait_synced(proc, group, 1)
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 50
        # Caught up, kafka-consumer-groups --describe at the destination shows the offset
        # and a lag of the 10 records the group has not read (50-59). The source's LAG
        # column says 11: it counts the marker at 60, an offset the destination does not have.
        proc.wait_for(
            lambda: dest_end(kafka_cluster.bootstrap, dest_topic) == 60,
            timeout_s=HANG_S,
            what="the destination holding every committed record",
        )
        assert describe_offsets(kafka_cluster, dest_topic, group) == {0: (50, 10)}
        # It lags again: 61-70 an open transaction, 71-80 plain; the group read to 75.
        open_transaction(txn, topic, 10)
        produce_numbered(source, topic, 1, 10, b"x")
        commit_at(source, topic, group, {0: 75})
        wait_held(proc, group, 75 - 61)
        # The marker took no destination offset: the mirrored end is 60 there.
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 60
        assert dest_end(kafka_cluster.bootstrap, dest_topic) == 60
        proc.wait_caught_up({TopicPartition(topic, 0): 81})
        # --force: stop at once with what is there, and say what was left behind.
        forced = mirror_cli(proc, "promote", "--topics", topic, "--force", "--json")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        report = json.loads(forced.stdout)
        assert report["promoted"] is True and report["forced"] is True
        assert f"{topic}-0" in report["left_behind"]
        (row,) = report["partitions"]
        assert (row["mirrored_offset"], row["destination_log_end"]) == (61, 60), row
        assert row["left_behind"] == 81 - 61, row
        assert report["groups"] == {group: {f"{dest_topic}-0": 60}}
        # The transaction commits at the source after the cut-over: replicated locally,
        # never mirrored, and the group is not synced any more.
        txn.commit_transaction(30)
        proc.wait_caught_up({TopicPartition(topic, 0): 82})
        commit_at(source, topic, group, {0: 80})
        wait_rounds(proc, 3)
        assert dest_end(kafka_cluster.bootstrap, dest_topic) == 60
        assert dest_offset(kafka_cluster.bootstrap, dest_topic, group) == 60
