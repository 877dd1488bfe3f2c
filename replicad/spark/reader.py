"""Reading one split on an executor: the records view and the batches view.

Records view, in file order. The magic 2 batches a chunk of the walk keeps are decoded
together into Arrow columns (decode.py); a legacy entry (magic 0/1) on its own with
`records.decode_batch`. Which batches are kept:
- a batch entirely below the split's start offset is skipped undecoded; reading stops at
  the first magic 2 batch starting at or past the end offset (a legacy wrapper's first
  offset is only known once decompressed, so those are decoded and their records
  filtered, and reading stops at the first record past the end);
- control batches are skipped undecoded unless `includeControl`;
- read_committed: before the split is read, its headers (and past its end, as far as
  needed, the headers of the rest of the partition as planned) are folded into
  TransactionOutcomes (txn.py); transactional data batches whose outcome is not COMMITTED
  are skipped undecoded;
- a corrupt entry (bad length, magic, CRC unless `verifyCrc` is false, records that do not
  decode) fails the read with the file and position. A torn tail is accepted only at the
  end of the partition's last segment, where a running replicad may be appending.
Records of a kept batch outside the split's offsets are dropped from its columns (one
mask); small Arrow batches go to Spark gathered (columns.ArrowBatches).

Batches view: one row per entry with its header fields, and a problem row for a corrupt
entry (the split's walk stops there) or a torn tail, instead of failing: verify reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from replicad.errors import CorruptRecordError
from replicad.log.layout import segment_file_name
from replicad.records.batch import MAGIC_V2, BatchHeader, ScanStop
from replicad.spark.columns import ROWS_PER_BATCH, ArrowBatches, Columns
from replicad.spark.decode import RecordColumns, columns_from_records, decode_v2_columns
from replicad.spark.files import FileOpener, Purpose, RandomAccess
from replicad.spark.options import Isolation, ReadOptions
from replicad.spark.plan import Split, join
from replicad.spark.schema import (
    BATCHES_ARROW,
    MICROS_PER_MILLI,
    RECORDS_ARROW,
    TIMESTAMP,
    micros,
)
from replicad.spark.walk import Chunk, Tail, Walk

# The record-by-record decoder (legacy entries, control markers, naming a corrupt record)
# and read_committed's outcomes are imported where they are needed: they bring kio (and,
# where hypothesis is installed, hypothesis: kio registers strategies with it), which a
# Python worker would otherwise import for every read: 0.17 CPU-s a worker start without
# hypothesis, 0.9 with it (load 11), where the magic 2 path needs neither.
if TYPE_CHECKING:
    from replicad.records.records import ControlType, DecodedBatch
    from replicad.spark.txn import TransactionOutcomes

PROBLEM_CORRUPT = "corrupt"
PROBLEM_TORN_TAIL = "torn_tail"


def read_records(
    split: Split, options: ReadOptions, opener: FileOpener
) -> Iterator[pa.RecordBatch]:
    """The records of `split` the options select, as Arrow batches of RECORDS_ARROW."""
    start, end = split.start_offset, split.end_offset
    gathered = ArrowBatches(RECORDS_ARROW)
    with opener.open(split.path, Purpose.READ) as fd:
        outcomes = None
        if options.isolation is Isolation.READ_COMMITTED:
            outcomes = _transaction_outcomes(fd, split, opener)
        walk = Walk(fd, split.start_position, split.end_position, verify_crc=options.verify_crc)
        done = False
        for chunk in walk:
            entries = _in_split(chunk, start, end)
            done = entries.past_end
            # Consecutive magic 2 batches are decoded together; a legacy entry on its own.
            group: list[BatchHeader] = []
            for header in entries.headers:
                if _hidden(header, options, outcomes):
                    continue
                if header.magic >= MAGIC_V2:
                    group.append(header)
                    continue
                if group:
                    yield from gathered.add(_v2_rows(split, chunk, group).batch)
                group = []
                legacy = _legacy_rows(split, chunk, header)
                yield from gathered.add(legacy.batch)
                if end is not None and legacy.past_end:
                    done = True
                    break
            if group:
                yield from gathered.add(_v2_rows(split, chunk, group).batch)
            if done:
                break
        if not done:
            _check_tail(split, walk.tail)
    if last := gathered.take():
        yield last


@dataclass(frozen=True, slots=True)
class SplitEntries:
    """The entries of a chunk within a split's offsets; `past_end`: the split ends in it."""

    headers: list[BatchHeader]
    past_end: bool


