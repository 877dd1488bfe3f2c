"""Consumer groups on `replicad serve`, used by clients nobody here wrote: kafka-python and
confluent-kafka consumers subscribe with a group id, commit, and a second consumer of the
same group resumes after the last commit; Kafka's own `kafka-consumer-groups` lists,
describes, resets and deletes groups against serve; serve SIGKILLed while a client commits
keeps every commit it acknowledged.

The replica is written by `replicad run` from the session's Kafka broker; serve runs as a
subprocess, as a user runs it (nothing here drives asyncio in the test's own process).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from replicad.types import TopicPartition
from tools.peers.group_member import subscribe_knowing
from tools.peers.kafka import run_kafka_class
from tools.peers.process import free_port
from tools.replica import ReplicadProcess, replicad_run, replicad_serve
from tools.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 3
PER_PARTITION = 200
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
DEADLINE_S = 60
# Commits acknowledged before serve is killed mid-stream.
KILL_AFTER_COMMITS = 20


@dataclass
class Replica:
    topic: str
    data_dir: Path
    serve: ReplicadProcess
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def produced_topic(
    kafka_broker, name: str, partitions: int, per_partition: int, configs: Any = None
) -> str:
    """A new topic `<name>-<pid>-<ms>` on Kafka (with `configs`, if given) with
    `per_partition` records in each of its `partitions` (values "p-i")."""
    from kafka import KafkaProducer

    topic = f"{name}-{os.getpid():x}-{int(time.time() * 1000) % 100000}"
    if configs:
        kafka_broker.create_topic(topic, partitions, configs)
    else:
        kafka_broker.create_topic(topic, partitions)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for p in range(partitions):
        for i in range(per_partition):
            producer.send(topic, value=f"{p}-{i}".encode(), partition=p)
    producer.flush()
    producer.close()
    return topic


@pytest.fixture(scope="module")
def replica(kafka_broker, tmp_path_factory) -> Iterator[Replica]:
    """A topic of PARTITIONS x PER_PARTITION records on Kafka, replicated by `replicad run`,
    served by `replicad serve`."""
    topic = produced_topic(kafka_broker, "groups", PARTITIONS, PER_PARTITION)
    work = tmp_path_factory.mktemp("groups")
    data_dir = work / "data"
    want = {TopicPartition(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    with replicad_run(
        kafka_broker.bootstrap,
        [topic],
        data_dir,
        log_path=work / "run.log",
        control_socket=work / "control.sock",
    ) as proc:
        proc.wait_caught_up(want, timeout_s=90)
    port = free_port()
    replica = Replica(
        topic, data_dir, replicad_serve(data_dir, port, log_path=work / "serve.log"), port
    )
    try:
        yield replica
    finally:
        replica.serve.stop()  # the one running now (a test may have restarted it)


def remaining(first: dict[int, list[int]]) -> int:
    """How many records are left after what `first` read (and committed)."""
    return PARTITIONS * PER_PARTITION - sum(len(v) for v in first.values())


def consume_kafka_python(
    replica: Replica, group: str, *, stop_after: int, commit: bool = True
) -> dict[int, list[int]]:
    """A kafka-python consumer of `group` subscribed to the topic: reads until it has
    `stop_after` records, commits what it read, and leaves."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=replica.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_poll_records=50,
    )
    subscribe_knowing(consumer, [replica.topic])
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                got[tp.partition] += [m.offset for m in messages]
            if sum(len(v) for v in got.values()) >= stop_after:
                break
        if commit:
            consumer.commit(
                {
                    KTP(replica.topic, p): OffsetAndMetadata(offsets[-1] + 1, "", -1)
                    for p, offsets in got.items()
                    if offsets
                }
            )
    finally:
        consumer.close()
    return got


def assert_resumed(first: dict[int, list[int]], second: dict[int, list[int]]) -> None:
    """The second consumer read every record after the first's commit, once, none before."""
    for p in range(PARTITIONS):
        committed = first[p][-1] + 1 if first[p] else 0
        assert second[p] == list(range(committed, PER_PARTITION)), p
        assert first[p] == list(range(len(first[p]))), p


def test_kafka_python_group_commits_and_a_second_consumer_resumes_after_the_commit(
    replica,
) -> None:
    group = "kp-resume"
    first = consume_kafka_python(replica, group, stop_after=PER_PARTITION)
    assert 0 < sum(len(v) for v in first.values()) < PARTITIONS * PER_PARTITION
    second = consume_kafka_python(replica, group, stop_after=remaining(first))
    assert_resumed(first, second)


