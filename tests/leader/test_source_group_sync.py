"""serve's sync of the source's group offsets (leader/source_group_sync.py), against the
session's real Kafka broker as the source: a group committed there is read and taken into
serve's coordinator as it is, held at the replica's high watermark, without partitions the
replica does not hold; once a member joins the group on serve its sync stops, and stays
stopped after a restart from the same store.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from replicad.config.model import GroupsConfig
from replicad.groups.coordinator import CoordinatorConfig
from replicad.leader.catalog import Catalog
from replicad.leader.group_wire import Node
from replicad.leader.groups import GroupService
from replicad.leader.source_group_sync import SourceGroupSync, read_only_groups
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.types import TopicPartition
from tests.groups.test_cluster_reader import commit
from tests.leader.test_groups import answered, join
from tools.logdata.batches import producer_batch

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

WAIT_S = 30


def test_source_offsets_are_taken_as_they_are_and_never_once_a_member_joined_here(
    kafka_broker, unique_topic, logs, fill
) -> None:
    kafka_broker.create_topic(unique_topic, 3)
    t0, t1, t2 = (TopicPartition(unique_topic, p) for p in range(3))
    group, excluded = f"{unique_topic}-app", f"{unique_topic}-excluded"
    commit(kafka_broker.bootstrap, group, {t0: (17, "m", 0), t1: (90, "", -1), t2: (3, "", -1)})
    commit(kafka_broker.bootstrap, excluded, {t0: (1, "", -1)})
    # The replica holds t-0 (50 records) and t-1 (50 records, high watermark 40), not t-2.
    batches = [producer_batch(i, [b"v"]) for i in range(50)]
    fill(logs, t0, batches)
    fill(logs, t1, batches, hw=40)
    config = GroupsConfig(
        enabled=True, include=(f"{unique_topic}-.*",), exclude=(excluded,), sync_interval_ms=100
    )

    def service() -> GroupService:
        return GroupService(
            Catalog(logs, rng=random.Random(0)),
            lambda: Node(0, "127.0.0.1", 9092),
            config=CoordinatorConfig(initial_rebalance_delay_ms=0),
            store_dir=logs.data_dir,
        )

    async def scenario() -> None:
        client = KafkaClient([kafka_broker.bootstrap], ClientSettings())
        groups = service()
        await groups.start()
        try:
            sync = SourceGroupSync(config, client, groups)
            async with asyncio.timeout(WAIT_S):
                await sync.sync_once()
            fetched = groups.coordinator.fetch_offsets(group, None).offsets
            assert {tp: (o.offset, o.leader_epoch, o.metadata) for tp, o in fetched.items()} == {
                t0: (17, 0, "m"),
                t1: (40, -1, ""),  # 90 at the source: held at the replica's high watermark
            }
            assert excluded not in groups.coordinator.groups
            snap = sync.snapshot()
            # A round ran, so the lag is measured (None before the first round); its value
            # is a wall-clock difference, not asserted.
            assert isinstance(snap["sync_lag_ms"], int)
            assert (
                snap["groups_synced"],
                snap["held_offsets"],
                snap["not_replicated_offsets"],
            ) == (
                1,
                1,
                1,
            )
            assert groups.store is not None and groups.store.offsets()[group][t0].offset == 17

            # The application fails over: a member joins the group on serve.
            member_id = (await answered(groups, join(group_id=group))).member_id
            await answered(groups, join(member_id, group_id=group))
            commit(kafka_broker.bootstrap, group, {t0: (20, "", -1)})
            async with asyncio.timeout(WAIT_S):
                await sync.sync_once()
            assert groups.coordinator.fetch_offsets(group, [t0]).offsets[t0].offset == 17
            assert sync.stopped == {group} and sync.snapshot()["groups_failed_over"] == 1
        finally:
            await groups.close()

        # serve restarted on the same store: the group is still the replica's own.
        again = service()
        await again.start()
        try:
            sync = SourceGroupSync(config, client, again)
            async with asyncio.timeout(WAIT_S):
                await sync.sync_once()
            assert again.coordinator.fetch_offsets(group, [t0]).offsets[t0].offset == 17
            assert sync.stopped == {group}
        finally:
            await again.close()
            await client.close()

    asyncio.run(scenario())


def test_read_only_groups_are_those_the_sync_chooses_and_only_when_asked() -> None:
    assert read_only_groups(GroupsConfig(enabled=True)) is None
    assert read_only_groups(GroupsConfig(enabled=False, read_only=True)) is None
    read_only = read_only_groups(
        GroupsConfig(enabled=True, read_only=True, include=("app-.*",), exclude=("app-own",))
    )
    assert read_only is not None
    assert [read_only(g) for g in ("app-1", "app-own", "other")] == [True, False, False]