def _in_split(chunk: Chunk, start: int, end: int | None) -> SplitEntries:
    """Entries wholly below `start` are skipped. Only a magic 2 batch ends the split by its
    base offset: a legacy wrapper's offset is its *last* record's, so one that straddles
    `end` still holds records before it (`Rows.past_end` tells, once decoded)."""
    headers = []
    for header in chunk.batches:
        if header.next_offset <= start:
            continue
        if end is not None and header.magic >= MAGIC_V2 and header.base_offset >= end:
            return SplitEntries(headers, past_end=True)
        headers.append(header)
    return SplitEntries(headers, past_end=False)


@dataclass(frozen=True, slots=True)
class Rows:
    """Records of a split as an Arrow batch; `past_end`: some were at or past its end."""

    batch: pa.RecordBatch
    past_end: bool


def _v2_rows(split: Split, chunk: Chunk, group: list[BatchHeader]) -> Rows:
    try:
        columns = decode_v2_columns(chunk.data, group)
    except CorruptRecordError as exc:
        for header in group:  # the reference decoder names the batch's position
            _decode(split, chunk, header)
        raise CorruptRecordError(f"{split.path}: {exc}") from exc
    return _rows(split, group, columns)


def _legacy_rows(split: Split, chunk: Chunk, header: BatchHeader) -> Rows:
    records = _decode(split, chunk, header).records
    return _rows(split, [header], columns_from_records(records))


def _rows(split: Split, headers: list[BatchHeader], columns: RecordColumns) -> Rows:
    """The RECORDS_ARROW batch of decoded records, cut to the split's offsets."""
    n = columns.num_rows
    counts = columns.rows_per_batch

    def per_batch(values: list[int], dtype: type) -> np.ndarray:
        return np.repeat(np.array(values, dtype=dtype), counts)

    timestamps = columns.timestamps
    no_timestamp = timestamps < 0
    leader_epochs = per_batch([h.partition_leader_epoch for h in headers], np.int32)
    producer_ids = per_batch([h.producer_id for h in headers], np.int64)
    batch = pa.RecordBatch.from_arrays(
        [
            _repeated_string(split.topic, n),
            pa.array(np.full(n, split.partition, np.int32)),
            pa.array(columns.offsets),
            pa.array(
                np.where(no_timestamp, 0, timestamps * MICROS_PER_MILLI),
                type=TIMESTAMP,
                mask=no_timestamp,
            ),
            pa.array(per_batch([int(h.timestamp_type) for h in headers], np.int32)),
            columns.keys,
            columns.values,
            columns.headers,
            pa.array(leader_epochs, mask=leader_epochs < 0),
            pa.array(producer_ids, mask=producer_ids < 0),
            pa.array(per_batch([h.is_transactional for h in headers], np.bool_)),
            pa.array(per_batch([h.is_control for h in headers], np.bool_)),
        ],
        schema=RECORDS_ARROW,
    )
    offsets = columns.offsets
    below = offsets < split.start_offset
    past = np.zeros(n, np.bool_) if split.end_offset is None else offsets >= split.end_offset
    outside = below | past
    if outside.any():
        batch = batch.filter(pa.array(~outside))
    return Rows(batch, past_end=bool(past.any()))


def _repeated_string(value: str, n: int) -> pa.Array:
    encoded = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(encoded)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * n)]
    )


def _hidden(
    header: BatchHeader, options: ReadOptions, outcomes: TransactionOutcomes | None
) -> bool:
    """Whether a batch's records stay out of the view, decided without decoding them."""
    if header.is_control:
        return not options.include_control
    if outcomes is None or not header.is_transactional:
        return False
    from replicad.spark.txn import Outcome

    return outcomes.outcome(header.producer_id, header.base_offset) is not Outcome.COMMITTED


def _decode(split: Split, chunk: Chunk, header: BatchHeader) -> DecodedBatch:
    from replicad.records.records import decode_batch

    try:
        return decode_batch(chunk.data, header)
    except CorruptRecordError as exc:
        position = chunk.position + header.position
        raise CorruptRecordError(f"{split.path}: batch at position {position}: {exc}") from exc


