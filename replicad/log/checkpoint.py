"""Kafka's checkpoint text files, and writing any small file atomically.

Offset checkpoints (`replication-offset-checkpoint`, `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint`) and the per-partition `leader-epoch-checkpoint` share one
format (Kafka's CheckpointFile):

    0                      <- version
    2                      <- number of entries
    orders 0 1500          <- `topic partition offset`  (epoch file: `epoch start_offset`)
    orders 1 1432

Parsing is strict: a wrong version, a count that does not match, a non-numeric or negative
field, or an extra line is rejected with a LogError naming the file and the line.
`partition.metadata` is `version: 0` then `topic_id: <Kafka Uuid>` (unpadded URL-safe base64).

Atomic writes: temp file in the same directory, write, fsync, rename over, fsync the
directory -- so a crash leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from replicad.errors import LogError
from replicad.log.layout import TEMP_SUFFIX
from replicad.types import TopicPartition

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """A leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


def format_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items())]
    return "\n".join(lines) + "\n"


def format_epochs(entries: Iterable[EpochEntry]) -> str:
    entries = list(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines += [f"{e.epoch} {e.start_offset}" for e in entries]
    return "\n".join(lines) + "\n"


def _body(text: str, source: str) -> list[list[str]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise LogError(f"{source}: malformed checkpoint file: fewer than 2 header lines")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise LogError(
            f"{source}: unsupported checkpoint version {lines[0].strip()!r} on line 1 "
            f"(expected {CHECKPOINT_VERSION})"
        )
    try:
        count = int(lines[1].strip())
    except ValueError:
        raise LogError(f"{source}: malformed entry count {lines[1]!r} on line 2") from None
    entries = lines[2:]
    if count < 0 or count != len(entries):
        raise LogError(f"{source}: expected {count} entries, found {len(entries)} lines")
    return [line.split(" ") for line in entries]


def _non_negative(value: str, source: str, line_no: int, line: list[str]) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0 or not value.isdigit():
        raise LogError(f"{source}: malformed line {line_no}: {' '.join(line)!r}")
    return number


def parse_offsets(text: str, *, source: str) -> dict[TopicPartition, int]:
    result: dict[TopicPartition, int] = {}
    for i, fields in enumerate(_body(text, source), start=3):
        if len(fields) != 3 or not fields[0]:
            raise LogError(f"{source}: malformed line {i}: {' '.join(fields)!r}")
        partition = _non_negative(fields[1], source, i, fields)
        offset = _non_negative(fields[2], source, i, fields)
        tp = TopicPartition(fields[0], partition)
        if tp in result:
            raise LogError(f"{source}: partition {tp} appears twice (line {i})")
        result[tp] = offset
    return result


def parse_epochs(text: str, *, source: str) -> list[EpochEntry]:
    result: list[EpochEntry] = []
    for i, fields in enumerate(_body(text, source), start=3):
        if len(fields) != 2:
            raise LogError(f"{source}: malformed line {i}: {' '.join(fields)!r}")
        epoch = _non_negative(fields[0], source, i, fields)
        start = _non_negative(fields[1], source, i, fields)
        if result and (epoch <= result[-1].epoch or start < result[-1].start_offset):
            raise LogError(f"{source}: line {i}: epochs and offsets must increase")
        result.append(EpochEntry(epoch, start))
    return result


def format_partition_metadata(topic_id: uuid.UUID) -> str:
    return f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {kafka_uuid(topic_id)}\n"


def parse_partition_metadata(text: str, *, source: str) -> uuid.UUID:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            raise LogError(f"{source}: malformed line {line!r}")
        fields[key.strip()] = value.strip()
    if fields.get("version") != str(PARTITION_METADATA_VERSION):
        raise LogError(f"{source}: unsupported version {fields.get('version')!r}")
    if "topic_id" not in fields:
        raise LogError(f"{source}: no topic_id")
    try:
        raw = base64.urlsafe_b64decode(fields["topic_id"] + "==")
        return uuid.UUID(bytes=raw)
    except ValueError:
        raise LogError(f"{source}: malformed topic_id {fields['topic_id']!r}") from None


def kafka_uuid(value: uuid.UUID) -> str:
    """A UUID as Kafka prints it (Uuid.toString: URL-safe base64 without padding)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a crash leaves the old or the new file whole."""
    os.replace(stage_file(path, text), path)
    fsync_dir(path.parent)


def stage_file(path: Path, text: str, *, tag: str = "") -> Path:
    """`text` written and fsynced beside `path` under a temporary name (`tag` makes it
    unique when two threads may stage the same file); the caller renames it over `path`
    and fsyncs the directory (the second half of write_atomically)."""
    tmp = path.with_name(f"{path.name}{tag}{TEMP_SUFFIX}")
    data = text.encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def read_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a text checkpoint file") from None
