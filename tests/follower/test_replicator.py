"""Replicator, the follower's shell over every leader: it asks the metadata, opens the
logs, runs one fetcher per leader, halts a partition whose topic was re-created upstream
(its local data kept), and stops cleanly with nothing held. Against the scripted leader
(tools/peers), which a test can re-create."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from replicad.follower.fetch_settings import FetchSettings
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.replicator import (
    HIGH_WATERMARKS_LEAD_MS,
    Replicator,
    ReplicatorSettings,
    _next_high_watermarks,
)
from replicad.protocol.metadata import TopicSelection
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.scripted_leader import ScriptedLeader
from tools.replica import end_offsets, segment_bytes
from tools.wait import until

TOPIC = "replicated"
TP = TopicPartition(TOPIC, 0)


def _batches(count: int) -> list[bytes]:
    return [
        producer_batch(5 * i, [b"v%d" % j for j in range(5)], leader_epoch=1) for i in range(count)
    ]


def _replicator(port: int, data_dir) -> Replicator:
    return Replicator(
        ReplicatorSettings(
            bootstrap_servers=(f"127.0.0.1:{port}",),
            data_dir=data_dir,
            selection=TopicSelection(include=(TOPIC,)),
            fetch=FetchSettings(backoff_ms=20, wait_max_ms=50),
        )
    )


async def test_replicates_halts_a_recreated_topic_and_stops_cleanly(tmp_path):
    batches = _batches(8)
    leader = ScriptedLeader(TOPIC)
    leader.set_log(batches, leader_epoch=1)
    port = await leader.start()
    data_dir = tmp_path / "data"
    try:
        replicator = _replicator(port, data_dir)
        stop = asyncio.Event()
        task = asyncio.create_task(replicator.run(stop))
        await until(lambda: end_offsets(data_dir).get(TP) == 40, what="40 offsets replicated")
        assert set(replicator.fetchers) == {leader.node_id}
        state = replicator.states[TP]
        assert state.phase is PartitionPhase.FETCHING and state.topic_id == leader.topic_id
        stop.set()
        await asyncio.wait_for(task, 30)
        assert replicator.pool.account.used == 0
        assert segment_bytes(data_dir / f"{TOPIC}-0") == b"".join(batches)

        # The topic is deleted and created again upstream: a new id, another history.
        leader.topic_id = uuid.uuid4()
        leader.set_log(_batches(2), leader_epoch=2)
        again = _replicator(port, data_dir)
        stop = asyncio.Event()
        task = asyncio.create_task(again.run(stop))
        await until(
            lambda: TP in again.states and again.states[TP].phase is PartitionPhase.HALTED,
            what="the partition halted",
        )
        assert "recreated" in (again.states[TP].last_error or "")
        stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        await leader.close()
    # Halted, not truncated: the replica keeps what it had.
    assert segment_bytes(data_dir / f"{TOPIC}-0") == b"".join(batches)


async def test_high_watermarks_are_written_between_checkpoints_when_asked(tmp_path):
    from replicad.log.checkpoint import parse_offsets
    from replicad.log.layout import RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT

    leader = ScriptedLeader(TOPIC)
    leader.set_log(_batches(8), leader_epoch=1)
    port = await leader.start()
    data_dir = tmp_path / "data"

    def written(name: str) -> int | None:
        try:
            return parse_offsets((data_dir / name).read_text(), source=name).get(TP)
        except FileNotFoundError:
            return None

    try:
        replicator = Replicator(
            ReplicatorSettings(
                bootstrap_servers=(f"127.0.0.1:{port}",),
                data_dir=data_dir,
                selection=TopicSelection(include=(TOPIC,)),
                fetch=FetchSettings(backoff_ms=20, wait_max_ms=50),
                checkpoint_interval_ms=3_600_000,  # no checkpoint while the test runs
                high_watermark_interval_ms=50,
            )
        )
        stop = asyncio.Event()
        task = asyncio.create_task(replicator.run(stop))
        await until(
            lambda: written(REPLICATION_OFFSET_CHECKPOINT) == 40,
            what="the high watermark 40 in replication-offset-checkpoint",
        )
        # Written alone: no checkpoint ran, so no recovery point names the records.
        assert (written(RECOVERY_POINT_CHECKPOINT) or 0) < 40
        stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        await leader.close()
    assert written(RECOVERY_POINT_CHECKPOINT) == 40  # the checkpoint at shutdown


def test_high_watermarks_alone_are_written_just_before_the_wall_clocks_whole_intervals():
    """Spark's processing-time triggers fire on the wall clock's whole multiples of their
    interval: the file is written HIGH_WATERMARKS_LEAD_MS before each whole multiple of its
    own interval, whatever the monotonic clock's phase (a period counted from replicad's
    start left it 0 to 200 ms old at a trigger, by chance)."""
    settings = ReplicatorSettings(
        bootstrap_servers=("127.0.0.1:9",),
        data_dir=Path("unused"),
        selection=TopicSelection(include=(TOPIC,)),
        high_watermark_interval_ms=200,
    )
    for wall in range(1_000_000_000, 1_000_000_400, 7):
        due = _next_high_watermarks(5_000, wall, settings) - 5_000
        assert 0 < due <= 200
        assert (wall + due + HIGH_WATERMARKS_LEAD_MS) % 200 == 0
    # Right after the write due at 1,000,000,150 (4 ms late): the next at 1,000,000,350.
    assert _next_high_watermarks(5_000, 1_000_000_154, settings) == 5_196
    without = ReplicatorSettings(
        bootstrap_servers=("127.0.0.1:9",),
        data_dir=Path("unused"),
        selection=TopicSelection(include=(TOPIC,)),
    )
    assert _next_high_watermarks(5_000, 1_000_000_154, without) == float("inf")
