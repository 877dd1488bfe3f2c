"""`replicad dump-log PATH`: what a segment holds, in the spirit of Kafka's DumpLogSegments.

PATH is a `.log`, `.index` or `.timeindex` file, or a partition directory (every segment in
it). For a `.log`: one line per batch (offsets, count, producer fields, leader epoch,
position, timestamp, size, magic, codec, CRC and whether it is valid); with `deep`, one line
per record below it. The segment's `.index` and `.timeindex` are checked against the batches.
Exit status 0 when everything is valid, 1 when a CRC fails, bytes trail the last whole
batch, records do not decode or an index does not match.

For a partition directory, batches of a segment at or past the next segment's base are
marked as not in the log: a running replicad's truncation across segments leaves them in
the file until its durability thread cuts it (log/partition.py), for milliseconds usually;
loading cuts them after a crash.
"""

from __future__ import annotations

import itertools
import os
import zlib
from pathlib import Path
from typing import TextIO

from replicad.errors import CorruptRecordError
from replicad.log.index import OFFSET_ENTRY, OFFSET_ENTRY_SIZE, TIME_ENTRY, TIME_ENTRY_SIZE
from replicad.log.layout import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from replicad.log.verify import check_offset_index, check_time_index, scan_file
from replicad.records.batch import (
    MAGIC_POSITION,
    MAGIC_V2,
    V2_CRC_START,
    BatchHeader,
    ScanStop,
    TimestampType,
)
from replicad.records.crc import crc32c
from replicad.records.records import control_marker, decode_batch

EXIT_OK = 0
EXIT_PROBLEMS = 1


def _crc_valid(data: bytes, batch: BatchHeader) -> bool:
    if batch.magic == MAGIC_V2:
        return crc32c(data[batch.position + V2_CRC_START : batch.end_position]) == batch.crc
    return zlib.crc32(data[batch.position + MAGIC_POSITION : batch.end_position]) == batch.crc


# How Kafka's tools print timestamp types.
_TIMESTAMP_TYPE_NAMES = {
    TimestampType.NO_TIMESTAMP_TYPE: "NoTimestampType",
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}


def _batch_line(batch: BatchHeader, valid: bool) -> str:
    ts_type = _TIMESTAMP_TYPE_NAMES[batch.timestamp_type]
    codec = batch.compression.name.lower()
    if batch.magic >= MAGIC_V2:
        head = (
            f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
            f"count: {batch.record_count} baseSequence: {batch.base_sequence} "
            f"producerId: {batch.producer_id} producerEpoch: {batch.producer_epoch} "
            f"partitionLeaderEpoch: {batch.partition_leader_epoch} "
            f"isTransactional: {str(batch.is_transactional).lower()} "
            f"isControl: {str(batch.is_control).lower()}"
        )
    else:
        head = f"offset: {batch.last_offset}"
    return (
        f"{head} position: {batch.position} {ts_type}: {batch.max_timestamp} size: {batch.size} "
        f"magic: {batch.magic} compresscodec: {codec} crc: {batch.crc} "
        f"isvalid: {str(valid).lower()}"
    )


