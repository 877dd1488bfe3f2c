"""Rendering `replicad status`: table, JSON, progress and ETA, and the watch loop."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest

from replicad.control.status_view import (
    CLEAR_SCREEN,
    format_bytes,
    format_duration,
    progress,
    progress_bar,
    render_json,
    render_progress,
    render_status_line,
    render_table,
    watch,
)
from replicad.errors import DaemonNotRunning
from tests.status_snapshot import leader_entry, partition_entry, status_snapshot


def lead_snapshot() -> dict[str, Any]:
    """Exactly the shape the daemon produces (see the lead's interface note)."""
    return status_snapshot(
        totals={
            "leaders": 3,
            "partitions": 24,
            "lag": 1000,
            "bytes_replicated": 123456,
            "bytes_per_s": 1.0e6,
            "crc_failures": 0,
            "session_recoveries": 0,
            "partitions_by_state": {"fetching": 24},
        },
        leaders=[
            leader_entry(
                partitions=8,
                # the last answer waited out the long poll; the last one with records took 2.1
                last_fetch_latency_ms=505.3,
                last_data_latency_ms=2.1,
                session_recoveries={"fetch_session_id_not_found": 1},
            )
        ],
        partitions=[partition_entry("t", 0, 10, 12, bytes_replicated=1234)],
    )


def with_partitions(parts: list[dict[str, Any]]) -> dict[str, Any]:
    snap = lead_snapshot()
    snap["partitions"] = parts
    return snap


def rows_of(table: str, section: str) -> list[str]:
    """The data lines of a table section (after its title and column header)."""
    lines = table.split("\n\n")
    block = next(b for b in lines if b.startswith(section)).splitlines()
    return block[2:]


def test_table_shows_leader_partition_and_totals() -> None:
    table = render_table(lead_snapshot())
    health, header = table.split("\n\n")[:2]
    assert health == "health: HEALTHY"
    assert header.startswith("replicad 0.1.0  pid 123  up 12s  ready")
    (leader_row,) = rows_of(table, "LEADERS")
    assert leader_row.split() == [
        "1", "h:9092", "123", "5", "sessionful", "8", "2.1", "ms", "976.6", "KiB/s",
        "100", "0", "1", "-",
    ]  # fmt: skip
    (partition_row,) = rows_of(table, "PARTITIONS")
    assert partition_row.split() == ["t-0", "1", "10", "12", "2", "fetching", "-"]
    totals = table.split("TOTALS\n")[1]
    assert "leaders 3" in totals and "partitions 24 (fetching 24)" in totals
    assert "lag 1,000" in totals and "replicated 120.6 KiB" in totals


def test_sessionless_leader_shows_no_session_and_the_last_error() -> None:
    snap = lead_snapshot()
    snap["leaders"][0].update(
        sessionful=False, session_id=0, epoch=0, errors=3, last_error="NOT_LEADER_OR_FOLLOWER"
    )
    (row,) = rows_of(render_table(snap), "LEADERS")
    cells = row.split()
    assert cells[2:5] == ["-", "-", "sessionless"]
    assert cells[-1] == "NOT_LEADER_OR_FOLLOWER"


def test_serve_and_memory_pool_lines_appear_when_present() -> None:
    snap = lead_snapshot()
    assert "serving" not in render_table(snap)
    snap["serve"] = {
        "listen": "127.0.0.1:9093",
        "sessions": 4,
        "partitions_cached": 1200,
        "evictions_total": 9,
    }
    snap["memory_pool"] = {"capacity": 100 << 20, "used": 25 << 20, "peak": 96 << 20, "waits": 1234}
    header = render_table(snap).split("\n\n")[1]
    assert (
        "serving on 127.0.0.1:9093: 4 fetch sessions, 1,200 partitions cached, 9 evictions"
        in header
    )
    assert "memory pool 25.0 MiB of 100.0 MiB, peak 96.0 MiB, 1,234 waits" in header
    assert "consumer groups" not in header  # none yet
    snap["serve"]["groups"] = {"Empty": 0, "Stable": 2, "PreparingRebalance": 1}
    snap["serve"]["group_rebalances_total"] = 5
    snap["serve"]["offset_commits_total"] = 1500
    header = render_table(snap).split("\n\n")[1]
    assert (
        "consumer groups: 2 Stable, 1 PreparingRebalance; 5 rebalances, "
        "1,500 offsets committed" in header
    )
    assert "group offsets from the source" not in header  # groups.enabled is off
    snap["serve"]["group_sync"] = {
        "groups_synced": 4,
        "groups_failed_over": 1,
        "held_offsets": 2,
        "problem": "source unreachable",
    }
    header = render_table(snap).split("\n\n")[1]
    assert (
        "group offsets from the source: 4 groups synced, 1 failed over here, "
        "2 held at the high watermark; problem: source unreachable" in header
    )


def test_10000_partitions_are_capped_largest_lag_first() -> None:
    parts = [partition_entry("t", i, 1000, 1000 + (i * 7919) % 10_000) for i in range(10_000)]
    table = render_table(with_partitions(parts))
    rows = rows_of(table, "PARTITIONS")
    assert len(rows) == 51
    assert rows[-1] == "... 9,950 more (use --json, or --all)"
    lags = [int(row.split()[4].replace(",", "")) for row in rows[:-1]]
    assert lags == sorted(lags, reverse=True)
    assert lags[0] == max(p["lag"] for p in parts)
    everything = rows_of(render_table(with_partitions(parts), all_partitions=True), "PARTITIONS")
    assert len(everything) == 10_000


def test_partitions_needing_attention_come_before_larger_lags() -> None:
    parts = [
        partition_entry("t", 0, 0, 5000),
        partition_entry("t", 1, 90, 100, state="halted"),
        partition_entry("t", 2, 100, 100, last_error="CORRUPT_MESSAGE"),
        partition_entry("t", 3, 0, 10),
    ]
    rows = rows_of(render_table(with_partitions(parts)), "PARTITIONS")
    assert [row.split()[0] for row in rows] == ["t-1", "t-2", "t-0", "t-3"]


def test_status_line_for_systemd() -> None:
    snap = lead_snapshot()
    assert render_status_line(snap) == ("healthy; 3 leaders, 24 partitions, lag 1,000, 976.6 KiB/s")
    snap["totals"]["partitions_by_state"] = {"fetching": 21, "halted": 2, "truncating": 1}
    assert render_status_line(snap) == (
        "healthy; 3 leaders, 24 partitions (2 halted, 1 truncating), lag 1,000, 976.6 KiB/s"
    )


def test_json_is_the_snapshot_itself() -> None:
    snap = lead_snapshot()
    assert json.loads(render_json(snap)) == snap


def test_progress_rate_eta_and_fraction() -> None:
    prev = with_partitions(
        [partition_entry("t", 0, 2000, 10_000), partition_entry("t", 1, 500, 500)]
    )
    # 10s later: fetched 3000 offsets while the leader appended 1000 -> lag shrank by 2000.
    cur = with_partitions(
        [partition_entry("t", 0, 5000, 11_000), partition_entry("t", 1, 500, 500)]
    )
    report = progress(prev, cur, 10.0)
    (row,) = report.partitions  # t-1 is caught up
    assert (row.topic, row.partition, row.lag) == ("t", 0, 6000)
    assert row.rate == pytest.approx(300.0)
    assert row.eta_s == pytest.approx(6000 / 200.0)
    assert row.fraction == pytest.approx(5000 / 11_000)
    assert report.total_lag == 6000
    assert report.eta_s == pytest.approx(30.0)


def test_a_lag_that_is_not_shrinking_has_no_eta() -> None:
    prev = with_partitions([partition_entry("t", 0, 1000, 2000)])
    cur = with_partitions([partition_entry("t", 0, 1500, 3000)])
    report = progress(prev, cur, 5.0)
    assert report.partitions[0].rate == pytest.approx(100.0)
    assert report.partitions[0].eta_s is None
    assert report.eta_s is None


def test_first_snapshot_has_no_rate_yet() -> None:
    report = progress(None, with_partitions([partition_entry("t", 0, 0, 100)]), 0.0)
    assert report.partitions[0].rate == 0.0
    assert report.partitions[0].eta_s is None


def test_progress_rendering() -> None:
    prev = with_partitions([partition_entry("t", i, 0, 1000) for i in range(12)])
    cur = with_partitions([partition_entry("t", i, 500, 1000) for i in range(12)])
    text = render_progress(progress(prev, cur, 5.0))
    lines = text.splitlines()
    assert lines[0].startswith("CATCHING UP  12 partitions  lag 6,000  1,200 msg/s  ETA 5s")
    assert lines[1] == "t-0  [############------------]  50.0%  lag 500  100 msg/s  ETA 5s"
    assert lines[-1] == "... 2 more catching up"
    caught_up = with_partitions([partition_entry("t", 0, 10, 10)])
    assert "all partitions caught up" in render_progress(progress(cur, caught_up, 1.0))


def test_bar_and_units() -> None:
    assert progress_bar(0.0, 4) == "[----]"
    assert progress_bar(0.5, 4) == "[##--]"
    assert progress_bar(1.7, 4) == "[####]"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"
    assert format_duration(None) == "-"
    assert format_duration(59.6) == "1m00s"
    assert format_duration(3 * 3600 + 120) == "3h02m"
    assert format_duration(2 * 86_400 + 3600) == "2d01h"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_redraws_with_progress_and_survives_a_restart() -> None:
    first = with_partitions([partition_entry("t", 0, 0, 10_000)])
    second = with_partitions([partition_entry("t", 0, 4000, 10_000)])
    answers: list[Any] = [first, second, DaemonNotRunning("/run/replicad/control.sock"), first]
    now = [100.0]
    slept: list[float] = []

    def query_fn() -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    out = FakeTerminal()
    code = watch(query_fn, 2.0, out, max_frames=4, clock=lambda: now[0], sleep=sleep)
    assert code == 0
    assert slept == [2.0, 2.0, 2.0]
    frames = out.getvalue().split(CLEAR_SCREEN)[1:]
    assert len(frames) == 4
    assert "ETA -" in frames[0]  # one snapshot: no rate yet
    # 4000 offsets in 2s, lag 6000 shrinking at 2000/s.
    assert "t-0  [##########--------------]  40.0%  lag 6,000  2,000 msg/s  ETA 3s" in frames[1]
    assert (
        "replicad is not running (no control socket at /run/replicad/control.sock)" in (frames[2])
    )
    assert "ETA -" in frames[3]  # after a restart the rate starts over


def test_watch_stops_quietly_on_ctrl_c() -> None:
    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    assert watch(lead_snapshot, 1.0, out, sleep=interrupted) == 0
    assert CLEAR_SCREEN not in out.getvalue()  # not a terminal: plain frames
    assert "PARTITIONS (1;" in out.getvalue()


def test_mirror_section_shows_local_end_mirrored_offset_and_lag_halted_first() -> None:
    snap = lead_snapshot()
    snap["mirror"] = {
        "destination": "b:9092",
        "running": True,
        "lag": 40,
        "produce_requests": 12,
        "produce_errors": 1,
        "problem": None,
        "topic_errors": {"pay": "has 2 partitions, the source 4"},
        "partitions": [
            {"topic": "t", "partition": 0, "local_log_end": 100, "mirrored_offset": 60,
             "destination_next_offset": 58, "lag": 40, "offsets_kept": False,
             "state": "mirroring", "error": None},
            {"topic": "t", "partition": 1, "local_log_end": 10, "mirrored_offset": 10,
             "destination_next_offset": 10, "lag": 0, "offsets_kept": True,
             "state": "halted", "error": "destination refused the batch"},
        ],
    }  # fmt: skip
    table = render_table(snap)
    section = table.split("\n\n")[-1]
    assert section.startswith("MIRROR to b:9092  running  lag 40")
    assert "topic pay: has 2 partitions" in section
    rows = [line.split()[:7] for line in section.splitlines()[3:]]
    assert rows == [
        ["t-1", "10", "10", "10", "0", "kept", "halted"],
        ["t-0", "100", "60", "58", "40", "mapped", "mirroring"],
    ]


def test_an_idle_leaders_long_poll_is_not_shown_as_latency() -> None:
    snap = lead_snapshot()
    leader = snap["leaders"][0]
    leader["last_data_latency_ms"] = None  # only idle answers so far
    (row,) = rows_of(render_table(snap), "LEADERS")
    assert "505.3" not in row and row.split()[6] == "-"


def test_synced_groups_are_shown_under_the_mirror_failed_over_first() -> None:
    snap = lead_snapshot()
    snap["mirror"] = {
        "destination": "b:9092", "running": True, "partitions": [],
        "groups": {
            "enabled": True, "groups_synced": 1, "groups_failed_over": 1,
            "held_back_offsets": 30, "sync_lag_ms": 5_000, "sync_errors_total": 0,
            "promoted_topics": {"orders": 1_700_000_000_000},
            "groups": {
                "billing": {"state": "syncing", "last_sync_ms": 1_700_000_000_000,
                            "partitions": 3, "held_back_offsets": 30, "skipped": {}},
                "shop": {"state": "failed_over", "partitions": 0, "held_back_offsets": 0,
                         "skipped": {"audit-0": "not mirrored"},
                         "reason": "2 member(s) at the destination"},
                "old": {"state": "syncing", "last_sync_ms": 1_700_000_000_000,
                        "partitions": 0, "held_back_offsets": 0, "skipped": {},
                        "absent_since_ms": 1_700_000_060_000},
            },
        },
    }  # fmt: skip
    section = render_table(snap).split("\n\n")[-1]
    assert "promoted (no longer mirrored): orders" in section
    assert "GROUPS synced 1  failed over 1  held back 30 offsets  sync lag 5.0s" in section
    rows = [line.split()[:6] for line in section.splitlines() if line.startswith(("b", "s", "o"))]
    assert rows == [
        ["shop", "failed_over", "-", "0", "0", "1"],
        ["billing", "syncing", "22:13:20", "3", "30", "0"],
        ["old", "syncing", "22:13:20", "0", "0", "0"],
    ]
    assert "gone at the source since 22:14:20" in section


def test_the_archive_and_serves_reads_of_it_are_shown() -> None:
    snap = lead_snapshot()
    snap["archive"] = {
        "bucket": "s3://replica/east",
        "uploaded_segments": 12,
        "uploaded_bytes": 3 * 1024 * 1024,
        "pending_segments": 2,
        "failures": 5,
        "retrying_partitions": ["t-0"],
        "last_error": "s3://replica/east/t-0/manifest.json: PUT failed: SlowDown",
    }
    snap["serve"] = {"sessions": 0, "remote_fetches_total": 7, "remote_fetches_in_flight": 1}
    out = render_table(snap)
    assert (
        "archive s3://replica/east: 12 segments uploaded (3.0 MiB), 2 pending, 5 failed "
        "uploads; retrying t-0: s3://replica/east/t-0/manifest.json: PUT failed: SlowDown"
    ) in out
    assert "serving from the archive: 7 reads of the bucket" in out
    assert "archive uploads failing for 1 partition(s)" in out  # the health headline


def test_verify_section_shows_verified_offsets_and_a_mismatch_as_an_error_first() -> None:
    from replicad.types import TopicPartition
    from replicad.verify.compare import Kind, Mismatch, OffsetRange, PartitionResult
    from replicad.verify.progress import VerifyProgress

    progress = VerifyProgress()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    progress.plan({a: OffsetRange(0, 500), b: OffsetRange(0, 90)})
    progress.walked(PartitionResult(a, OffsetRange(0, 500), 200, batches_compared=7))
    differs = Mismatch(42, 44, Kind.DIFFERENT_BYTES, "first difference at byte 70")
    progress.walked(
        PartitionResult(b, OffsetRange(0, 90), 90, batches_compared=3, mismatches=[differs])
    )
    snap = lead_snapshot()
    snap["verify"] = {
        **progress.snapshot(),
        "running": True,
        "max_bytes_per_second": 1 << 20,
        "bytes_fetched": 2048,
    }
    section = render_table(snap).split("\n\n")[-1]
    assert section.startswith("VERIFY against the source  running  0 passes  10 batches")
    assert "(at most 1.0 MiB/s)" in section and "unverified 300 offsets  1 mismatches" in section
    rows = section.splitlines()[2:]
    assert rows[0].split()[:5] == ["t-1", "90", "90", "0", "3"]
    assert rows[0].endswith("ERROR at offset 42: different_bytes")
    assert rows[1].split() == ["t-0", "200", "500", "300", "7", "-"]
