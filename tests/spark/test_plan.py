"""Split planning: pruning by names and indexes, batch-aligned cuts, sane index prefixes."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from replicad.log.index import OffsetIndex
from replicad.log.layout import classify_partition_files, segment_file_name
from replicad.records.batch import Compression, scan_batches
from replicad.spark.plan import (
    LogEnd,
    PartitionFiles,
    SegmentFile,
    Split,
    _unzeroed_length,
    cut_points,
    pack,
    plan_partition,
    segments_in_range,
    usable_offset_index,
    usable_time_index,
)
from replicad.types import TopicPartition

TP = TopicPartition("t", 0)


def listing(directory) -> PartitionFiles:
    bases = classify_partition_files(sorted(p.name for p in directory.iterdir())).segments
    segments = tuple(
        SegmentFile(b, (directory / segment_file_name(b, ".log")).stat().st_size) for b in bases
    )
    return PartitionFiles(TP.topic, TP.partition, str(directory), segments)


def index_loader(files: PartitionFiles, loaded: list[int]):
    def load(segment: SegmentFile) -> OffsetIndex:
        loaded.append(segment.base_offset)
        path = f"{files.directory}/{segment_file_name(segment.base_offset, '.index')}"
        with open(path, "rb") as f:
            return usable_offset_index(segment.base_offset, f.read(), segment.size)

    return load


def offsets_in(split: Split) -> list[int]:
    """Every offset of the whole batches in the split's bytes."""
    with open(split.path, "rb") as f:
        f.seek(split.start_position)
        data = f.read(split.size)
    scan = scan_batches(data)
    assert scan.valid_bytes == len(data), "a split must hold whole batches only"
    return [o for b in scan.batches for o in range(b.base_offset, b.next_offset)]


@pytest.fixture
def partition(tmp_path, make_batches, write_partition):
    """About 2,000 records in 200 batches of 10, over several 32 KiB segments."""
    batches = [
        make_batches.data(i * 10, 10, codec=Compression(i % 5), value_size=150) for i in range(200)
    ]
    return write_partition(tmp_path, TP, batches, segment_bytes=32 * 1024)


def test_offset_index_prefix_drops_preallocated_zeros_and_insane_entries():
    entries = struct.pack(">ii", 5, 100) + struct.pack(">ii", 9, 300)
    index = usable_offset_index(1000, entries + b"\0" * 800, segment_size=400)
    assert index.entries == 2
    assert index.lookup(1007).position == 100
    # entries past the segment's size, or not increasing, end the usable part
    assert usable_offset_index(1000, entries, segment_size=300).entries == 1
    back = entries + struct.pack(">ii", 8, 500)
    assert usable_offset_index(1000, back, segment_size=1000).entries == 2
    assert usable_offset_index(1000, b"", segment_size=10).entries == 0


def test_time_index_prefix_drops_zeros_and_steps_back():
    entries = struct.pack(">qi", 1_700_000_000_000, 3) + struct.pack(">qi", 1_700_000_000_500, 8)
    index = usable_time_index(0, entries + b"\0" * 120)
    assert index.entries == 2
    assert index.last_entry().timestamp == 1_700_000_000_500
    stale = entries + struct.pack(">qi", 1_600_000_000_000, 9)
    assert usable_time_index(0, stale).entries == 2


def _reference_offset_prefix(data: bytes, segment_size: int) -> int:
    """The rule entry by entry, as it was written before numpy checked it all at once."""
    kept, last_rel, last_pos = 0, -1, -1
    data = data[: len(data.rstrip(b"\0")) + (-len(data.rstrip(b"\0")) % 8)]
    for rel, pos in struct.iter_unpack(">ii", data[: len(data) - len(data) % 8]):
        if rel <= last_rel or pos <= last_pos or rel < 0 or pos >= segment_size:
            break
        last_rel, last_pos, kept = rel, pos, kept + 1
    return kept


def _reference_time_prefix(data: bytes) -> int:
    kept, last_ts, last_rel = 0, -1, -1
    data = data[: len(data.rstrip(b"\0")) + (-len(data.rstrip(b"\0")) % 12)]
    for ts, rel in struct.iter_unpack(">qi", data[: len(data) - len(data) % 12]):
        if ts <= last_ts or rel < last_rel or rel < 0:
            break
        last_ts, last_rel, kept = ts, rel, kept + 1
    return kept


