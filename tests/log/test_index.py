"""Offset and time index math: lookups at the edges, truncation, the shared IndexBuilder."""

from __future__ import annotations

import pytest

from replicad.log.index import (
    IndexBuilder,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
)
from replicad.records.batch import scan_batches
from tools.logdata.batches import producer_batch

BASE = 1000


def _offset_index() -> OffsetIndex:
    index = OffsetIndex(BASE, 1024)
    for rel, pos in ((9, 4100), (19, 8300), (29, 12500)):
        index.append(BASE + rel, pos)
    return index


def test_offset_lookup_edges() -> None:
    index = _offset_index()
    # Below the first entry (and below the base): the segment start.
    assert index.lookup(BASE) == OffsetPosition(BASE, 0)
    assert index.lookup(BASE - 5) == OffsetPosition(BASE, 0)
    assert index.lookup(BASE + 8) == OffsetPosition(BASE, 0)
    # Exactly on an entry, between entries, past the last one.
    assert index.lookup(BASE + 9) == OffsetPosition(BASE + 9, 4100)
    assert index.lookup(BASE + 18) == OffsetPosition(BASE + 9, 4100)
    assert index.lookup(BASE + 29) == OffsetPosition(BASE + 29, 12500)
    assert index.lookup(BASE + 10**6) == OffsetPosition(BASE + 29, 12500)


def test_offset_index_rejects_disorder_overflow_and_full() -> None:
    index = _offset_index()
    with pytest.raises(ValueError, match="not above"):
        index.append(BASE + 29, 13000)
    with pytest.raises(ValueError, match="does not fit"):
        index.append(BASE + 2**31, 13000)
    small = OffsetIndex(0, 16)
    small.append(1, 10)
    small.append(2, 20)
    assert small.is_full
    with pytest.raises(ValueError, match="full"):
        small.append(3, 30)


def test_offset_truncate_removes_entries_at_and_above() -> None:
    index = _offset_index()
    index.truncate_to(BASE + 19)
    assert index.entries == 1 and index.last_entry() == OffsetPosition(BASE + 9, 4100)
    index.truncate_to(BASE + 10)
    assert index.entries == 1
    index.truncate_to(BASE)
    assert index.entries == 0


def test_time_index_lookup_and_only_growing_timestamps() -> None:
    index = TimeIndex(BASE, 1200)
    assert index.maybe_append(500, BASE + 4) != b""
    assert index.maybe_append(500, BASE + 9) == b""  # not larger: skipped
    assert index.maybe_append(800, BASE + 19) != b""
    assert index.maybe_append(900, BASE + 29) != b""
    assert index.entries == 3
    assert index.lookup(100) == TimestampOffset(-1, BASE)
    assert index.lookup(500) == TimestampOffset(500, BASE + 4)
    assert index.lookup(799) == TimestampOffset(500, BASE + 4)
    assert index.lookup(10**12) == TimestampOffset(900, BASE + 29)
    index.truncate_to(BASE + 19)
    assert index.last_entry() == TimestampOffset(500, BASE + 4)


def test_sanity_errors() -> None:
    index = OffsetIndex(0, 1024, bytes(16))  # two zero entries: a crashed preallocated file
    assert index.sanity_error(16) is not None
    assert _offset_index().sanity_error(24) is None
    assert _offset_index().sanity_error(25) is not None
    assert TimeIndex(0, 1200, bytes(24)).sanity_error(24) is not None


def test_builder_indexes_after_interval_with_batch_last_offsets() -> None:
    batches = [
        producer_batch(10 * i, [b"x" * 100] * 10, timestamps=[5000 - i + j for j in range(10)])
        for i in range(12)
    ]
    data = b"".join(batches)
    headers = scan_batches(data).batches
    builder = IndexBuilder(2500, TimestampOffset(-1, 0))
    entries = [e for h in headers if (e := builder.observe(h, h.position)) is not None]
    size = headers[0].size
    # The first batch past 2500 bytes since the last indexed one (or the start) gets one.
    per_entry = 2500 // size + 1
    assert [e.offset_entry.position for e in entries] == [
        size * per_entry * k for k in range(1, len(entries) + 1)
    ]
    for e in entries:
        batch = next(h for h in headers if h.position == e.offset_entry.position)
        assert e.offset_entry.offset == batch.last_offset
    # Batch 0 has the largest timestamps (5009): the time entries keep pointing at it.
    assert {e.time_entry for e in entries} == {TimestampOffset(5009, 9)}
