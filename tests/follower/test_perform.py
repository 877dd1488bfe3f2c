"""ActionPerformer: the table's actions done on a real log, in order, each followed by the
table's outcome handler, every change reported; a full disk or a failing log is the
table's to handle, never raised."""

from __future__ import annotations

from dataclasses import dataclass, field

from replicad.errors import DiskFullError, LogError
from replicad.follower.actions import (
    Append,
    Halt,
    RequestMetadata,
    SetHighWatermark,
    StartAt,
    Truncate,
)
from replicad.follower.perform import ActionPerformer
from replicad.follower.validate import validate_fetched
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


@dataclass
class _State:
    log: PartitionLog


@dataclass
class _Table:
    """What the performer uses of a PartitionTable, recording each outcome it is told."""

    partitions: dict[TopicPartition, _State]
    told: list[tuple[str, object]] = field(default_factory=list)
    # What `appended` / `truncated` answer (the table's follow-up actions).
    follow_up: list[object] = field(default_factory=list)

    def appended(self, append, now_ms):
        self.told.append(("appended", append.tp))
        return self.follow_up

    def append_failed(self, append, error, now_ms, *, disk_full):
        self.told.append(("append_failed", (append.tp, disk_full)))

    def truncated(self, action):
        self.told.append(("truncated", action.offset))
        return []


def _setup(tmp_path):
    logs = LogManager.open(tmp_path, LogConfig(), now_ms=0)
    local = logs.get_or_create(TP)
    table = _Table({TP: _State(local)})
    metadata: list[str] = []
    changed: list[TopicPartition] = []
    performer = ActionPerformer(
        table, request_metadata=metadata.append, changed=changed.append, wall_ms=lambda: 1_000
    )
    return logs, local, table, performer, metadata, changed


def _append(base: int, count: int) -> Append:
    data = producer_batch(base, [b"v%d" % i for i in range(count)], leader_epoch=1)
    return Append(TP, validate_fetched(data, fetch_offset=base, log_is_empty=base == 0))


def test_actions_run_in_order_each_answered_and_reported(tmp_path):
    logs, local, table, performer, metadata, changed = _setup(tmp_path)
    table.follow_up = [SetHighWatermark(TP, 3)]
    actions = [RequestMetadata("leader moved"), _append(0, 5), _append(5, 5), Truncate(TP, 5, "x")]
    performer.perform(actions, now_ms=5)
    # Each append's follow-up (the high watermark) ran before the next action.
    assert table.told == [("appended", TP), ("appended", TP), ("truncated", 5)]
    assert metadata == ["leader moved"]
    assert local.log_end_offset == 5
    assert local.high_watermark == 3
    # Two appends, two high watermarks, one truncation.
    assert changed == [TP] * 5
    logs.close()


def test_start_at_empties_the_log_and_a_halt_is_reported(tmp_path):
    logs, local, table, performer, _, changed = _setup(tmp_path)
    performer.perform([_append(0, 5), StartAt(TP, 100, "gap"), Halt(TP, "why")], now_ms=5)
    assert (local.log_start_offset, local.log_end_offset) == (100, 100)
    assert table.told == [("appended", TP), ("truncated", 100)]
    assert changed == [TP, TP, TP]
    logs.close()


def test_a_partition_gone_since_the_decision_is_skipped(tmp_path):
    logs, _, table, performer, _, changed = _setup(tmp_path)
    performer.perform([Truncate(OTHER, 0, "moved"), SetHighWatermark(OTHER, 9)], now_ms=5)
    assert table.told == [] and changed == []
    logs.close()


def test_a_full_disk_or_a_failing_log_goes_to_the_table(tmp_path, monkeypatch):
    logs, local, table, performer, _, changed = _setup(tmp_path)
    failures = iter([DiskFullError("no space"), LogError("bad sector")])

    def failing_append(*args, **kwargs):
        raise next(failures)

    monkeypatch.setattr(PartitionLog, "append", failing_append)
    performer.perform([_append(0, 5), _append(0, 5)], now_ms=5)
    assert table.told == [("append_failed", (TP, True)), ("append_failed", (TP, False))]
    # Nothing changed on disk, so nothing is reported.
    assert changed == [] and local.log_end_offset == 0
    logs.close()
