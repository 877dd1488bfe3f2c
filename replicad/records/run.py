"""A run of whole log entries laid end to end, held as columns rather than as objects.

The replication path scans a response's batches, checks them and writes them. At 1 KiB
batches a `BatchHeader` per batch (then a frozen dataclass: fourteen attribute stores), a
`dataclasses.replace` to rebase it and a few property calls cost about ten times the scan
itself. A `BatchRun` keeps what the scan already has instead:

- `fields`: one tuple per entry, exactly as `struct.unpack_from` returned it for a magic 2
  batch -- BatchHeader's fields after the position, in BatchHeader's order (base offset,
  length, partition leader epoch, magic, crc, attributes, last offset delta, base and max
  timestamp, producer id and epoch, base sequence, record count). Magic 0/1 entries are
  held in the same shape, with the values `legacy.py` gives them.
- `start` and `end`: where the first entry begins and the last one ends in the buffer the
  run was read from. Entries are contiguous, so each position follows from the one before
  (position + LOG_OVERHEAD + length): positions are not stored, and rebasing a run to
  another buffer (`rebased`) or slicing it copies no entry.

What a whole run is asked on the hot path (its size, offsets, record count, leader epochs,
timestamps) is answered by C-level passes over the tuples (`map`, `max`, `sum`), never one
Python call per batch. Where a batch at a time reads better than fast (dump, verify, the
leader's reads, the tests), a `BatchRun` is a `Sequence[BatchHeader]`: indexing or iterating
makes the headers on demand, equal to those a scan made before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate, islice, repeat
from operator import add, gt, itemgetter
from typing import overload

from replicad.records.header import LOG_OVERHEAD, MAGIC_V2, BatchHeader, header_from

# Where each field sits in an entry's tuple (BatchHeader's order, after the position).
BASE_OFFSET = 0
LENGTH = 1
LEADER_EPOCH = 2
MAGIC = 3
LAST_OFFSET_DELTA = 6
MAX_TIMESTAMP = 8
RECORD_COUNT = 12
FIELD_COUNT = 13

Fields = tuple[int, ...]

_base = itemgetter(BASE_OFFSET)
_length = itemgetter(LENGTH)
_epoch = itemgetter(LEADER_EPOCH)
_magic = itemgetter(MAGIC)
_delta = itemgetter(LAST_OFFSET_DELTA)
_max_timestamp = itemgetter(MAX_TIMESTAMP)
_count = itemgetter(RECORD_COUNT)


def fields_of(header: BatchHeader) -> Fields:
    """A header's fields after its position, as a run holds them."""
    return header[1:]


