"""Failover to `replicad serve`, end to end, with clients nobody here wrote: an application
consumes part of a topic from Apache Kafka in a group and commits; `replicad run` (with a
`serve:` section and groups.enabled) replicates the topic and syncs the group's committed
offsets into serve's coordinator as they are; the application is pointed at serve with the
same group id and reads every record after its last commit exactly once, none before it.
kafka-python (`group_id`), confluent-kafka (`subscribe`), Kafka's Java console consumer
(`--group`), and a group of three kafka-python members. And Kafka's `kafka-consumer-groups
--describe` shows the same offsets, log ends and lag against serve as against the source
for a synced group.

One `replicad run` (one topic, produced before it starts) serves every test of the module;
each test has its own group. What the application committed at the source is read back
from the source (an auto-committing client commits what it fetched, not what it printed),
and that is what the records after the failover are held to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from replicad.types import TopicPartition
from tests.leader.test_serve_groups import (
    CONSUMER_GROUPS,
    Member,
    committed_offsets,
    describe_rows,
    produced_topic,
    running,
)
from tools.peers.group_member import subscribe_knowing
from tools.peers.kafka import CONSOLE_CONSUMER, run_kafka_class
from tools.peers.process import free_port
from tools.replica import ReplicadProcess, replicad_run
from tools.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 3
PER_PARTITION = 100
DEADLINE_S = 90
TOPIC_CONFIGS = {"retention.ms": "123456789", "cleanup.policy": "delete"}
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
Read = list[tuple[int, int]]  # (partition, offset) of each record read, in order


@dataclass
class Failover:
    topic: str
    source: str
    serve: str
    run: ReplicadProcess

    def group(self, name: str) -> str:
        return f"{self.topic}-{name}"


@pytest.fixture(scope="module")
def failover(kafka_broker, tmp_path_factory) -> Iterator[Failover]:
    """PARTITIONS x PER_PARTITION records on Kafka, replicated by `replicad run`, which
    serves them and syncs every group named `<topic>-*` every 200 ms."""
    topic = produced_topic(kafka_broker, "failover", PARTITIONS, PER_PARTITION, TOPIC_CONFIGS)
    work = tmp_path_factory.mktemp("failover")
    port = free_port()
    config = {
        "serve": {"listen": f"127.0.0.1:{port}"},
        "groups": {
            "enabled": True,
            "include": [f"{re.escape(topic)}-.*"],
            "sync_interval_ms": 200,
            # A group's first rebalance at the first join, as on the harness's brokers.
            "initial_rebalance_delay_ms": 0,
        },
    }
    want = {TopicPartition(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    with replicad_run(
        kafka_broker.bootstrap,
        [topic],
        work / "data",
        log_path=work / "run.log",
        config=config,
        control_socket=work / "control.sock",
    ) as proc:
        proc.wait_serving()
        proc.wait_caught_up(want, timeout_s=DEADLINE_S)
        yield Failover(topic, kafka_broker.bootstrap, f"127.0.0.1:{port}", proc)


def synced(f: Failover, group: str) -> dict[int, int]:
    """The group's offsets at the source, once serve has the same (the sync ran)."""
    at_source = committed_offsets(f.source, f.topic, group)
    assert at_source, f"{group} committed nothing at the source"
    wait_until(
        lambda: committed_offsets(f.serve, f.topic, group) == at_source,
        timeout_s=DEADLINE_S,
        what=f"{group}'s offsets synced into serve",
    )
    return at_source


def after(commits: dict[int, int]) -> Read:
    """Every record after the commits (from the start where a partition has none)."""
    return [(p, o) for p in range(PARTITIONS) for o in range(commits.get(p, 0), PER_PARTITION)]


def kafka_python_consume(bootstrap: str, topic: str, group: str, *, stop_after: int) -> Read:
    """A kafka-python application: subscribes with `group_id`, reads until it has
    `stop_after` records, commits what it read, leaves."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_poll_records=25,
    )
    # Not before its metadata names the topic: kafka-python 3.0.12 strands a leader that
    # rejoins on a metadata change (tools/peers/rejoin_race.py).
    subscribe_knowing(consumer, [topic])

    def poll() -> Read:
        return [(tp.partition, m.offset) for tp, ms in consumer.poll(500).items() for m in ms]

    try:
        read = read_until(poll, stop_after)
        consumer.commit()  # the positions: everything poll returned
    finally:
        consumer.close(autocommit=False)
    return read


def read_until(poll: Callable[[], Read], stop_after: int) -> Read:
    """What `poll` returns, call after call, until there are `stop_after` records."""
    read: Read = []

    def enough() -> bool:
        read.extend(poll())
        return len(read) >= stop_after

    if len(read) < stop_after:
        wait_until(enough, interval_s=0, what=f"{stop_after} records")
    return read


def test_kafka_python_application_fails_over_and_resumes_after_its_last_commit(
    failover,
) -> None:
    f, group = failover, failover.group("kafka-python")
    first = kafka_python_consume(f.source, f.topic, group, stop_after=120)
    commits = synced(f, group)
    assert sum(commits.values()) == len(first)  # the application's own commit, synced
    rest = after(commits)
    again = kafka_python_consume(f.serve, f.topic, group, stop_after=len(rest))
    assert sorted(again) == rest


def confluent_consume(bootstrap: str, topic: str, group: str, *, stop_after: int) -> Read:
    """A confluent-kafka application: `subscribe`, manual commit of what it read."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.subscribe([topic])

    def poll() -> Read:
        message = consumer.poll(0.5)
        if message is None or message.error() is not None:
            return []
        return [(message.partition(), message.offset())]

    try:
        read = read_until(poll, stop_after)
        consumer.commit(asynchronous=False)  # the positions of what was read
    finally:
        consumer.close()
    return read


