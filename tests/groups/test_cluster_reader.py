"""ClusterGroupsReader against a real Apache Kafka broker: groups committed by confluent-kafka
are listed, their offsets (with leader epochs and metadata) read back exactly, an active
member's assignment decoded, and topic configs read as Kafka reports them. Every FindCoordinator
and OffsetFetch version the broker speaks is exercised by capping what we send."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.structs import OffsetAndMetadata as KafkaPythonOffsetAndMetadata

from replicad.groups.cluster_reader import ClusterGroupsReader
from replicad.protocol import apis, connection
from replicad.protocol.apis import ApiKey, VersionRange
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.connection import BrokerAddress
from replicad.types import OffsetAndMetadata, TopicPartition

PARTITIONS = 3


def commit(bootstrap: str, group: str, offsets: dict[TopicPartition, tuple[int, str, int]]) -> None:
    """A simple (unmanaged) group's commit through kafka-python, as an application storing
    its offsets does: offset, metadata and leader epoch per partition."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit(
            {
                KafkaPythonTopicPartition(tp.topic, tp.partition): KafkaPythonOffsetAndMetadata(
                    *value
                )
                for tp, value in offsets.items()
            }
        )
    finally:
        consumer.close()


@pytest.fixture
def member(kafka_broker, unique_topic) -> Iterator[tuple[str, Consumer]]:
    """The test's topic, and a subscribed confluent-kafka member of group `<topic>-live`
    with its assignment settled."""
    kafka_broker.create_topic(unique_topic, PARTITIONS, {"retention.ms": "123456789"})
    group = f"{unique_topic}-live"
    consumer = Consumer(
        {"bootstrap.servers": kafka_broker.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    consumer.subscribe([unique_topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert len(consumer.assignment()) == PARTITIONS
    try:
        yield group, consumer
    finally:
        consumer.close()


async def read_everything(bootstrap: str, groups: list[str], topic: str) -> dict:
    client = KafkaClient([bootstrap], ClientSettings())
    try:
        reader = ClusterGroupsReader(client)
        return {
            "listing": await reader.list_groups(),
            "offsets": await reader.committed_offsets(groups),
            "described": await reader.describe(groups),
            "configs": await reader.topic_configs([topic, "no-such-topic-here"]),
            "coordinators": await reader.coordinators(groups),
        }
    finally:
        await client.close()


@pytest.mark.parametrize(
    "cap",
    [None, {ApiKey.FIND_COORDINATOR: VersionRange(0, 3), ApiKey.OFFSET_FETCH: VersionRange(1, 7)}],
    ids=["newest", "unbatched"],
)
def test_reads_groups_offsets_members_and_configs(
    kafka_broker, unique_topic, member, cap, monkeypatch
) -> None:
    if cap is not None:
        capped = {**apis.CLIENT_VERSIONS, **cap}
        monkeypatch.setattr(
            connection, "negotiate", lambda ranges: apis.negotiate(ranges, client=capped)
        )
    committed = {
        TopicPartition(unique_topic, 0): (17, "meta-0", 0),
        TopicPartition(unique_topic, 2): (5, "", -1),
    }
    simple = f"{unique_topic}-simple"
    commit(kafka_broker.bootstrap, simple, committed)
    live, _consumer = member

    seen = asyncio.run(
        read_everything(kafka_broker.bootstrap, [simple, live, "never-seen"], unique_topic)
    )

    listing = seen["listing"]
    assert listing.complete
    listed = {g.group_id: g for g in listing.groups}
    assert listed[live].protocol_type == "consumer"
    assert listed[live].state == "Stable"
    assert simple in listed and "never-seen" not in listed

    offsets = seen["offsets"]
    assert offsets[simple].error is None
    assert dict(offsets[simple].offsets) == {
        tp: OffsetAndMetadata(offset, epoch, meta)
        for tp, (offset, meta, epoch) in committed.items()
    }
    assert offsets[live].offsets == {} and offsets[live].error is None
    assert offsets["never-seen"].offsets == {} and offsets["never-seen"].error is None

    described = seen["described"][live]
    assert described.state == "Stable" and described.protocol_type == "consumer"
    assert len(described.members) == 1
    assert sorted(described.members[0].partitions or ()) == [
        TopicPartition(unique_topic, p) for p in range(PARTITIONS)
    ]
    assert seen["described"]["never-seen"].state == "Dead"

    configs = seen["configs"]
    entries = {e.name: e for e in configs[unique_topic].entries}
    assert entries["retention.ms"].value == "123456789"
    assert entries["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    assert entries["cleanup.policy"].value == "delete"
    assert configs["no-such-topic-here"].error == "unknown_topic_or_partition"
    assert all(isinstance(n, int) for n in seen["coordinators"].values())


def test_an_unreachable_cluster_is_reported_per_group_not_raised(free_port) -> None:
    async def ask() -> dict:
        client = KafkaClient(
            [f"127.0.0.1:{free_port}"], ClientSettings(connect_timeout_s=1.0, request_timeout_s=1.0)
        )
        client.brokers[0] = BrokerAddress(0, "127.0.0.1", free_port)
        reader = ClusterGroupsReader(client)
        try:
            return await reader.committed_offsets(["a", "b"])
        finally:
            await client.close()

    results = asyncio.run(ask())
    assert set(results) == {"a", "b"}
    assert all(r.error is not None and r.error.startswith("unreachable") for r in results.values())


def test_the_groups_a_sync_may_carry_are_consumer_or_offset_only_groups_it_selects() -> None:
    from replicad.groups.cluster_reader import GroupListing, ListedGroup

    listing = GroupListing(
        (
            ListedGroup("app", "consumer"),
            ListedGroup("spark-job", ""),
            ListedGroup("connect-cluster", "connect"),
            ListedGroup("app-test", "consumer"),
        )
    )
    chosen = listing.consumer_groups(lambda group_id: not group_id.endswith("-test"))
    assert chosen == ["app", "spark-job"]
