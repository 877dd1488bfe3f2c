"""The invariant every fault scenario ends with: each replicated partition is a byte-identical
prefix of the source's log, with no gap and no duplicate.

Rules:
- The oracle is the source broker's own segment files, framed by their 12-byte entry
  prefixes only (`tools.peers.segments.iter_batches`): it trusts the broker's bytes and
  uses nothing of replicad's. A partial entry at the end of the source is a write in
  progress and is left out.
- A replica passes when its bytes, from its first batch on, equal the source's bytes
  from the source batch with the same base offset, and that batch is the source's first
  (the replica starts where the source starts: nothing skipped at the front).
- Checksums of the replica's batches are verified independently (CRC32C for magic 2,
  CRC32 for magic 0/1): a corrupt batch on disk fails the check even if the source is
  equally broken.
- Records are counted from batch headers: `records_checked` are the records of the
  replica that matched the source; `lost` are the source's records the replica should
  hold and does not (all of the source's when `caught_up` is required, else only those
  below the replica's end); `duplicated` are replica records whose offsets repeat an
  earlier offset in the same partition.
- A replica with a torn last entry (a crash mid-write, before recovery) fails unless
  `allow_torn_tail`: after a restart, recovery must have removed it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from replicad.records.batch import (
    LEGACY_CRC_POSITION,
    LEGACY_CRC_START,
    LENGTH_POSITION,
    LOG_OVERHEAD,
    V2_CRC_POSITION,
    V2_CRC_START,
    V2_RECORD_COUNT_POSITION,
)
from replicad.types import TopicPartition
from tools.peers.segments import BrokerBatch, iter_batches

_V2_CRC = struct.Struct(">I")
_V2_RECORD_COUNT = struct.Struct(">i")
# A magic 0 message without key and value (Kafka's LegacyRecord.RECORD_OVERHEAD_V0).
MIN_ENTRY_LENGTH = 14
_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class PartitionCheck:
    tp: TopicPartition
    source_start: int  # first offset the source holds
    source_end: int  # offset after the source's last whole batch
    replica_start: int | None  # None: the replica holds no batch
    replica_end: int
    records_checked: int
    lost: int
    duplicated: int
    problem: str | None  # why this partition fails, None when it passes

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True, slots=True)
class InvariantReport:
    partitions: tuple[PartitionCheck, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions)

    @property
    def records_checked(self) -> int:
        return sum(p.records_checked for p in self.partitions)

    @property
    def lost(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def duplicated(self) -> int:
        return sum(p.duplicated for p in self.partitions)

    @property
    def problems(self) -> list[str]:
        return [f"{p.tp}: {p.problem}" for p in self.partitions if p.problem is not None]

    def summary(self) -> str:
        state = "OK" if self.ok else "FAILED"
        text = (
            f"invariant {state}: {len(self.partitions)} partitions, "
            f"{self.records_checked} records checked, {self.lost} lost, "
            f"{self.duplicated} duplicated"
        )
        return "\n".join([text, *self.problems])


def record_count(batch: BrokerBatch) -> int:
    """Records in an entry: a v2 batch says; a legacy entry counts as one."""
    if batch.magic >= 2 and len(batch.raw) >= V2_RECORD_COUNT_POSITION + 4:
        return max(0, int(_V2_RECORD_COUNT.unpack_from(batch.raw, V2_RECORD_COUNT_POSITION)[0]))
    return 1


def checksum_ok(batch: BrokerBatch) -> bool:
    raw = batch.raw
    if batch.magic >= 2:
        if len(raw) < V2_CRC_START:
            return False
        return crc32c(raw[V2_CRC_START:]) == _V2_CRC.unpack_from(raw, V2_CRC_POSITION)[0]
    if len(raw) < LEGACY_CRC_START:
        return False
    stored = _V2_CRC.unpack_from(raw, LEGACY_CRC_POSITION)[0]
    return zlib.crc32(raw[LEGACY_CRC_START:]) == stored


def _segments_bytes(partition_dir: Path) -> bytes:
    files = sorted(partition_dir.glob("*.log"), key=lambda p: int(p.stem))
    return b"".join(f.read_bytes() for f in files)


def _batches(data: bytes) -> tuple[list[BrokerBatch], bool]:
    """Whole entries of `data`, and whether anything (a torn or impossible entry) followed.

    Framing stops at an entry whose length field is below the smallest legacy message:
    damaged bytes must end the walk, not loop on it.
    """
    view = memoryview(data)
    pos = 0
    while len(view) - pos >= LOG_OVERHEAD:
        (length,) = _LENGTH.unpack_from(view, pos + LENGTH_POSITION)
        if length < MIN_ENTRY_LENGTH or pos + LOG_OVERHEAD + length > len(view):
            break
        pos += LOG_OVERHEAD + length
    batches = list(iter_batches(data[:pos]))
    return batches, pos != len(data)


def check_partition(
    tp: TopicPartition,
    source_dir: Path,
    replica_dir: Path | None,
    *,
    caught_up: bool,
    allow_torn_tail: bool = False,
) -> PartitionCheck:
    source, _ = _batches(_segments_bytes(source_dir))
    source_start = source[0].base_offset if source else 0
    source_end = source[-1].last_offset + 1 if source else 0
    source_records = [record_count(b) for b in source]
    replica: list[BrokerBatch] = []
    torn = False
    if replica_dir is not None and replica_dir.is_dir():
        replica, torn = _batches(_segments_bytes(replica_dir))
    problems: list[str] = []
    if torn and not allow_torn_tail:
        problems.append("torn entry at the end of the replica")
    duplicated = 0
    seen_end: int | None = None
    for batch in replica:
        if seen_end is not None and batch.base_offset < seen_end:
            overlap = min(seen_end, batch.last_offset + 1) - batch.base_offset
            duplicated += min(overlap, record_count(batch))
        seen_end = max(seen_end or 0, batch.last_offset + 1)
        if not checksum_ok(batch):
            problems.append(f"checksum mismatch in the replica at offset {batch.base_offset}")
    if duplicated:
        problems.append(f"{duplicated} records duplicated")
    replica_start = replica[0].base_offset if replica else None
    replica_end = replica[-1].last_offset + 1 if replica else 0
    matched = 0  # source batches the replica holds byte for byte, from the source's first
    if replica:
        if not source or replica[0].base_offset != source[0].base_offset:
            problems.append(
                f"replica starts at {replica[0].base_offset}, the source at {source_start}"
            )
        else:
            for ours, theirs in zip(replica, source, strict=False):
                if ours.raw != theirs.raw:
                    problems.append(f"replica differs from the source at offset {ours.base_offset}")
                    break
                matched += 1
            if matched == min(len(replica), len(source)) and len(replica) > len(source):
                problems.append(
                    f"replica holds {len(replica) - len(source)} batches the source lacks "
                    f"(from offset {replica[len(source)].base_offset})"
                )
    records_checked = sum(source_records[:matched])
    if caught_up:
        lost = sum(source_records[matched:])
    else:
        # Below the replica's end nothing may be missing; above it the replica may lag.
        lost = sum(
            count
            for batch, count in zip(source[matched:], source_records[matched:], strict=True)
            if batch.base_offset < replica_end
        )
    if lost:
        problems.append(f"{lost} records of the source missing from the replica")
    return PartitionCheck(
        tp=tp,
        source_start=source_start,
        source_end=source_end,
        replica_start=replica_start,
        replica_end=replica_end,
        records_checked=records_checked,
        lost=lost,
        duplicated=duplicated,
        problem="; ".join(problems) if problems else None,
    )


def check_replica(
    source_log_dir: Path,
    data_dir: Path,
    partitions: Iterable[TopicPartition],
    *,
    caught_up: bool,
    allow_torn_tail: bool = False,
) -> InvariantReport:
    """Check every partition in `partitions` (the ones the source holds and replicad was
    asked to replicate). A partition the replica lacks holds no records: it passes only
    if the source has none, or `caught_up` is not required."""
    checks = [
        check_partition(
            tp,
            source_log_dir / f"{tp.topic}-{tp.partition}",
            data_dir / f"{tp.topic}-{tp.partition}",
            caught_up=caught_up,
            allow_torn_tail=allow_torn_tail,
        )
        for tp in sorted(partitions)
    ]
    return InvariantReport(tuple(checks))


def source_partitions(source_log_dir: Path, topics: Iterable[str]) -> list[TopicPartition]:
    """The partitions of `topics` the source broker has directories for."""
    wanted = set(topics)
    found = []
    for entry in source_log_dir.iterdir():
        topic, sep, part = entry.name.rpartition("-")
        if sep and part.isdigit() and topic in wanted and entry.is_dir():
            found.append(TopicPartition(topic, int(part)))
    return sorted(found)


def end_offsets(log_dir: Path, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The offset after the last whole entry of each partition (0 when it has none),
    reading only the last non-empty segment of each."""
    ends: dict[TopicPartition, int] = {}
    for tp in partitions:
        ends[tp] = _end_offset(log_dir / f"{tp.topic}-{tp.partition}")
    return ends


def _end_offset(partition_dir: Path) -> int:
    if not partition_dir.is_dir():
        return 0
    files = sorted(partition_dir.glob("*.log"), key=lambda p: int(p.stem))
    for segment in reversed(files):
        try:
            batches, _ = _batches(segment.read_bytes())
        except FileNotFoundError:  # deleted or renamed between listing and reading
            continue
        if batches:
            return batches[-1].last_offset + 1
    return int(files[0].stem) if files else 0


def covers(replica: Mapping[TopicPartition, int], target: Mapping[TopicPartition, int]) -> bool:
    """Whether the replica's ends reach the target's for every target partition."""
    return all(replica.get(tp, 0) >= end for tp, end in target.items())