def test_confluent_kafka_application_fails_over_and_resumes_after_its_last_commit(
    failover,
) -> None:
    f, group = failover, failover.group("confluent")
    first = confluent_consume(f.source, f.topic, group, stop_after=90)
    commits = synced(f, group)
    assert sum(commits.values()) == len(first)
    rest = after(commits)
    again = confluent_consume(f.serve, f.topic, group, stop_after=len(rest))
    assert sorted(again) == rest


def test_the_java_console_consumer_fails_over_and_resumes_after_its_last_commit(
    failover,
) -> None:
    f, group = failover, failover.group("java")
    # --group: it commits when it stops (what it fetched, which may be more than it printed).
    run_kafka_class(
        CONSOLE_CONSUMER, "--bootstrap-server", f.source, "--topic", f.topic,
        "--group", group, "--from-beginning", "--max-messages", "70", timeout_s=120,
    )  # fmt: skip
    rest = after(synced(f, group))
    printed = run_kafka_class(
        CONSOLE_CONSUMER, "--bootstrap-server", f.serve, "--topic", f.topic,
        "--group", group, "--max-messages", str(len(rest)), "--timeout-ms", "60000",
        "--property", "print.partition=true", "--property", "print.offset=true",
        timeout_s=120,
    ).stdout  # fmt: skip
    again = []
    for line in printed.splitlines():
        fields = dict(
            item.split(":", 1) for item in line.split("\t") if item.split(":", 1)[0] in FIELDS
        )
        if fields.keys() == FIELDS:
            again.append((int(fields["Partition"]), int(fields["Offset"])))
    assert sorted(again) == rest


FIELDS = {"Partition", "Offset"}


def three_members_read(
    f: Failover, bootstrap: str, group: str, done: Callable[[Read], bool]
) -> Read:
    # Auto-commit: what a member read is committed before its partitions move (on every
    # rebalance) and when it leaves.
    read: Read = []
    members = [Member(bootstrap, f.topic, group, read, max_poll_records=10) for _ in range(3)]
    with running(members):
        wait_until(
            lambda: done(read) and all(m.assigned for m in members),
            timeout_s=DEADLINE_S,
            what=f"3 members of {group} reading",
        )
    return read


def test_a_group_of_three_fails_over_and_resumes_after_its_last_commits(failover) -> None:
    f, group = failover, failover.group("three")
    three_members_read(f, f.source, group, lambda read: len(read) >= 60)
    rest = after(synced(f, group))
    again = three_members_read(f, f.serve, group, lambda read: len(read) >= len(rest))
    assert sorted(again) == rest


def test_kafka_consumer_groups_describes_a_synced_group_on_serve_as_on_the_source(
    failover,
) -> None:
    f, group = failover, failover.group("described")
    kafka_python_consume(f.source, f.topic, group, stop_after=150)
    synced(f, group)

    def describe(bootstrap: str) -> dict[int, tuple[str, str, str]]:
        output = run_kafka_class(
            CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--describe", "--group", group,
            timeout_s=120,
        ).stdout  # fmt: skip
        return describe_rows(output, f.topic)

    at_source = describe(f.source)
    assert at_source, "the source describes no committed partition"
    assert describe(f.serve) == at_source


def test_kafka_topics_describes_the_sources_topic_configs_on_serve(failover) -> None:
    """serve answers DescribeConfigs with the configs run read from the source, so Kafka's
    kafka-topics --describe shows the real retention (it lists non-default configs)."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    f = failover

    def retention_on_serve() -> str | None:
        admin = KafkaAdminClient(bootstrap_servers=f.serve)
        try:
            answer = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, f.topic)])
        finally:
            admin.close()
        entry = answer.get("topic", {}).get(f.topic, {}).get("retention.ms") or {}
        return entry.get("value")

    wait_until(
        lambda: retention_on_serve() == TOPIC_CONFIGS["retention.ms"],
        timeout_s=DEADLINE_S,
        what="the source's topic configs on serve",
    )
    described = run_kafka_class(
        TOPIC_COMMAND, "--bootstrap-server", f.serve, "--describe", "--topic", f.topic,
        timeout_s=120,
    ).stdout  # fmt: skip
    assert "retention.ms=123456789" in described, described