class BatchRun(Sequence[BatchHeader]):
    """Whole entries from `start` to `end` of a buffer (see the module docstring)."""

    __slots__ = ("_positions", "end", "fields", "rising", "start")

    def __init__(self, fields: list[Fields], start: int, end: int, *, rising: bool = False) -> None:
        self.fields = fields
        self.start = start
        self.end = end
        # True when whoever made the run saw every entry's offsets above the last offset of
        # the entry before (the scan does, at the cost of a compare per batch): then
        # `first_overlap` need not look again. False says nothing.
        self.rising = rising
        self._positions: list[int] | None = None

    @classmethod
    def of(cls, headers: Sequence[BatchHeader] | BatchRun) -> BatchRun:
        """The run of headers that lie end to end (as a scan returns them)."""
        if isinstance(headers, BatchRun):
            return headers
        if not headers:
            return cls([], 0, 0)
        position = headers[0].position
        for header in headers:
            if header.position != position:
                raise ValueError(
                    f"batch at position {header.position} does not follow the one before, "
                    f"which ends at {position}"
                )
            position = header.end_position
        return cls([fields_of(h) for h in headers], headers[0].position, position)

    # -- the whole run, answered without a Python call per entry ---------------------------

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def base_offset(self) -> int:
        return self.fields[0][BASE_OFFSET]

    @property
    def last_offset(self) -> int:
        last = self.fields[-1]
        return last[BASE_OFFSET] + last[LAST_OFFSET_DELTA]

    @property
    def next_offset(self) -> int:
        last = self.fields[-1]
        return last[BASE_OFFSET] + last[LAST_OFFSET_DELTA] + 1

    @property
    def record_count(self) -> int:
        """Records in the run; an entry that does not say (a compressed magic 0/1 wrapper,
        -1) counts as one, as Kafka counts a message set's messages for flushing."""
        counts = list(map(_count, self.fields))
        if not counts or min(counts) > 0:
            return sum(counts)
        return sum(c if c > 0 else 1 for c in counts)

    @property
    def max_timestamp(self) -> int:
        return max(map(_max_timestamp, self.fields))

    def max_leader_epoch(self) -> int | None:
        """The highest partition leader epoch of the run's magic 2 batches (None: none)."""
        fields = self.fields
        if fields and min(map(_magic, fields)) >= MAGIC_V2:
            return max(map(_epoch, fields))
        epochs = [f[LEADER_EPOCH] for f in fields if f[MAGIC] >= MAGIC_V2]
        return max(epochs) if epochs else None

    def epoch_starts(self, latest: int) -> list[tuple[int, int]]:
        """(epoch, base offset) of each magic 2 batch whose epoch rises above `latest` and
        every epoch before it: where the leader-epoch cache gets an entry."""
        highest = self.max_leader_epoch()
        if highest is None or highest <= latest:
            return []  # the common case: one pass in C
        starts = []
        for f in self.fields:
            if f[MAGIC] >= MAGIC_V2 and f[LEADER_EPOCH] > latest:
                latest = f[LEADER_EPOCH]
                starts.append((latest, f[BASE_OFFSET]))
        return starts

    def first_epoch_above(self, epoch: int, begin: int = 0) -> int | None:
        """The index of the first magic 2 entry from `begin` on whose partition leader
        epoch is above `epoch`, or None (magic 0/1 entries hold -1: never above)."""
        fields = self.fields
        if begin >= len(fields) or max(map(_epoch, islice(fields, begin, None))) <= epoch:
            return None  # the common case: one pass in C
        for k in range(begin, len(fields)):
            if fields[k][MAGIC] >= MAGIC_V2 and fields[k][LEADER_EPOCH] > epoch:
                return k
        return None

    def first_overlap(self, begin: int = 0) -> int | None:
        """The index of the first entry after `begin` that starts at or below the last
        offset of the entry before it (offsets must rise), or None."""
        fields = self.fields
        if self.rising or len(fields) - begin < 2:
            return None
        bases = list(map(_base, islice(fields, begin, None)))
        lasts = map(add, bases, map(_delta, islice(fields, begin, None)))
        if all(map(gt, islice(bases, 1, None), lasts)):
            return None  # the common case: every pass in C
        for k in range(1, len(bases)):
            prev = fields[begin + k - 1]
            if bases[k] <= prev[BASE_OFFSET] + prev[LAST_OFFSET_DELTA]:
                return begin + k
        raise AssertionError("unreachable: the C pass found an overlap")

    def positions(self) -> list[int]:
        """Where each entry starts (computed once, in C)."""
        if self._positions is None:
            sizes = map(add, map(_length, self.fields), repeat(LOG_OVERHEAD))
            self._positions = list(accumulate(sizes, initial=self.start))[:-1]
        return self._positions

    def rebased(self, start: int) -> BatchRun:
        """The same entries, read from a buffer where the first begins at `start`."""
        if start == self.start:
            return self
        return BatchRun(self.fields, start, start + self.end - self.start, rising=self.rising)

    # -- Sequence[BatchHeader] -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.fields)

    @overload
    def __getitem__(self, index: int) -> BatchHeader: ...

    @overload
    def __getitem__(self, index: slice) -> BatchRun: ...

    def __getitem__(self, index: int | slice) -> BatchHeader | BatchRun:
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self.fields))
            if step != 1:
                raise ValueError("a run is sliced contiguously")
            if hi <= lo:
                return BatchRun([], self.start, self.start)
            positions = self.positions()
            end = positions[hi] if hi < len(positions) else self.end
            return BatchRun(self.fields[lo:hi], positions[lo], end, rising=self.rising)
        return header_from((self.positions()[index], *self.fields[index]))

    def __iter__(self) -> Iterator[BatchHeader]:
        position = self.start
        for f in self.fields:
            yield header_from((position, *f))
            position += LOG_OVERHEAD + f[LENGTH]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchRun):
            return (self.fields, self.start, self.end) == (other.fields, other.start, other.end)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if not self.fields:
            return f"BatchRun(empty at {self.start})"
        return (
            f"BatchRun({len(self.fields)} entries, offsets {self.base_offset}.."
            f"{self.last_offset}, bytes {self.start}..{self.end})"
        )
