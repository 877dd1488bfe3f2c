"""The replica-vs-source invariant, on segment directories built from real producer batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.types import TopicPartition
from tools.chaos.invariant import check_replica, covers, end_offsets, source_partitions
from tools.logdata.batches import batch_stream

TP = TopicPartition("orders", 0)


def _write(log_dir: Path, batches: list[bytes], *, per_segment: int = 4, tp=TP) -> Path:
    """Batches into Kafka-named segment files of `per_segment` batches each."""
    from tools.peers.segments import iter_batches

    part = log_dir / f"{tp.topic}-{tp.partition}"
    part.mkdir(parents=True)
    for i in range(0, len(batches), per_segment):
        chunk = b"".join(batches[i : i + per_segment])
        base = next(iter_batches(chunk)).base_offset if chunk else 0
        (part / f"{base:020d}.log").write_bytes(chunk)
    if not batches:
        (part / f"{0:020d}.log").write_bytes(b"")
    return part


def _counts(batches: list[bytes]) -> int:
    return sum(int.from_bytes(b[57:61], "big") for b in batches)


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, list[bytes]]:
    batches = batch_stream(11, 12)
    return _write(tmp_path / "source", batches, per_segment=5).parent, batches


def check(source_dir: Path, replica: list[bytes], tmp_path: Path, **kwargs):
    data = tmp_path / "replica"
    _write(data, replica, per_segment=3)
    return check_replica(source_dir, data, [TP], **kwargs)


def test_a_byte_identical_copy_passes_and_counts_every_record(source, tmp_path) -> None:
    source_dir, batches = source
    report = check(source_dir, batches, tmp_path, caught_up=True)
    assert report.ok, report.summary()
    assert report.records_checked == _counts(batches)
    assert (report.lost, report.duplicated) == (0, 0)


def test_a_prefix_passes_unless_caught_up_is_required(source, tmp_path) -> None:
    source_dir, batches = source
    lagging = check(source_dir, batches[:7], tmp_path, caught_up=False)
    assert lagging.ok and lagging.records_checked == _counts(batches[:7])
    (tmp_path / "replica").rename(tmp_path / "old")
    required = check(source_dir, batches[:7], tmp_path, caught_up=True)
    assert not required.ok
    assert required.lost == _counts(batches[7:])


def test_a_missing_batch_in_the_middle_is_lost(source, tmp_path) -> None:
    source_dir, batches = source
    report = check(source_dir, batches[:4] + batches[5:], tmp_path, caught_up=False)
    assert not report.ok
    assert report.lost >= _counts(batches[4:5])
    assert "differs from the source" in report.summary()


def test_a_repeated_batch_is_a_duplicate(source, tmp_path) -> None:
    source_dir, batches = source
    report = check(source_dir, batches[:6] + batches[5:], tmp_path, caught_up=True)
    assert not report.ok
    assert report.duplicated == _counts(batches[5:6])


def test_a_flipped_byte_fails_checksum_and_identity(source, tmp_path) -> None:
    source_dir, batches = source
    damaged = bytearray(batches[3])
    damaged[40] ^= 0x10
    replica = [*batches[:3], bytes(damaged), *batches[4:]]
    report = check(source_dir, replica, tmp_path, caught_up=True)
    assert not report.ok
    text = report.summary()
    assert "checksum mismatch" in text and "differs from the source" in text


def test_a_late_start_is_a_gap(source, tmp_path) -> None:
    source_dir, batches = source
    report = check(source_dir, batches[2:], tmp_path, caught_up=False)
    assert not report.ok and "replica starts at" in report.summary()


def test_batches_beyond_the_source_fail(source, tmp_path) -> None:
    source_dir, batches = source
    extra = batch_stream(12, 1, first_offset=10_000)
    report = check(source_dir, batches + extra, tmp_path, caught_up=True)
    assert not report.ok and "the source lacks" in report.summary()


def test_a_torn_tail_fails_unless_allowed(source, tmp_path) -> None:
    source_dir, batches = source
    torn = [*batches[:5], batches[5][:30]]
    assert not check(source_dir, torn, tmp_path, caught_up=False).ok
    (tmp_path / "replica").rename(tmp_path / "old")
    allowed = check(source_dir, torn, tmp_path, caught_up=False, allow_torn_tail=True)
    assert allowed.ok, allowed.summary()


def test_garbage_lengths_end_the_walk(source, tmp_path) -> None:
    source_dir, batches = source
    garbage = b"\x00" * 8 + (-12).to_bytes(4, "big", signed=True) + b"\x02" * 50
    report = check(source_dir, [*batches[:2], garbage], tmp_path, caught_up=False)
    assert not report.ok and "torn entry" in report.summary()


def test_an_absent_replica_partition_has_lost_everything(source, tmp_path) -> None:
    source_dir, batches = source
    (tmp_path / "replica").mkdir()
    report = check_replica(source_dir, tmp_path / "replica", [TP], caught_up=True)
    assert report.lost == _counts(batches) and not report.ok


def test_end_offsets_and_partitions(source, tmp_path) -> None:
    source_dir, batches = source
    other = TopicPartition("audit", 2)
    _write(source_dir, batch_stream(3, 2, first_offset=40), tp=other)
    _write(source_dir, [], tp=TopicPartition("ignored", 0))
    assert source_partitions(source_dir, ["orders", "audit"]) == sorted([TP, other])
    ends = end_offsets(source_dir, [TP, other, TopicPartition("missing", 0)])
    assert ends[TP] == 1 + int.from_bytes(batches[-1][:8], "big") + int.from_bytes(
        batches[-1][23:27], "big"
    )
    assert ends[TopicPartition("missing", 0)] == 0
    assert covers(ends, {TP: ends[TP]}) and not covers(ends, {TP: ends[TP] + 1})
