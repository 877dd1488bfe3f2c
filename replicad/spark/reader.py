"""Reading one split on an executor: the records view and the batches view.

Records view, batch by batch in file order (the decoding is `records.decode_batch`):
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

Batches view: one row per entry with its header fields, and a problem row for a corrupt
entry (the split's walk stops there) or a torn tail, instead of failing: verify reports.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from replicad.errors import CorruptRecordError
from replicad.log.layout import classify_partition_files, segment_file_name
from replicad.records.batch import MAGIC_V2, BatchHeader, ScanStop
from replicad.records.records import ControlType, DecodedBatch, control_marker, decode_batch
from replicad.spark.columns import ROWS_PER_BATCH, Columns
from replicad.spark.files import FileOpener, Purpose
from replicad.spark.options import Isolation, ReadOptions
from replicad.spark.plan import Split
from replicad.spark.schema import (
    BATCHES_ARROW,
    MICROS_PER_MILLI,
    RECORDS_ARROW,
    micros,
    none_if_negative,
)
from replicad.spark.txn import Outcome, TransactionOutcomes
from replicad.spark.walk import Chunk, Tail, Walk

PROBLEM_CORRUPT = "corrupt"
PROBLEM_TORN_TAIL = "torn_tail"


def read_records(
    split: Split, options: ReadOptions, opener: FileOpener
) -> Iterator[pa.RecordBatch]:
    """The records of `split` the options select, as Arrow batches of RECORDS_ARROW."""
    start, end = split.start_offset, split.end_offset
    topic, partition = split.topic, split.partition
    columns = Columns(RECORDS_ARROW)
    with opener.open(split.path, Purpose.READ) as fd:
        outcomes = None
        if options.isolation is Isolation.READ_COMMITTED:
            outcomes = _transaction_outcomes(fd, split, opener)
        walk = Walk(fd, split.start_position, split.end_position, verify_crc=options.verify_crc)
        done = False
        for chunk in walk:
            for header in chunk.batches:
                if header.next_offset <= start:
                    continue
                if end is not None and header.magic >= MAGIC_V2 and header.base_offset >= end:
                    done = True
                    break
                if _hidden(header, options, outcomes):
                    continue
                timestamp_type = int(header.timestamp_type)
                leader_epoch = none_if_negative(header.partition_leader_epoch)
                producer_id = none_if_negative(header.producer_id)
                transactional = header.is_transactional
                control = header.is_control
                append = columns.rows.append
                for record in _decode(split, chunk, header).records:
                    offset = record.offset
                    if offset < start:
                        continue
                    if end is not None and offset >= end:
                        done = True
                        break
                    # The hot loop: schema.micros inlined, no list built for no headers.
                    timestamp = record.timestamp
                    headers = record.headers
                    append(
                        (
                            topic,
                            partition,
                            offset,
                            timestamp * MICROS_PER_MILLI if timestamp >= 0 else None,
                            timestamp_type,
                            record.key,
                            record.value,
                            [(h.key, h.value) for h in headers] if headers else [],
                            leader_epoch,
                            producer_id,
                            transactional,
                            control,
                        )
                    )
                if len(columns) >= ROWS_PER_BATCH:
                    yield columns.take()
                if done:
                    break
            if done:
                break
        if not done:
            _check_tail(split, walk.tail)
    if len(columns):
        yield columns.take()


def _hidden(
    header: BatchHeader, options: ReadOptions, outcomes: TransactionOutcomes | None
) -> bool:
    """Whether a batch's records stay out of the view, decided without decoding them."""
    if header.is_control:
        return not options.include_control
    return (
        outcomes is not None
        and header.is_transactional
        and outcomes.outcome(header.producer_id, header.base_offset) is not Outcome.COMMITTED
    )


def _decode(split: Split, chunk: Chunk, header: BatchHeader) -> DecodedBatch:
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


def _transaction_outcomes(fd: int, split: Split, opener: FileOpener) -> TransactionOutcomes:
    """Fold the split's headers, then as much of the rest of the partition as needed."""
    outcomes = TransactionOutcomes()
    _observe(
        outcomes,
        split,
        Walk(fd, split.start_position, split.end_position, verify_crc=False),
        in_split=True,
    )
    if not outcomes.needs_more:
        return outcomes
    segment_end = split.log_end.size if split.last_segment else os.fstat(fd).st_size
    _observe(
        outcomes, split, Walk(fd, split.end_position, segment_end, verify_crc=False), in_split=False
    )
    directory = Path(split.directory)
    later = [
        base
        for base in classify_partition_files(sorted(os.listdir(directory))).segments
        if split.segment < base <= split.log_end.segment
    ]
    for base in later:
        if not outcomes.needs_more:
            break
        path = str(directory / segment_file_name(base, ".log"))
        try:
            with opener.open(path, Purpose.LOOKAHEAD) as later_fd:
                size = (
                    split.log_end.size
                    if base == split.log_end.segment
                    else os.fstat(later_fd).st_size
                )
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
            for header in chunk.batches:
                if header.next_offset <= start:
                    continue
                if end is not None and header.magic >= MAGIC_V2 and header.base_offset >= end:
                    done = True
                    break
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