def test_confluent_kafka_group_commits_and_resumes(replica) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    group = "ck-resume"

    def consume(stop_after: int) -> dict[int, list[int]]:
        consumer = Consumer(
            {
                "bootstrap.servers": replica.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
            }
        )
        consumer.subscribe([replica.topic])
        got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + DEADLINE_S
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got[message.partition()].append(message.offset())
                if sum(len(v) for v in got.values()) >= stop_after:
                    break
            offsets = [
                KTP(replica.topic, p, offsets[-1] + 1) for p, offsets in got.items() if offsets
            ]
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=False)
        finally:
            consumer.close()
        return got

    first = consume(PER_PARTITION)
    second = consume(remaining(first))
    assert_resumed(first, second)


def consumer_groups(replica: Replica, *args: str) -> str:
    result = run_kafka_class(
        CONSUMER_GROUPS, "--bootstrap-server", replica.bootstrap, *args, timeout_s=120
    )
    return result.stdout


def describe_rows(output: str, topic: str) -> dict[int, tuple[str, str, str]]:
    """`--describe`'s rows of `topic`: partition -> (current offset, log end, lag)."""
    rows = {}
    for line in output.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1] == topic:
            rows[int(cols[2])] = (cols[3], cols[4], cols[5])
    return rows


def test_kafka_consumer_groups_lists_describes_resets_and_deletes(replica) -> None:
    group = "tool-group"
    first = consume_kafka_python(replica, group, stop_after=PER_PARTITION)
    assert group in consumer_groups(replica, "--list").split()

    output = consumer_groups(replica, "--describe", "--group", group)
    described = describe_rows(output, replica.topic)
    # An Empty group shows the partitions it committed: offset, log end and lag.
    want = {
        p: (str(read[-1] + 1), str(PER_PARTITION), str(PER_PARTITION - read[-1] - 1))
        for p, read in first.items()
        if read
    }
    assert want and described == want, output

    reset = consumer_groups(
        replica,
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        replica.topic,
        "--to-offset",
        "17",
        "--execute",
    )
    assert replica.topic in reset
    assert committed_offsets(replica.bootstrap, replica.topic, group) == {
        p: 17 for p in range(PARTITIONS)
    }

    deleted = consumer_groups(replica, "--delete", "--group", group)
    assert "was successful" in deleted, deleted
    assert committed_offsets(replica.bootstrap, replica.topic, group) == {}
    assert group not in listed_groups(replica)


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """The group's committed offsets of `topic` there, as kafka-python's admin reads them."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic}


def gone(serve: ReplicadProcess) -> bool:
    """Whether `serve` has exited (given a moment to be reaped after its kill)."""
    try:
        wait_until(lambda: not serve.running, timeout_s=60, what="serve to exit")
    except TimeoutError:
        return False
    return True


def listed_groups(replica: Replica) -> list[str]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=replica.bootstrap)
    try:
        return [g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()]
    finally:
        admin.close()


def test_serve_killed_while_committing_keeps_every_acknowledged_commit(replica, tmp_path) -> None:
    """A client commits one offset after another; serve is SIGKILLed mid-stream and
    restarted: the offset committed is the last one acknowledged, or the one in flight."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTP

    group = "durable"
    tp = KTP(replica.topic, 1)
    consumer = KafkaConsumer(
        bootstrap_servers=replica.bootstrap, group_id=group, enable_auto_commit=False
    )
    consumer.assign([tp])  # no subscription: commits as an admin does (generation -1)
    acknowledged = 0
    attempted = 0
    # The kill comes once enough commits are acknowledged to show anything, whatever the
    # machine's pace (a timer's moment would count commits by the clock), while the loop
    # goes on committing: it lands on a commit in flight or between two.
    enough = threading.Event()
    killer = threading.Thread(target=lambda: enough.wait(DEADLINE_S) and replica.serve.kill())
    try:
        killer.start()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            attempted = acknowledged + 1
            try:
                consumer.commit({tp: OffsetAndMetadata(attempted, "", -1)}, timeout_ms=5_000)
            except Exception:  # serve is gone: the commit in flight may or may not be kept
                if gone(replica.serve):
                    break
                raise
            acknowledged = attempted
            if acknowledged == KILL_AFTER_COMMITS:
                enough.set()
    finally:
        enough.set()  # the killer ends either way
        killer.join()
        consumer.close(autocommit=False)
    assert not replica.serve.running, "serve was not killed while commits ran"
    assert acknowledged >= KILL_AFTER_COMMITS

    replica.serve = replicad_serve(
        replica.data_dir, replica.port, log_path=tmp_path / "serve-again.log"
    )
    kept = committed_offsets(replica.bootstrap, replica.topic, group)[tp.partition]
    assert kept in (acknowledged, attempted), (kept, acknowledged, attempted)