def _check_tail(split: Split, tail: Tail | None) -> None:
    assert tail is not None
    if tail.stop is ScanStop.CORRUPT:
        # scan_batches counts positions from the start of the chunk it framed.
        raise CorruptRecordError(f"{split.path}: at file position {tail.position}: {tail.error}")
    if tail.stop is ScanStop.PARTIAL and not split.last_segment:
        raise CorruptRecordError(
            f"{split.path}: torn batch at position {tail.position} in a segment that is "
            f"not the partition's last"
        )


# -- read_committed: outcomes of the split's transactions ---------------------------------


def _marker(split: Split, chunk: Chunk, header: BatchHeader) -> ControlType | None:
    from replicad.records.records import control_marker

    records = _decode(split, chunk, header).records
    if not records:
        return None
    return control_marker(records[0]).type


def _observe(outcomes: TransactionOutcomes, split: Split, walk: Walk, *, in_split: bool) -> None:
    for chunk in walk:
        for header in chunk.batches:
            marker = None
            if header.is_control and header.is_transactional:
                marker = _marker(split, chunk, header)
            # Batches outside the split's offsets are not read: their transactions do not matter.
            inside = (
                in_split
                and header.next_offset > split.start_offset
                and (split.end_offset is None or header.base_offset < split.end_offset)
            )
            outcomes.observe(header, marker, in_split=inside)
            if not in_split and not outcomes.needs_more:
                return


def _transaction_outcomes(
    fd: RandomAccess, split: Split, opener: FileOpener
) -> TransactionOutcomes:
    """Fold the split's headers, then as much of the rest of the partition as needed."""
    from replicad.spark.txn import TransactionOutcomes

    outcomes = TransactionOutcomes()
    _observe(
        outcomes,
        split,
        Walk(fd, split.start_position, split.end_position, verify_crc=False),
        in_split=True,
    )
    if not outcomes.needs_more:
        return outcomes
    segment_end = split.log_end.size if split.last_segment else fd.size
    _observe(
        outcomes, split, Walk(fd, split.end_position, segment_end, verify_crc=False), in_split=False
    )
    later = [
        base
        for base in opener.segments(split.directory)
        if split.segment < base <= split.log_end.segment
    ]
    for base in later:
        if not outcomes.needs_more:
            break
        path = join(split.directory, segment_file_name(base, ".log"))
        try:
            with opener.open(path, Purpose.LOOKAHEAD) as later_fd:
                size = split.log_end.size if base == split.log_end.segment else later_fd.size
                _observe(outcomes, split, Walk(later_fd, 0, size, verify_crc=False), in_split=False)
        except FileNotFoundError:  # deleted by retention meanwhile: it held no marker we need
            continue
    return outcomes


# -- batches view -------------------------------------------------------------------------


def read_batches(
    split: Split, options: ReadOptions, opener: FileOpener
) -> Iterator[pa.RecordBatch]:
    """One BATCHES_ARROW row per entry of the split within its offsets, and problem rows."""
    start, end = split.start_offset, split.end_offset
    columns = Columns(BATCHES_ARROW)
    head = (split.topic, split.partition, split.segment)
    with opener.open(split.path, Purpose.READ) as fd:
        walk = Walk(fd, split.start_position, split.end_position, verify_crc=options.verify_crc)
        done = False
        for chunk in walk:
            entries = _in_split(chunk, start, end)
            done = entries.past_end
            for header in entries.headers:
                columns.rows.append((*head, *_batch_fields(chunk.position, header), None, None))
                if len(columns) >= ROWS_PER_BATCH:
                    yield columns.take()
            if done:
                break
        tail = walk.tail
        if not done and tail is not None and tail.stop is not ScanStop.END:
            kind = PROBLEM_CORRUPT if tail.stop is ScanStop.CORRUPT else PROBLEM_TORN_TAIL
            problem = tail.error or f"torn batch at position {tail.position}"
            header_fields = [None] * (len(BATCHES_ARROW) - len(head) - 3)
            columns.rows.append((*head, tail.position, *header_fields, problem, kind))
    if len(columns):
        yield columns.take()


def _batch_fields(chunk_position: int, header: BatchHeader) -> tuple[object, ...]:
    return (
        chunk_position + header.position,
        header.base_offset,
        header.last_offset,
        header.record_count,
        header.size,
        header.magic,
        header.compression.name.lower(),
        int(header.timestamp_type),
        micros(header.max_timestamp),
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.partition_leader_epoch,
        header.is_transactional,
        header.is_control,
        header.crc,
    )
