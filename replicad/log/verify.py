"""`replicad verify DATA_DIR`: integrity of every partition, one summary line each.

Checks, per partition (the directory is only read, never repaired):
- every segment's entries are whole and valid (length, magic, CRC), the last segment may
  end in a torn batch only while another process holds the data directory's lock;
- offsets increase across the whole partition; gaps (compacted or truncated-into ranges)
  are counted, not failed; an overlap or a step back is a problem;
- each `.index` entry points at the start of a batch whose last offset is the entry's
  offset, and each `.timeindex` entry names the last offset of a batch whose max timestamp
  is the entry's timestamp, both strictly increasing (what Kafka's DumpLogSegments checks);
- the leader-epoch-checkpoint and partition.metadata parse, and the checkpoints in the data
  directory parse.
Exit status 0 when nothing was found, 1 otherwise.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from replicad.errors import LogError
from replicad.log.checkpoint import parse_epochs, parse_offsets, parse_partition_metadata, read_text
from replicad.log.index import OFFSET_ENTRY, TIME_ENTRY
from replicad.log.layout import (
    INDEX_SUFFIX,
    LEADER_EPOCH_CHECKPOINT,
    LOCK_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TIME_INDEX_SUFFIX,
    classify_partition_files,
    parse_partition_dir,
    segment_file_name,
)
from replicad.records.batch import BatchHeader, ScanResult, ScanStop, scan_batches

EXIT_OK = 0
EXIT_PROBLEMS = 1


def scan_file(path: Path, *, verify_crc: bool = True) -> ScanResult:
    """scan_batches over a whole file, through mmap (no copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return scan_batches(b"", verify_crc=verify_crc)
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return scan_batches(view, verify_crc=verify_crc)
            finally:
                view.release()


@dataclass(frozen=True, slots=True)
class _IndexEntry:
    """One index entry as both index kinds are checked: it must rank above the entry
    before it, name a batch of the segment, and agree with that batch."""

    rank: int
    rank_text: str  # "offset 120", "timestamp 1700000000000"
    batch: BatchHeader | None
    missing: str  # what is wrong when no batch answers to it
    disagreement: str | None  # what is wrong with the batch that does, if anything


def _check_index(
    data: bytes, entry: struct.Struct, read: Callable[[int, int], _IndexEntry]
) -> list[str]:
    problems = []
    if len(data) % entry.size:
        problems.append(f"size {len(data)} is not a multiple of {entry.size}")
    last = -1
    for slot in range(len(data) // entry.size):
        item = read(*entry.unpack_from(data, slot * entry.size))
        if item.rank <= last:
            problems.append(f"entry {slot}: {item.rank_text} does not increase")
        elif item.batch is None:
            problems.append(f"entry {slot}: {item.missing}")
        elif item.disagreement is not None:
            problems.append(f"entry {slot}: {item.disagreement}")
        last = item.rank
    return problems


def check_offset_index(data: bytes, base_offset: int, batches: Sequence[BatchHeader]) -> list[str]:
    """Problems of a `.index` file's bytes against the segment's batches: each entry
    points at the start of a batch whose last offset is the entry's offset."""
    by_position = {b.position: b for b in batches}

    def read(rel: int, position: int) -> _IndexEntry:
        offset = base_offset + rel
        batch = by_position.get(position)
        wrong = batch is not None and batch.last_offset != offset
        return _IndexEntry(
            rel,
            f"offset {offset}",
            batch,
            f"position {position} is not a batch start",
            f"index offset {offset}, batch at {position} ends at {batch.last_offset}"
            if wrong and batch is not None
            else None,
        )

    return _check_index(data, OFFSET_ENTRY, read)


def check_time_index(data: bytes, base_offset: int, batches: Sequence[BatchHeader]) -> list[str]:
    """Problems of a `.timeindex` file's bytes against the segment's batches: each entry
    names the last offset of a batch whose max timestamp is the entry's timestamp."""
    by_last_offset = {b.last_offset: b for b in batches}

    def read(timestamp: int, rel: int) -> _IndexEntry:
        offset = base_offset + rel
        batch = by_last_offset.get(offset)
        wrong = batch is not None and batch.max_timestamp != timestamp
        return _IndexEntry(
            timestamp,
            f"timestamp {timestamp}",
            batch,
            f"offset {offset} is not the last offset of a batch",
            f"timestamp {timestamp}, batch ending at {offset} has max timestamp "
            f"{batch.max_timestamp}"
            if wrong and batch is not None
            else None,
        )

    return _check_index(data, TIME_ENTRY, read)


@dataclass
class PartitionReport:
    name: str
    segments: int = 0
    batches: int = 0
    first_offset: int | None = None
    next_offset: int | None = None
    gaps: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        span = (
            f"offsets {self.first_offset}..{(self.next_offset or 0) - 1}"
            if self.first_offset is not None
            else "empty"
        )
        summary = f"{self.segments} segments, {self.batches} batches, {span}, {self.gaps} gaps"
        if self.problems:
            return f"{self.name}: FAILED ({summary}): " + "; ".join(self.problems)
        return f"{self.name}: ok ({summary})"

    def advance(self, first: int, next_offset: int) -> int | None:
        """Take offsets `first`..`next_offset` - 1 as the next ones read (a hole before them
        is a gap). Returns the last offset read before them when they overlap it, else None:
        the caller names the overlap, as it knows where it is."""
        previous = self.next_offset
        if self.first_offset is None:
            self.first_offset = first
        self.next_offset = next_offset
        if previous is not None and first > previous:
            self.gaps += 1
        return previous - 1 if previous is not None and first < previous else None


def verify_partition(directory: Path, *, in_use: bool) -> PartitionReport:
    report = PartitionReport(directory.name)
    listing = classify_partition_files(sorted(os.listdir(directory)))
    report.segments = len(listing.segments)
    for name in listing.strays:
        report.problems.append(f"stray file {name}")
    for i, base in enumerate(listing.segments):
        name = segment_file_name(base, ".log")
        scan = scan_file(directory / name)
        is_last = i == len(listing.segments) - 1
        if scan.stop is ScanStop.CORRUPT:
            report.problems.append(f"{name}: {scan.error}")
        elif scan.stop is ScanStop.PARTIAL and not (is_last and in_use):
            report.problems.append(f"{name}: torn batch at position {scan.valid_bytes}")
        for batch in scan.batches:
            overlapped = report.advance(batch.base_offset, batch.next_offset)
            if overlapped is not None:
                report.problems.append(
                    f"{name}: offset {batch.base_offset} at position {batch.position} "
                    f"overlaps the previous batch ending at {overlapped}"
                )
            if batch.base_offset < base:
                report.problems.append(f"{name}: offset {batch.base_offset} below its base")
            report.batches += 1
        for suffix, check in (
            (INDEX_SUFFIX, check_offset_index),
            (TIME_INDEX_SUFFIX, check_time_index),
        ):
            index_name = segment_file_name(base, suffix)
            try:
                data = (directory / index_name).read_bytes()
            except FileNotFoundError:
                report.problems.append(f"{index_name} is missing")
                continue
            if is_last and in_use:
                continue  # preallocated and being written: zeros past the entries
            report.problems += [f"{index_name}: {p}" for p in check(data, base, scan.batches)]
    for name, parse in (
        (LEADER_EPOCH_CHECKPOINT, parse_epochs),
        (PARTITION_METADATA, parse_partition_metadata),
    ):
        text = read_text(directory / name)
        if text is not None:
            try:
                parse(text, source=name)  # type: ignore[operator]
            except LogError as exc:
                report.problems.append(str(exc))
    return report


def _in_use(data_dir: Path) -> bool:
    path = data_dir / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def verify_data_dir(data_dir: Path, out: TextIO) -> int:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        print(f"{data_dir}: not a directory", file=out)
        return EXIT_PROBLEMS
    in_use = _in_use(data_dir)
    if in_use:
        print(
            f"{data_dir}: in use by a running replicad; active segments checked loosely", file=out
        )
    failed = False
    for name in (
        REPLICATION_OFFSET_CHECKPOINT,
        RECOVERY_POINT_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
    ):
        text = read_text(data_dir / name)
        if text is not None:
            try:
                parse_offsets(text, source=name)
            except LogError as exc:
                print(f"{name}: FAILED: {exc}", file=out)
                failed = True
    partitions = 0
    for entry in sorted(os.listdir(data_dir)):
        if parse_partition_dir(entry) is None or not (data_dir / entry).is_dir():
            continue
        report = verify_partition(data_dir / entry, in_use=in_use)
        partitions += 1
        print(report.line(), file=out)
        failed = failed or bool(report.problems)
    print(f"{partitions} partitions, {'problems found' if failed else 'all ok'}", file=out)
    return EXIT_PROBLEMS if failed else EXIT_OK