class Member(threading.Thread):
    """A kafka-python consumer of a group in a thread of its own, polling until told to
    stop (or to leave: it closes, which sends LeaveGroup and, with auto-commit, commits
    what it read first). `read` gets (partition, offset) of every record it reads;
    `settings` are more KafkaConsumer settings."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, read: list[tuple[int, int]], **settings: Any
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.read = read
        self.settings = settings
        self.assigned: frozenset[int] = frozenset()
        self.leave = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaConsumer

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                **{
                    "auto_offset_reset": "earliest",
                    "fetch_max_wait_ms": 100,
                    "max_poll_records": 20,
                    "session_timeout_ms": 10_000,
                    "heartbeat_interval_ms": 500,
                    # A group leader whose metadata did not list the topic yet assigns
                    # nothing ("No partition metadata for topic") and rejoins only once its
                    # metadata changes: kafka-python asks again after this age (5 min by
                    # default), so a member would wait minutes (a fresh-clone run did).
                    "metadata_max_age_ms": 2_000,
                    **self.settings,
                },
            )
            subscribe_knowing(consumer, [self.topic])
            try:
                while not self.leave.is_set():
                    for tp, messages in consumer.poll(timeout_ms=200).items():
                        self.read.extend((tp.partition, m.offset) for m in messages)
                    self.assigned = frozenset(tp.partition for tp in consumer.assignment())
            finally:
                consumer.close()
        except BaseException as exc:
            self.error = exc


@contextlib.contextmanager
def running(members: list[Member]) -> Iterator[None]:
    """The members started; when the block ends each leaves and its thread ends, and then
    none may have failed."""
    try:
        for member in members:
            member.start()
        yield
    finally:
        for member in members:
            member.leave.set()
        for member in members:
            member.join(30)
    assert all(m.error is None for m in members), [m.error for m in members]


def test_three_members_share_the_partitions_and_one_leaving_hands_its_own_over(replica) -> None:
    read: list[tuple[int, int]] = []
    everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    members = [Member(replica.bootstrap, replica.topic, "three", read) for _ in range(3)]
    with running(members):

        def shared_by(group: list[Member]) -> bool:
            sets = [m.assigned for m in group]
            union = frozenset().union(*sets)
            disjoint = sum(len(s) for s in sets) == len(union)
            return all(sets) and disjoint and union == frozenset(range(PARTITIONS))

        wait_until(lambda: shared_by(members), what="each of 3 members owning one partition")
        members[2].leave.set()
        members[2].join(30)
        wait_until(lambda: shared_by(members[:2]), what="the 2 left owning every partition")
        wait_until(lambda: everything <= set(read), what="every record read")


def test_a_read_only_group_refuses_a_clients_commit_and_its_members_still_read(
    logs, fill, serve_in_thread
) -> None:
    """groups.read_only (serve inside `replicad run`, here on a thread): kafka-python, a
    member of a sync-only group, reads and is refused its commit with
    GROUP_AUTHORIZATION_FAILED ("not authorized to access group"); another group commits."""
    from kafka.errors import GroupAuthorizationFailedError

    from tools.logdata.batches import producer_batch

    topic = "read-only"
    for p in range(PARTITIONS):
        fill(logs, TopicPartition(topic, p), [producer_batch(i, [b"v"]) for i in range(10)])
    served = serve_in_thread(logs, read_only_groups=lambda group: group.startswith("synced-"))
    replica = Replica(topic, logs.data_dir, None, served.server.port)  # type: ignore[arg-type]
    with pytest.raises(GroupAuthorizationFailedError):
        consume_kafka_python(replica, "synced-app", stop_after=PARTITIONS * 10)
    assert served.metrics()["read_only_commit_refusals_total"] >= 1
    assert committed_offsets(replica.bootstrap, topic, "synced-app") == {}
    own = consume_kafka_python(replica, "own-app", stop_after=PARTITIONS * 10)
    assert committed_offsets(replica.bootstrap, topic, "own-app") == {
        p: offsets[-1] + 1 for p, offsets in own.items() if offsets
    }
