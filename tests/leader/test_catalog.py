"""The catalog: every local partition, led here; topic ids stable on disk; refreshes."""

from __future__ import annotations

import base64
import random
import uuid

from replicad.leader.catalog import METADATA_TOPIC_ID, ZERO_TOPIC_ID, Catalog, new_topic_id
from replicad.log.checkpoint import parse_partition_metadata
from replicad.log.config import LogConfig
from replicad.log.layout import PARTITION_METADATA
from replicad.log.manager import LogManager
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
KNOWN = uuid.UUID("5b8f1a8e-0a35-4c7b-9a0f-0c1b6f3a9d11")


def stored_id(logs: LogManager, tp: TopicPartition) -> uuid.UUID:
    path = logs.partitions()[tp].directory / PARTITION_METADATA
    return parse_partition_metadata(path.read_text(), source=str(path))


def test_a_topic_without_an_id_gets_one_written_to_every_partition(logs, fill) -> None:
    fill(logs, T0, [producer_batch(0, [b"a"])])
    fill(logs, T1, [])
    catalog = Catalog(logs, rng=random.Random(3))
    entry = catalog.topic("t", now_ms=0)
    assert entry is not None and sorted(entry.partitions) == [0, 1]
    assert stored_id(logs, T0) == stored_id(logs, T1) == entry.topic_id
    assert catalog.topic_name(entry.topic_id, now_ms=0) == "t"


def test_ids_survive_a_restart(tmp_path, fill) -> None:
    logs = LogManager.open(tmp_path / "d", LogConfig(), now_ms=0)
    fill(logs, T0, [producer_batch(0, [b"a"])])
    first = Catalog(logs, rng=random.Random(1)).topic_id("t", now_ms=0)
    logs.close()
    logs = LogManager.open(tmp_path / "d", LogConfig(), now_ms=0)
    try:
        again = Catalog(logs, rng=random.Random(2)).topic_id("t", now_ms=0)
    finally:
        logs.close()
    assert first == again


def test_partitions_missing_the_id_get_the_one_their_siblings_have(logs, fill) -> None:
    fill(logs, T0, [], topic_id=KNOWN)
    fill(logs, T1, [])
    assert Catalog(logs, rng=random.Random(0)).topic_id("t", now_ms=0) == KNOWN
    assert stored_id(logs, T1) == KNOWN


def test_disagreeing_partitions_keep_their_files_and_the_lowest_is_served(logs, fill) -> None:
    other = uuid.UUID(int=0xBEEF)
    fill(logs, T0, [], topic_id=KNOWN)
    fill(logs, T1, [], topic_id=other)
    assert Catalog(logs, rng=random.Random(0)).topic_id("t", now_ms=0) == KNOWN
    assert stored_id(logs, T1) == other


def test_generated_ids_are_ones_kafka_would_hand_out() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        topic_id = new_topic_id(rng)
        assert topic_id not in (ZERO_TOPIC_ID, METADATA_TOPIC_ID)
        assert not base64.urlsafe_b64encode(topic_id.bytes).decode().startswith("-")


def test_leader_epoch_is_the_latest_epoch_of_the_log_or_zero(logs, fill) -> None:
    plog = fill(
        logs,
        T0,
        [producer_batch(0, [b"a"], leader_epoch=4), producer_batch(1, [b"b"], leader_epoch=9)],
    )
    empty = fill(logs, T1, [])
    assert Catalog.leader_epoch(plog) == 9
    assert Catalog.leader_epoch(empty) == 0


def test_a_partition_created_later_is_seen_after_a_change_names_it(logs, fill) -> None:
    catalog = Catalog(logs, rng=random.Random(0), miss_refresh_ms=60_000)
    fill(logs, T0, [])
    assert catalog.partition(T0, now_ms=0) is not None
    fill(logs, U0, [])
    # A miss within the refresh interval does not rescan...
    assert catalog.partition(U0, now_ms=10) is None
    # ...a change naming the partition does.
    catalog.note_changed(U0)
    assert catalog.partition(U0, now_ms=20) is not None


def test_a_miss_rescans_at_most_once_per_interval(logs, fill) -> None:
    catalog = Catalog(logs, rng=random.Random(0), miss_refresh_ms=1000)
    fill(logs, T0, [])
    catalog.partition(T0, now_ms=0)
    refreshes = catalog.refreshes
    for now in range(0, 1000, 100):
        assert catalog.partition(TopicPartition("nope", 0), now_ms=now) is None
    assert catalog.refreshes == refreshes
    catalog.partition(TopicPartition("nope", 0), now_ms=1000)
    assert catalog.refreshes == refreshes + 1


def test_a_removed_partition_disappears_after_the_change_is_noted(logs, fill) -> None:
    fill(logs, T0, [])
    fill(logs, T1, [])
    catalog = Catalog(logs, rng=random.Random(0))
    assert catalog.partition(T1, now_ms=0) is not None
    logs.remove(T1)
    catalog.note_changed(T1)
    assert catalog.partition(T1, now_ms=0) is None
    entry = catalog.topic("t", now_ms=0)
    assert entry is not None and sorted(entry.partitions) == [0]
    assert not (logs.data_dir / "t-1").exists()


def test_a_partition_removed_and_created_again_before_the_change_is_noted_is_the_new_log(
    logs, fill
) -> None:
    fill(logs, T0, [producer_batch(0, [b"old"])])
    catalog = Catalog(logs, rng=random.Random(0))
    old = catalog.partition(T0, now_ms=0)
    assert old is not None
    logs.remove(T0)
    fill(logs, T0, [producer_batch(0, [b"new"]), producer_batch(1, [b"newer"])])
    # One change noted after both: the directory exists again, the held log is closed.
    catalog.note_changed(T0)
    now = catalog.partition(T0, now_ms=0)
    assert now is logs.partitions()[T0] and now is not old
    assert now.log_end_offset == 2
