"""The replica's side of `verify --against-source` (replicad/verify/replica.py): segments
read as batches, read only."""

from __future__ import annotations

from pathlib import Path

from replicad.log.layout import segment_file_name
from replicad.verify.replica import ReplicaPartition
from tools.logdata.batches import producer_batch


def write_partition(directory: Path, segments: list[list[bytes]]) -> None:
    directory.mkdir(parents=True)
    for batches in segments:
        base = int.from_bytes(batches[0][:8], "big")
        (directory / segment_file_name(base, ".log")).write_bytes(b"".join(batches))


def batches(first: int, count: int, per: int = 2) -> list[bytes]:
    return [producer_batch(first + i * per, [b"a", b"b"][:per]) for i in range(count)]


def test_offsets_and_slices_span_segments(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    write_partition(d, [batches(10, 3), batches(16, 3)])  # 10..15, 16..21
    replica = ReplicaPartition(d)
    try:
        offsets = replica.offsets()
        assert (offsets.start, offsets.end) == (10, 22)
        got = replica.slice(13, 17)
        assert [(b.base_offset, b.last_offset) for b in got.batches] == [
            (12, 13),
            (14, 15),
            (16, 17),
        ]
        assert got.unreadable_at is None
        assert got.batches[0].data == producer_batch(12, [b"a", b"b"])
        assert list(replica.batch_offsets()) == [10, 12, 14, 16, 18, 20]
    finally:
        replica.close()


def test_a_sample_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    write_partition(d, [batches(0, 40)])
    replica = ReplicaPartition(d)
    try:
        first = replica.sample(5, seed=3)
        assert first == replica.sample(5, seed=3) and len(first) == 5 and first == sorted(first)
        assert replica.sample(100, seed=3) == list(range(0, 80, 2))
        # Drawn over the whole log, not its first batches.
        assert max(max(replica.sample(5, seed=s)) for s in range(5)) > 40
    finally:
        replica.close()


def test_a_damaged_entry_stops_the_reading_and_says_where(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    good = batches(0, 2)
    broken = bytearray(producer_batch(4, [b"a", b"b"]))
    broken[16] = 9  # magic 9: not a format
    write_partition(d, [[*good, bytes(broken)], batches(6, 1)])
    replica = ReplicaPartition(d)
    try:
        # The range reads the first and last segments; the walk meets the damage.
        assert (replica.offsets().start, replica.offsets().end) == (0, 8)
        assert list(replica.batch_offsets()) == [0, 2]
        got = replica.slice(0, 100)
        assert [b.base_offset for b in got.batches] == [0, 2]
        assert got.unreadable_at == 4
        assert "00000000000000000000.log" in got.unreadable_detail
    finally:
        replica.close()


def test_a_batch_being_written_at_the_end_is_left_out(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    tail = producer_batch(4, [b"a", b"b"])
    write_partition(d, [[*batches(0, 2), tail[:20]]])
    replica = ReplicaPartition(d)
    try:
        assert (replica.offsets().start, replica.offsets().end) == (0, 4)
        assert replica.slice(0, 100).unreadable_at is None
    finally:
        replica.close()