def _dump_segment_log(
    path: Path, *, deep: bool, out: TextIO, next_base: int | None = None
) -> list[str]:
    problems: list[str] = []
    base = int(path.name.split(".")[0])
    print(f"Dumping {path}", file=out)
    print(f"Log starting offset: {base}", file=out)
    scan = scan_file(path, verify_crc=False)
    data = path.read_bytes() if scan.batches else b""
    past_next = False
    for batch in scan.batches:
        if next_base is not None and batch.last_offset >= next_base and not past_next:
            # A truncation across segments cuts this segment's files only after its renames
            # are durable (log/partition.py); loading cuts them the same way after a crash.
            past_next = True
            print(
                f"Batches from position {batch.position} on hold offsets at or past "
                f"{next_base}, where the next segment starts: a truncation's tail that a "
                "running replicad has not cut from the file yet (loading cuts it): not in "
                "the log",
                file=out,
            )
        valid = _crc_valid(data, batch)
        if not valid:
            problems.append(f"{path.name}: CRC mismatch in batch at position {batch.position}")
        print(_batch_line(batch, valid), file=out)
        if deep and valid:
            try:
                decoded = decode_batch(data, batch)
            except CorruptRecordError as exc:
                problems.append(f"{path.name}: {exc}")
                continue
            for record in decoded.records:
                line = (
                    f"| offset: {record.offset} {_TIMESTAMP_TYPE_NAMES[batch.timestamp_type]}: "
                    f"{record.timestamp} "
                    f"keySize: {len(record.key) if record.key is not None else -1} "
                    f"valueSize: {len(record.value) if record.value is not None else -1}"
                )
                if batch.magic >= MAGIC_V2:
                    keys = ",".join(h.key for h in record.headers)
                    line += f" sequence: {record.sequence} headerKeys: [{keys}]"
                if batch.is_control:
                    marker = control_marker(record)
                    kind = marker.type.name if marker.type else f"UNKNOWN({marker.type_id})"
                    line += f" controlType: {kind}"
                    if marker.coordinator_epoch is not None:
                        line += f" coordinatorEpoch: {marker.coordinator_epoch}"
                print(line, file=out)
    if scan.stop is ScanStop.CORRUPT:
        problems.append(f"{path.name}: {scan.error}")
    trailing = os.path.getsize(path) - scan.valid_bytes
    if trailing:
        print(f"Found {trailing} invalid bytes at the end of {path.name}", file=out)
        problems.append(f"{path.name}: {trailing} invalid bytes at the end")
    for suffix, check in (
        (INDEX_SUFFIX, check_offset_index),
        (TIME_INDEX_SUFFIX, check_time_index),
    ):
        index_path = path.with_suffix(suffix)
        if index_path.exists():
            found = check(index_path.read_bytes(), base, scan.batches)
            problems += [f"{index_path.name}: {p}" for p in found]
            print(f"{index_path.name}: {'ok' if not found else f'{len(found)} problems'}", file=out)
    return problems


def _dump_index(path: Path, out: TextIO) -> list[str]:
    base = int(path.name.split(".")[0])
    log_path = path.with_suffix(LOG_SUFFIX)
    scan = scan_file(log_path, verify_crc=False)
    data = path.read_bytes()
    print(f"Dumping {path}", file=out)
    if path.suffix == INDEX_SUFFIX:
        for slot in range(len(data) // OFFSET_ENTRY_SIZE):
            rel, pos = OFFSET_ENTRY.unpack_from(data, slot * OFFSET_ENTRY_SIZE)
            print(f"offset: {base + rel} position: {pos}", file=out)
        found = check_offset_index(data, base, scan.batches)
    else:
        for slot in range(len(data) // TIME_ENTRY_SIZE):
            ts, rel = TIME_ENTRY.unpack_from(data, slot * TIME_ENTRY_SIZE)
            print(f"timestamp: {ts} offset: {base + rel}", file=out)
        found = check_time_index(data, base, scan.batches)
    return [f"{path.name}: {p}" for p in found]


def dump_log(path: Path, *, deep: bool, out: TextIO) -> int:
    path = Path(path)
    if path.is_dir():
        targets = sorted(p for p in path.iterdir() if p.suffix == LOG_SUFFIX)
    else:
        targets = [path]
    # In a partition directory, where each segment's offsets end: the next one's base.
    next_bases = {
        target: int(following.name.split(".")[0])
        for target, following in itertools.pairwise(targets)
    }
    problems: list[str] = []
    for target in targets:
        if not target.exists():
            problems.append(f"{target}: no such file")
        elif target.suffix == LOG_SUFFIX:
            problems += _dump_segment_log(
                target, deep=deep, out=out, next_base=next_bases.get(target)
            )
        elif target.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            problems += _dump_index(target, out)
        else:
            problems.append(f"{target}: not a .log, .index or .timeindex file")
    for problem in problems:
        print(f"PROBLEM {problem}", file=out)
    return EXIT_PROBLEMS if problems else EXIT_OK
