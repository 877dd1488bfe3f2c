"""The replicator's status snapshot: what each partition's counters say."""

from __future__ import annotations

from pathlib import Path

from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.follower.status import build_snapshot
from replicad.protocol.metadata import TopicSelection
from replicad.types import TopicPartition


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
