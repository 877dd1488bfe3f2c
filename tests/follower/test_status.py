"""The replicator's status snapshot: what each partition's counters say."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.errors import DamagedLogError
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.follower.status import build_snapshot
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.metadata import TopicSelection
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch


def _partition(replicator: Replicator) -> dict[str, object]:
    snapshot = build_snapshot(replicator, uptime_s=1.0, rates={}, total_rate=0.0)
    (partition,) = snapshot["partitions"]
    return partition


async def test_a_partition_shows_its_records_and_whether_it_is_failing_now(tmp_path: Path) -> None:
    replicator = Replicator(ReplicatorSettings(("k:9092",), tmp_path, TopicSelection(("t",))))
    tp = TopicPartition("t", 0)
    state = PartitionState(tp, None, 1, 0, PartitionPhase.FETCHING)
    replicator.states[tp] = state
    state.delay(1_000, 100, "not_leader_or_follower")
    state.delay(2_000, 100, "not_leader_or_follower")
    failing = _partition(replicator)
    assert (failing["errors"], failing["consecutive_failures"]) == (2, 2)
    assert failing["last_error"] == "not_leader_or_follower"
    assert failing["leader_log_start_offset"] == -1  # the leader has not answered yet
    state.leader_log_start_offset, state.last_stable_offset = 7, 40
    state.records_replicated += 42
    state.succeeded()
    recovered = _partition(replicator)
    assert (recovered["errors"], recovered["consecutive_failures"]) == (2, 0)
    assert recovered["records_replicated"] == 42
    assert (recovered["leader_log_start_offset"], recovered["leader_last_stable_offset"]) == (7, 40)
    await replicator.client.close()


async def test_a_partition_whose_log_a_read_found_damaged_says_so_and_where(
    tmp_path: Path,
) -> None:
    replicator = Replicator(ReplicatorSettings(("k:9092",), tmp_path, TopicSelection(("t",))))
    tp = TopicPartition("t", 0)
    replicator.states[tp] = PartitionState(tp, None, 1, 0, PartitionPhase.FETCHING)
    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    replicator.logs = logs
    plog = logs.get_or_create(tp)
    written = [producer_batch(i, [bytes(100)]) for i in range(4)]
    for batch in written:
        plog.append(batch, scan_batches(batch).batches, now_ms=0)
    assert (_partition(replicator)["damaged_reads"], _partition(replicator)["damaged_offset"]) == (
        0,
        None,
    )
    with open(plog.active_segment.log_path, "r+b") as f:
        f.seek(sum(len(b) for b in written[:2]) + 16)  # the magic byte of batch 2
        f.write(b"\x07")
    with pytest.raises(DamagedLogError):
        plog.read(2, 1 << 20)
    row = _partition(replicator)
    assert (row["damaged_reads"], row["damaged_offset"]) == (1, 2)
    snapshot = build_snapshot(replicator, uptime_s=1.0, rates={}, total_rate=0.0)
    assert snapshot["totals"]["damaged_reads"] == 1
    logs.close()
    await replicator.client.close()
