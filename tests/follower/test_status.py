"""The replicator's status snapshot: what each partition's counters say."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from replicad.clock import monotonic_ms
from replicad.control.health import assess
from replicad.control.stalls import StallWatch, partition_name
from replicad.control.status_view import render_status_line
from replicad.errors import DamagedLogError
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.follower.status import ProblemRow, build_snapshot, partition_row, partition_rows
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.metadata import TopicSelection
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch


def _light_snapshot(replicator: Replicator, stall_ms: int, now_ms: int) -> dict:
    """The status loop's snapshot: only the rows health and the stall watch read."""
    return build_snapshot(
        replicator,
        uptime_s=1.0,
        rates={},
        total_rate=0.0,
        problems_after_ms=stall_ms,
        now_ms=now_ms,
    )


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
    state.answers_since_move, state.turns = 2, "ef"  # the partition table's record
    assert recovered["turns_since_move"] == []
    assert _partition(replicator)["turns_since_move"] == [
        "no partition of the answer served",
        "failed by the leader",
    ]
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


async def test_the_status_loops_snapshot_has_the_rows_health_and_the_stall_watch_read(
    tmp_path: Path,
) -> None:
    """With problems_after_ms, only the rows health and the stall watch could name are
    built, the totals are the full snapshot's, and health, STATUS= and the stall watch
    come out the same as from every row."""
    replicator = Replicator(ReplicatorSettings(("k:9092",), tmp_path, TopicSelection(("t",))))
    now = monotonic_ms()
    stall_ms = 60_000
    kinds = {
        0: ("caught up", PartitionPhase.FETCHING, 1, 10, 10, now - 10 * stall_ms),
        1: ("lagging, moving", PartitionPhase.FETCHING, 1, 10, 50, now),
        2: ("lagging, idle (stalled)", PartitionPhase.FETCHING, 1, 10, 50, now - 2 * stall_ms),
        3: ("lagging, idle, leader down", PartitionPhase.FETCHING, 2, 10, 50, now - 2 * stall_ms),
        4: ("halted", PartitionPhase.HALTED, 1, 10, 50, now),
        5: ("truncating", PartitionPhase.TRUNCATING, 1, 10, 50, now),
        6: ("offline", PartitionPhase.FETCHING, -1, 10, 50, now),
        7: ("starting", PartitionPhase.NEEDS_OFFSET, 1, 0, -1, now - 2 * stall_ms),
        8: ("damaged", PartitionPhase.FETCHING, 1, 10, 10, now),
    }
    for i, (_, phase, leader, offset, hw, progress) in kinds.items():
        tp = TopicPartition("t", i)
        state = PartitionState(tp, None, leader, 0, phase, fetch_offset=offset)
        state.high_watermark, state.progress_ms, state.gaps = hw, progress, i
        replicator.states[tp] = state
    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    replicator.logs = logs
    damaged = logs.get_or_create(TopicPartition("t", 8))
    damaged.damaged_reads, damaged.damaged_offset = 3, 7

    # Both at one moment: idle times taken a millisecond apart would differ.
    full = build_snapshot(replicator, uptime_s=1.0, rates={}, total_rate=0.0, now_ms=now)
    light = _light_snapshot(replicator, stall_ms, now)
    assert [p["partition"] for p in light["partitions"]] == [2, 3, 4, 5, 6, 8]
    # The fields health and the stall watch read, as in the full rows.
    assert [dict(p) for p in light["partitions"]] == [
        {key: p[key] for key in ProblemRow.__slots__}
        for p in full["partitions"]
        if p["partition"] in {2, 3, 4, 5, 6, 8}
    ]
    assert light["totals"] == full["totals"]
    # What `replicad status` is answered with: every row, made one at a time (JsonRows).
    assert list(partition_rows(replicator, now)) == full["partitions"]
    assert full["totals"]["partitions"] == 9 and full["totals"]["gaps"] == sum(range(9))
    leaders = [{"node_id": 1, "connected": True}, {"node_id": 2, "connected": False}]
    for snap in (full, light):
        snap["leaders"] = leaders
        snap["stalls"] = {"stall_after_ms": stall_ms}
    assert assess(light) == assess(full)
    codes = {r.code for r in assess(full).reasons}
    assert {"partitions_stalled", "partitions_halted", "replica_damaged"} <= codes
    assert render_status_line(light) == render_status_line(full)
    watches = StallWatch(stall_ms), StallWatch(stall_ms)
    changes = (
        watches[0].check(full["partitions"], leaders),
        watches[1].check(light["partitions"], leaders),
    )
    assert [[partition_name(p) for p in c.began] for c in changes] == [["t-2"]] * 2
    assert watches[0].stalled == watches[1].stalled and watches[0].stalled.keys() == {"t-2"}
    # A stall's log line takes the partition's full row.
    assert partition_row(replicator, TopicPartition("t", 2), now) == full["partitions"][2]
    logs.close()
    await replicator.client.close()