@pytest.mark.parametrize("seed", range(40))
def test_index_prefixes_checked_at_once_keep_what_the_entry_by_entry_rule_keeps(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 60)
    rels = sorted(rng.sample(range(1, 10_000), n))
    positions = sorted(rng.sample(range(0, 50_000), n))
    stamps = sorted(rng.sample(range(1_700_000_000_000, 1_700_000_100_000), n))
    for _ in range(rng.randrange(0, 3)):  # a step back, a negative, a stray zero entry
        if n:
            i = rng.randrange(n)
            rels[i], positions[i], stamps[i] = rng.choice(
                [(rels[i] - 20, positions[i], -1), (-5, -1, stamps[i] - 10), (0, 0, 0)]
            )
    offsets = b"".join(struct.pack(">ii", r, p) for r, p in zip(rels, positions, strict=True))
    times = b"".join(struct.pack(">qi", t, r) for t, r in zip(stamps, rels, strict=True))
    tail = b"\0" * rng.choice([0, 3, 8, 800])  # preallocated, or a torn last entry
    size = rng.choice([50_000, positions[n // 2] if n else 10])
    assert usable_offset_index(0, offsets + tail, size).entries == _reference_offset_prefix(
        offsets + tail, size
    )
    assert usable_time_index(0, times + tail).entries == _reference_time_prefix(times + tail)


@pytest.mark.parametrize("seed", range(30))
def test_the_zero_tail_is_found_as_rstrip_finds_it(seed):
    rng = random.Random(seed)
    body = bytes(rng.choice([0, 0, 1, 255]) for _ in range(rng.randrange(0, 40)))
    data = body + b"\0" * rng.randrange(0, 30) + bytes(rng.choice([[], [0], [7]]))
    assert _unzeroed_length(data) == len(data.rstrip(b"\0"))


def test_segments_are_pruned_by_their_names():
    files = PartitionFiles(
        "t",
        0,
        "/d",
        (SegmentFile(0, 10), SegmentFile(100, 10), SegmentFile(200, 0), SegmentFile(300, 10)),
    )
    assert segments_in_range(files, 0, None) == [0, 1, 3]  # the empty segment never
    assert segments_in_range(files, 100, 200) == [1]
    assert segments_in_range(files, 99, 101) == [0, 1]
    assert segments_in_range(files, 250, None) == [3]  # 200-299 is the empty one's
    assert segments_in_range(files, 0, 100) == [0]
    assert segments_in_range(files, 5000, None) == [3]  # the last may still hold it


def test_whole_segments_need_no_index(partition):
    files = listing(partition)
    loaded: list[int] = []
    splits = plan_partition(files, 0, None, 10**9, index_loader(files, loaded))
    assert loaded == []
    assert [s.segment for s in splits] == [s.base_offset for s in files.segments]
    assert all(s.start_position == 0 for s in splits)
    assert [s.end_position for s in splits] == [s.size for s in files.segments]
    assert {s.log_end for s in splits} == {
        LogEnd(files.segments[-1].base_offset, files.segments[-1].size)
    }
    assert [s.last_segment for s in splits] == [False] * (len(splits) - 1) + [True]
    read = [o for s in splits for o in offsets_in(s)]
    assert read == list(range(2000))


def test_offset_ranges_read_only_the_segments_and_bytes_they_need(partition):
    files = listing(partition)
    assert len(files.segments) >= 4
    rng = random.Random(5)
    for _ in range(200):
        start = rng.randrange(0, 2000)
        end = rng.choice([None, rng.randrange(start + 1, 2001)])
        loaded: list[int] = []
        splits = plan_partition(files, start, end, 10**9, index_loader(files, loaded))
        read = [o for s in splits for o in offsets_in(s)]
        stop = 2000 if end is None else end
        assert set(range(start, stop)) <= set(read), (start, end)
        # Only the batches around the bounds are extra: at most the index interval's worth.
        extra = [o for o in read if o < start or o >= stop]
        assert len(extra) <= 2 * 10 * 8, (start, end, len(extra))
        wanted = [
            i
            for i, seg in enumerate(files.segments)
            if seg.base_offset < stop
            and (i + 1 == len(files.segments) or files.segments[i + 1].base_offset > start)
        ]
        assert [s.segment for s in splits] == [files.segments[i].base_offset for i in wanted]
        # An index is loaded only where a bound falls.
        assert set(loaded) <= {splits[0].segment, splits[-1].segment}


def test_an_empty_range_plans_nothing(partition):
    files = listing(partition)
    assert plan_partition(files, 500, 500, 10**9, index_loader(files, [])) == []
    assert plan_partition(files, 700, 600, 10**9, index_loader(files, [])) == []
    empty = PartitionFiles("t", 0, str(partition), ())
    assert plan_partition(empty, 0, None, 10**9, index_loader(empty, [])) == []


def test_a_large_segment_is_cut_at_batch_starts(tmp_path, make_batches, write_partition):
    batches = [make_batches.data(i * 10, 10, value_size=200) for i in range(300)]
    directory = write_partition(tmp_path, TP, batches, segment_bytes=10 * 1024 * 1024)
    files = listing(directory)
    assert len(files.segments) == 1
    size = files.segments[0].size
    loaded: list[int] = []
    splits = plan_partition(files, 0, None, 64 * 1024, index_loader(files, loaded))
    assert loaded == [0]
    assert len(splits) >= size // (64 * 1024) - 1
    assert splits[0].start_position == 0 and splits[-1].end_position == size
    for before, after in itertools.pairwise(splits):
        assert before.end_position == after.start_position
        assert before.size >= 64 * 1024
    read = [o for s in splits for o in offsets_in(s)]  # each split is whole batches
    assert read == list(range(3000))


def test_cut_points_stay_inside_the_range():
    index = OffsetIndex(
        0, 800, b"".join(struct.pack(">ii", i * 10, i * 1000) for i in range(1, 50))
    )
    assert cut_points(index, 0, 100_000, 10**6) == []
    assert cut_points(None, 0, 100_000, 10) == []
    cuts = cut_points(index, 2000, 20_000, 5000)
    assert cuts == [7000, 12000, 17000]


def test_small_splits_are_packed_in_order_and_a_large_one_stays_alone():
    log_end = LogEnd(0, 0)

    def split(partition: int, size: int) -> Split:
        return Split("t", partition, "/d", 0, 0, size, 0, None, log_end)

    splits = [split(0, 30), split(1, 30), split(2, 50), split(3, 200), split(4, 10)]
    groups = pack(splits, 100)
    assert [[s.partition for s in g] for g in groups] == [[0, 1], [2], [3], [4]]
    assert [s for g in groups for s in g] == splits  # nothing lost, nothing reordered
    assert all(sum(s.size for s in g) <= 100 or len(g) == 1 for g in groups)
    assert pack([], 100) == []
    assert len(pack(splits, 1 << 30)) == 1
