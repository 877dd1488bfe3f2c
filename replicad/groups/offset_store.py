"""Committed offsets on disk, for `replicad serve`'s coordinator: what survives kill -9.

Why this format: one append-only file of records, each length-prefixed and CRC32C-checked,
fsynced before the commits it holds are acknowledged -- the same shape as Kafka's own
__consumer_offsets (a log of commits, compacted), with no second copy of anything and no
dependency. A commit costs one append and one fsync, shared by every commit waiting at
that moment (the caller batches). A database would do as well, but would add a format and
a library to a daemon that otherwise writes only Kafka's own files.

Rules:
- A record is `length (4) | crc32c of the payload (4) | payload (JSON)`. The payload is a
  commit (group, topic, partition, offset, leader epoch, metadata, commit time), an offset
  removal (offset null), a group removal, or a group's mark as the replica's own (`owned`:
  offsets synced from the source never go into it again, coordinator.py's rule). Replaying
  the file in order gives the state.
- The owned mark outlives the group's offsets and the group's removal: a group an
  application failed over to stays the replica's own, whatever happens to it here.
- `append` returns only once the records are fsynced: then the commits they hold would
  survive kill -9 and a power cut. Nothing is acknowledged before that (the caller's rule).
  An append that fails (a full disk) cuts the file back to where it began, so a torn
  record never sits before records written after it; if even that fails, the store
  refuses every later append rather than write after a torn record.
- Opening replays the file up to its first record that is short or fails its CRC: that
  record and anything after it were being written when the process died and were never
  acknowledged, so the file is cut there (and said so in the log).
- Compaction: once the file holds more than `COMPACT_RATIO` times as many records as there
  are live offsets (and at least `COMPACT_MIN_RECORDS`), the live state is written to a new
  file, fsynced, renamed over the old one and the directory fsynced: at every moment either
  the old or the new file is whole.
- The file lives in `<data dir>/__replicad_groups/`, which no partition directory name
  matches, so the log store never reads it.
- Blocking: every method does file I/O. The shell calls them on a thread of their own,
  never on the event loop.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from replicad.groups.classic_group import CommittedOffset
from replicad.records.crc import crc32c
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.groups.offset_store")

DIRECTORY = "__replicad_groups"
FILE = "offsets.log"
HEADER = struct.Struct(">II")
COMPACT_RATIO = 4
COMPACT_MIN_RECORDS = 10_000
# A payload larger than this is not one of ours: the file is cut there.
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Commit:
    group_id: str
    tp: TopicPartition
    offset: CommittedOffset


@dataclass(frozen=True, slots=True)
class OffsetRemoval:
    group_id: str
    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class GroupRemoval:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupOwned:
    group_id: str


Change = Commit | OffsetRemoval | GroupRemoval | GroupOwned
State = dict[str, dict[TopicPartition, CommittedOffset]]


def encode(change: Change) -> bytes:
    if isinstance(change, Commit):
        o = change.offset
        payload: dict[str, object] = {
            "g": change.group_id,
            "t": change.tp.topic,
            "p": change.tp.partition,
            "o": o.offset,
            "e": o.leader_epoch,
            "m": o.metadata,
            "ts": o.commit_timestamp_ms,
        }
    elif isinstance(change, OffsetRemoval):
        payload = {"g": change.group_id, "t": change.tp.topic, "p": change.tp.partition, "o": None}
    elif isinstance(change, GroupOwned):
        payload = {"g": change.group_id, "owned": True}
    else:
        payload = {"g": change.group_id, "deleted": True}
    data = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(len(data), crc32c(data)) + data


def decode(payload: bytes) -> Change:
    value = json.loads(payload)
    group_id = str(value["g"])
    if value.get("deleted"):
        return GroupRemoval(group_id)
    if value.get("owned"):
        return GroupOwned(group_id)
    tp = TopicPartition(str(value["t"]), int(value["p"]))
    if value["o"] is None:
        return OffsetRemoval(group_id, tp)
    offset = CommittedOffset(int(value["o"]), int(value["e"]), str(value["m"]), int(value["ts"]))
    return Commit(group_id, tp, offset)


def apply(state: State, owned: set[str], change: Change) -> None:
    if isinstance(change, GroupOwned):
        owned.add(change.group_id)
    elif isinstance(change, Commit):
        state.setdefault(change.group_id, {})[change.tp] = change.offset
    elif isinstance(change, OffsetRemoval):
        offsets = state.get(change.group_id)
        if offsets is not None:
            offsets.pop(change.tp, None)
            if not offsets:
                del state[change.group_id]
    else:
        state.pop(change.group_id, None)


@dataclass(frozen=True, slots=True)
class Replayed:
    records: int
    # Bytes of the valid prefix; anything after it was cut.
    valid_bytes: int
    cut_bytes: int


def replay(data: bytes, state: State, owned: set[str]) -> Replayed:
    """Apply every whole, valid record of `data` to `state` and `owned`, in order (pure)."""
    position = records = 0
    while position + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, position)
        start = position + HEADER.size
        if length > MAX_RECORD_BYTES or start + length > len(data):
            break
        payload = data[start : start + length]
        if crc32c(payload) != crc:
            break
        try:
            change = decode(payload)
        except (ValueError, KeyError, TypeError):
            break
        apply(state, owned, change)
        position = start + length
        records += 1
    return Replayed(records, position, len(data) - position)


class OffsetStore:
    """The file of one data directory; see the module docstring (every method blocks)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE
        self.state: State = {}
        self.owned: set[str] = set()
        self.records = 0
        self.compactions = 0
        self._fd: int | None = None
        self._size = 0
        self._broken: str | None = None

    @classmethod
    def open(cls, data_dir: Path) -> OffsetStore:
        store = cls(data_dir / DIRECTORY)
        store._open()
        return store

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{FILE}.tmp").unlink(missing_ok=True)  # a compaction cut short
        data = self.path.read_bytes() if self.path.exists() else b""
        replayed = replay(data, self.state, self.owned)
        self.records = replayed.records
        if replayed.cut_bytes:
            log.warning(
                "committed offsets: a record being written when serve stopped was dropped "
                "(never acknowledged)",
                path=str(self.path),
                bytes_dropped=replayed.cut_bytes,
            )
            with open(self.path, "r+b") as f:
                f.truncate(replayed.valid_bytes)
                os.fsync(f.fileno())
        self._reopen()
        _fsync_dir(self.directory)

    def _reopen(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    @property
    def live_offsets(self) -> int:
        return sum(len(offsets) for offsets in self.state.values())

    def append(self, changes: Iterable[Change]) -> None:
        """Write `changes` and fsync; when this returns they survive a crash."""
        fd = self._fd
        assert fd is not None, "store is closed"
        if self._broken is not None:
            raise OSError(f"committed offsets store unusable: {self._broken}")
        batch = list(changes)
        if not batch:
            return
        data = memoryview(b"".join(encode(c) for c in batch))
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, self._size)
            except OSError as again:
                self._broken = str(again)
            raise exc from None
        self._size += len(data)
        for change in batch:
            apply(self.state, self.owned, change)
        self.records += len(batch)
        live = self.live_offsets + len(self.owned)
        if self.records >= COMPACT_MIN_RECORDS and self.records > COMPACT_RATIO * max(live, 1):
            self.compact()

    def compact(self) -> None:
        """Rewrite the file with the live offsets and the owned marks only (atomically, see
        the rules)."""
        assert self._fd is not None, "store is closed"
        live: list[Change] = [GroupOwned(group_id) for group_id in sorted(self.owned)]
        live += [
            Commit(group_id, tp, offset)
            for group_id, offsets in self.state.items()
            for tp, offset in offsets.items()
        ]
        tmp = self.directory / f"{FILE}.tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(encode(c) for c in live))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)
        self._reopen()
        self.records = len(live)
        self.compactions += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def offsets(self) -> Mapping[str, Mapping[TopicPartition, CommittedOffset]]:
        return self.state

    def owned_groups(self) -> frozenset[str]:
        return frozenset(self.owned)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
