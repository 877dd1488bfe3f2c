"""Planning on the driver: listing, log start, timestamps to offsets, and what gets opened."""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from pathlib import Path

import pytest

from replicad.errors import LogError
from replicad.log.checkpoint import format_offsets
from replicad.log.layout import LOG_START_OFFSET_CHECKPOINT
from replicad.records.batch import scan_batches
from replicad.records.records import decode_batch
from replicad.spark.catalog import INDEX_PIECE_BYTES, Planner, list_partitions, log_start_offsets
from replicad.spark.files import FileOpener, Purpose, read_trace
from replicad.spark.options import parse_options
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream

TP = TopicPartition("events", 0)


def records_of(directory: Path) -> list[tuple[int, int, str]]:
    """(offset, timestamp, segment file) of every record, in offset order."""
    found = []
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        for header in scan_batches(data).batches:
            for record in decode_batch(data, header).records:
                found.append((record.offset, record.timestamp, str(path)))
    return found


@pytest.fixture
def events(tmp_path, write_partition):
    """~4,000 records whose timestamps mostly grow and sometimes step back, 16 KiB segments."""
    data_dir = tmp_path / "data"
    write_partition(data_dir, TP, batch_stream(3, 400), segment_bytes=16 * 1024)
    return data_dir


def test_listing_selects_partitions_and_ignores_the_rest(tmp_path, make_batches, write_partition):
    data_dir = tmp_path / "data"
    for tp in [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b.x", 0)]:
        write_partition(data_dir, tp, [make_batches.data(0, 3)])
    (data_dir / "a-2-delete").mkdir()  # Kafka's "being deleted" directory
    (data_dir / "c-0").write_text("a file, not a partition")
    (data_dir / "replication-offset-checkpoint").write_text("0\n0\n")

    def names(**options):
        found = list_partitions(parse_options({"path": str(data_dir), **options}))
        return [(f.topic, f.partition) for f in found]

    assert names() == [("a", 0), ("a", 1), ("b.x", 0)]
    assert names(topics="a") == [("a", 0), ("a", 1)]
    assert names(topicPattern=r"b\..*") == [("b.x", 0)]
    assert names(partitions="1") == [("a", 1)]
    files = list_partitions(parse_options({"path": str(data_dir), "topics": "b.x"}))[0]
    assert [s.base_offset for s in files.segments] == [0]
    assert files.segments[0].size == len(make_batches.data(0, 3))
    with pytest.raises(LogError, match="no such directory"):
        list_partitions(parse_options({"path": str(tmp_path / "nope")}))


def test_earliest_is_the_checkpointed_log_start(tmp_path, make_batches, write_partition):
    data_dir = tmp_path / "data"
    write_partition(data_dir, TP, [make_batches.data(i * 10, 10) for i in range(5)])
    assert Planner(parse_options({"path": str(data_dir)})).plan()[0].start_offset == 0
    (data_dir / LOG_START_OFFSET_CHECKPOINT).write_text(format_offsets({TP: 25}))
    assert log_start_offsets(str(data_dir)) == {TP: 25}
    plan = Planner(parse_options({"path": str(data_dir)})).plan()
    assert plan[0].start_offset == 25
    below = Planner(parse_options({"path": str(data_dir), "startingOffsets": "3"})).plan()
    assert below[0].start_offset == 25  # nothing below the log start is in the log
    (data_dir / LOG_START_OFFSET_CHECKPOINT).write_text("garbage")
    assert log_start_offsets(str(data_dir)) == {}


def test_timestamps_become_the_first_offset_at_or_after_them(events, tmp_path):
    records = records_of(events / f"{TP.topic}-{TP.partition}")
    files = list_partitions(parse_options({"path": str(events)}))[0]
    assert len(files.segments) >= 5
    stamps = sorted({ts for _, ts, _ in records})
    rng = random.Random(1)
    probes = [stamps[0] - 1, stamps[-1], stamps[-1] + 1, *rng.sample(stamps, 60)]
    probes += [ts + 1 for ts in rng.sample(stamps, 20)]
    for i, timestamp in enumerate(probes):
        trace = tmp_path / f"trace-{i}"
        planner = Planner(parse_options({"path": str(events)}), FileOpener(str(trace)))
        expected = next((o for o, ts, _ in records if ts >= timestamp), None)
        assert planner.offset_for_timestamp(files, timestamp) == expected, timestamp
        logs_opened = [t.path for t in read_trace(str(trace)) if t.purpose is not Purpose.INDEX]
        if expected is not None:
            # Only the segment holding the answer was opened ...
            holder = next(path for o, _, path in records if o == expected)
            assert logs_opened == [holder], timestamp
        else:
            # ... or, for a time after everything, only the active segment (its time index
            # may not have its largest timestamp yet).
            assert logs_opened == [files.log_path(files.segments[-1].base_offset)]
        assert {t.purpose for t in read_trace(str(trace))} <= {Purpose.INDEX, Purpose.PLAN}


def test_a_timestamp_lookup_starts_at_the_log_start(events, tmp_path):
    """Kafka searches from the log start: records below it do not answer, even where their
    segment is still on disk, and the segments wholly below it are not opened."""
    records = records_of(events / f"{TP.topic}-{TP.partition}")
    files = list_partitions(parse_options({"path": str(events)}))[0]
    log_start = files.segments[2].base_offset + 7
    early = records[5][1]  # a time whose first record is far below the log start
    for timestamp in (early, records[log_start][1], records[log_start + 40][1] + 1):
        trace = tmp_path / f"trace-{timestamp}"
        planner = Planner(parse_options({"path": str(events)}), FileOpener(str(trace)))
        expected = next(o for o, ts, _ in records if ts >= timestamp and o >= log_start)
        assert planner.offset_for_timestamp(files, timestamp, log_start) == expected
        opened = {t.path for t in read_trace(str(trace))}
        assert not opened & {files.log_path(s.base_offset) for s in files.segments[:2]}
    assert planner.offset_for_timestamp(files, early) == next(
        o for o, ts, _ in records if ts >= early
    )


def test_a_time_range_plans_the_offsets_between(events):
    records = records_of(events / f"{TP.topic}-{TP.partition}")
    stamps = [ts for _, ts, _ in records]
    start_ts, end_ts = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    options = {"path": str(events), "startingTimestamp": str(start_ts)}
    splits = Planner(parse_options({**options, "endingTimestamp": str(end_ts)})).plan()
    first = next(o for o, ts, _ in records if ts >= start_ts)
    stop = next(o for o, ts, _ in records if ts >= end_ts)
    assert {(s.start_offset, s.end_offset) for s in splits} == {(first, stop)}
    after_all = Planner(parse_options({**options, "startingTimestamp": str(max(stamps) + 1)}))
    assert after_all.plan() == []
    open_end = Planner(parse_options({**options, "endingTimestamp": str(max(stamps) + 1)}))
    assert {s.end_offset for s in open_end.plan()} == {None}


def test_offset_bounds_open_only_the_index_of_bound_segments(events, tmp_path):
    trace = tmp_path / "trace"
    files = list_partitions(parse_options({"path": str(events)}))[0]
    bases = [s.base_offset for s in files.segments]
    start, end = bases[1] + 3, bases[3] + 2
    options = {"path": str(events), "startingOffsets": str(start), "endingOffsets": str(end)}
    splits = Planner(parse_options({**options, "traceFileOpens": str(trace)})).plan()
    assert [s.segment for s in splits] == bases[1:4]
    opened = read_trace(str(trace))
    assert {t.purpose for t in opened} == {Purpose.INDEX}
    assert sorted(Path(t.path).name for t in opened) == sorted(
        f"{b:020d}.index" for b in (bases[1], bases[3])
    )


class CountingOpener(FileOpener):
    """Counts the bytes read through it."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "counted", [0])

    @contextmanager
    def open(self, path: str, purpose: Purpose):
        with super().open(path, purpose) as file:
            yield Counted(file, self.counted)  # type: ignore[attr-defined]


class Counted:
    def __init__(self, file, counted: list[int]) -> None:
        self.file, self.counted = file, counted

    def pread(self, size: int, position: int) -> bytes:
        data = self.file.pread(size, position)
        self.counted[0] += len(data)
        return data

    @property
    def size(self) -> int:
        return self.file.size


def test_an_active_segments_preallocated_index_is_read_only_as_far_as_its_entries(tmp_path, events):
    options = parse_options({"path": str(events)})
    files = list_partitions(options)[0]
    segment = files.segments[-1]
    whole = Planner(options).offset_index(files, segment)
    timed = Planner(options).time_index(files, segment)
    assert whole.entries > 1
    # As a running replicad leaves it: preallocated (sparse), zeros past the entries.
    for index in Path(files.directory).glob(f"{segment.base_offset:020d}.*index"):
        os.truncate(index, 10 * 1024 * 1024)
    opener = CountingOpener()
    planner = Planner(options, opener=opener)
    assert planner.offset_index(files, segment).entries == whole.entries
    assert planner.time_index(files, segment).entries == timed.entries
    assert 0 < opener.counted[0] <= 2 * INDEX_PIECE_BYTES  # not 2 x 10 MiB


def test_a_planner_told_to_remember_reads_each_index_once_until_it_forgets(events, tmp_path):
    files = list_partitions(parse_options({"path": str(events)}))[0]
    segment = files.segments[1]
    smallest = Planner(parse_options({"path": str(events)})).offset_index(files, segment)
    size = smallest.entries * 8

    def index_reads(remember_bytes: int, *, forget: bool = False) -> int:
        trace = tmp_path / f"trace-{remember_bytes}-{forget}"
        options = parse_options({"path": str(events), "traceFileOpens": str(trace)})
        planner = Planner(options, remember_bytes=remember_bytes)
        for _ in range(3):
            assert planner.offset_index(files, segment).raw() == smallest.raw()
            if forget:
                planner.forget()
        return len(read_trace(str(trace)))

    assert index_reads(0) == 3  # a batch read's planner keeps nothing
    assert index_reads(size) == 1
    assert index_reads(size, forget=True) == 3
    assert index_reads(size - 8) == 3  # over its budget: read each time