async def test_the_status_loop_holds_no_full_row_of_the_partitions_it_names_stalled(
    tmp_path: Path,
) -> None:
    """While 10,000 partitions catch up, nearly all are lagging and idle past the stall time,
    and the status loop (every 2 s) names them all stalled: its snapshot, the stall check and
    health hold a slim row and a name each, not a dict of every field (issue 32: 5-8 MiB of
    heap at the daemon's peak). Fails on the old code: 1,113 bytes a partition at its peak
    (tracemalloc), against 401 now; the bound is 800."""
    replicator = Replicator(ReplicatorSettings(("k:9092",), tmp_path, TopicSelection(("t",))))
    now = monotonic_ms()
    stall_ms = 60_000
    count = 2_000
    for i in range(count):
        tp = TopicPartition("catching-up", i)
        state = PartitionState(tp, None, 1, 0, PartitionPhase.FETCHING, fetch_offset=10)
        state.high_watermark, state.progress_ms = 50, now - 2 * stall_ms
        replicator.states[tp] = state
    leaders = [{"node_id": 1, "connected": True}]
    watch = StallWatch(stall_ms)
    tracemalloc.start()
    try:
        snap = _light_snapshot(replicator, stall_ms, now)
        snap["leaders"], snap["stalls"] = leaders, {"stall_after_ms": stall_ms}
        change = watch.check(snap["partitions"], leaders)
        health = assess(snap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(change.began) == len(watch.stalled) == count
    (stalled,) = (r for r in health.reasons if r.code == "partitions_stalled")
    assert stalled.text.startswith(f"{count} partitions lagging")
    assert stalled.text.endswith("catching-up-4 and 1995 more")
    assert peak < 800 * count, peak / count
    await replicator.client.close()


class _StubLog:
    """What the partition table reads of a log that refuses every append (disk full)."""

    log_start_offset = 0
    log_end_offset = 10
    high_watermark = 10

    def latest_epoch(self) -> int | None:
        return None


async def test_a_partition_paused_on_a_full_disk_is_not_stalled_until_the_disk_took_appends(
    tmp_path: Path,
) -> None:
    """A fake clock through the table, the snapshot, the stall watch and health, with a stall
    time shorter than the retry (DISK_FULL_RETRY_MS): the disk refuses every retry for ten
    stall times -- named by health as a full disk, never stalled; then the disk has room
    and the leader sends nothing: stalled the stall time after that retry, not before."""
    from replicad.follower.actions import Append
    from replicad.follower.fetch_settings import FetchSettings
    from replicad.follower.partition_table import DISK_FULL_RETRY_MS, PartitionTable
    from replicad.follower.validate import validate_fetched

    replicator = Replicator(ReplicatorSettings(("k:9092",), tmp_path, TopicSelection(("t",))))
    table = PartitionTable(1, FetchSettings())
    tp = TopicPartition("t", 0)
    state = PartitionState(tp, None, 1, 0, PartitionPhase.FETCHING, fetch_offset=10)
    state.high_watermark = 50
    table.add(state, _StubLog())
    replicator.states[tp] = state
    replicator.ready.set()
    stall_ms = 2_000
    assert stall_ms < DISK_FULL_RETRY_MS  # timing-ok: two settings compared, no clock read
    watch = StallWatch(stall_ms)
    leaders = [{"node_id": 1, "connected": True}]
    refused = Append(
        tp, validate_fetched(producer_batch(10, [b"x"]), fetch_offset=10, log_is_empty=False)
    )

    def look(now: int) -> tuple[set[str], set[str]]:
        """(health's reason codes, the stalled partitions) at `now`."""
        snap = _light_snapshot(replicator, stall_ms, now)
        snap["leaders"], snap["stalls"] = leaders, {"stall_after_ms": stall_ms}
        watch.check(snap["partitions"], leaders)
        return {r.code for r in assess(snap).reasons}, set(watch.stalled)

    disk_full = ({"partitions_disk_full"}, set())
    now = 1_000
    table.append_failed(refused, "No space left on device", now, disk_full=True)
    while now < 10 * stall_ms:
        assert look(now + DISK_FULL_RETRY_MS - 1) == disk_full, now  # paused
        now += DISK_FULL_RETRY_MS
        assert table.next_fetch(now, max_version=13) is not None  # the retry: fetching again
        assert state.phase is PartitionPhase.FETCHING
        assert look(now + 99) == disk_full, now  # retrying, its log idle far past the stall
        now += 100
        table.append_failed(refused, "No space left on device", now, disk_full=True)
    snap = build_snapshot(replicator, uptime_s=1.0, rates={}, total_rate=0.0, now_ms=now + 1)
    assert snap["totals"]["last_disk_full_ago_ms"] == 1
    assert snap["partitions"][0]["disk_full_ago_ms"] == 1
    assert snap["partitions"][0]["last_error"] == "disk full"

    # The disk has room; the leader answers the retry with no records: no append, no refusal.
    now += DISK_FULL_RETRY_MS
    assert table.next_fetch(now, max_version=13) is not None
    assert look(now + stall_ms - 1) == disk_full
    assert look(now + stall_ms) == ({"partitions_stalled"}, {"t-0"})
    await replicator.client.close()
