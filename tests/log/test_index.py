"""Offset and time index math: lookups at the edges, truncation, the shared IndexBuilder."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.log.index import (
    IndexBuilder,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
)
from replicad.records.batch import LOG_OVERHEAD, BatchRun, scan_batches
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


# -- index_run: recovery's entries, batch by batch ---------------------------------------

INTERVAL = 4096


def _field_tuple(base_offset: int, length: int, delta: int, max_ts: int) -> tuple[int, ...]:
    """A run's tuple (BatchHeader's fields after the position) with what indexing reads."""
    return (base_offset, length, 0, 2, 0, 0, delta, max_ts, max_ts, -1, -1, -1, delta + 1)


@dataclass(frozen=True)
class _Before:
    """What the builder and the indexes hold before a run."""

    since: int
    builder_ts: int
    builder_offset: int
    prior: int  # entries each index holds (offsets BASE + 2i)
    last_stamp: int  # the time index's last timestamp, when it holds entries
    offset_room: int
    time_room: int

    def state(self) -> tuple[IndexBuilder, OffsetIndex, TimeIndex]:
        builder = IndexBuilder(
            INTERVAL, TimestampOffset(self.builder_ts, self.builder_offset), self.since
        )
        offsets = OffsetIndex(BASE, (self.prior + self.offset_room) * 8)
        times = TimeIndex(BASE, (self.prior + self.time_room) * 12)
        for i in range(self.prior):
            offsets.append(BASE + 2 * i, 100 * (i + 1))
            times.maybe_append(self.last_stamp - self.prior + 1 + i, BASE + 2 * i)
        return builder, offsets, times


@st.composite
def _runs(draw: st.DrawFn) -> tuple[BatchRun, int, _Before]:
    """A run of batches above and below the interval, offsets that rise with gaps or go
    back, timestamps that rise, repeat and fall; a builder and indexes that already hold
    something, sometimes with little room left."""
    n = draw(st.integers(1, 12))
    # Above the interval with the log overhead, and at or below it (the boundary included).
    big = st.integers(INTERVAL - LOG_OVERHEAD + 1, 3 * INTERVAL)
    small = st.integers(61, INTERVAL - LOG_OVERHEAD)
    sizes = st.one_of(big, small) if draw(st.booleans()) else big
    lengths = draw(st.lists(sizes, min_size=n, max_size=n))
    deltas = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    # Timestamps that rise, repeat and fall.
    stamps = draw(st.lists(st.integers(995, 1010), min_size=n, max_size=n))
    offset = BASE + draw(st.integers(-8, 60))  # below the segment's base: refused
    fields = []
    for length, delta, stamp in zip(lengths, deltas, stamps, strict=True):
        fields.append(_field_tuple(offset, length, delta, stamp))
        offset += delta + 1 + draw(st.sampled_from([0, 0, 0, 3]))  # gaps, as compaction leaves
    if n > 1 and draw(st.integers(0, 5)) == 0:  # offsets that go back: refused
        i = draw(st.integers(1, n - 1))
        fields[i] = _field_tuple(fields[i - 1][0], *(fields[i][j] for j in (1, 6, 8)))
    run = BatchRun(fields, 0, sum(f[1] + LOG_OVERHEAD for f in fields))
    before = _Before(
        since=draw(st.sampled_from([0, 100, INTERVAL, INTERVAL + 1, 3 * INTERVAL])),
        builder_ts=draw(st.sampled_from([-1, 990, 1000, 1005, 1020])),
        builder_offset=draw(st.sampled_from([BASE - 1] * 6 + [BASE + 2, BASE + 30, BASE + 200])),
        prior=draw(st.integers(0, 3)),
        last_stamp=draw(st.sampled_from([990, 1000, 1008])),
        offset_room=draw(st.sampled_from([1, 8] + [64] * 6)),
        time_room=draw(st.sampled_from([1, 2, 8] + [64] * 5)),
    )
    return run, draw(st.integers(0, 99)), before


def _observed(
    builder: IndexBuilder, run: BatchRun, start: int, offsets: OffsetIndex, times: TimeIndex
) -> None:
    """The entries as recovery makes them (segment._rebuild_from): `observe` a batch at a
    time, each entry added through the indexes' own checked appends."""
    for header in run:
        entries = builder.observe(header, start + header.position)
        if entries is not None:
            offsets.append(entries.offset_entry.offset, entries.offset_entry.position)
            times.maybe_append(entries.time_entry.timestamp, entries.time_entry.offset)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_runs())
def test_index_run_makes_the_entries_recovery_makes(
    drawn: tuple[BatchRun, int, _Before],
) -> None:
    """index_run (the append's pass) against observe (recovery's, a batch at a time): the
    same entries, builder state and refusals; a refused run changes nothing."""
    run, start, before = drawn
    builder, offsets, times = before.state()
    reference = before.state()
    try:
        _observed(*reference[:1], run, start, *reference[1:])
    except ValueError as exc:
        with pytest.raises(ValueError) as refused:
            builder.index_run(run, start, offsets, times)
        assert str(refused.value) == str(exc)
        untouched = before.state()
        assert (builder.max_timestamp, builder.bytes_since_last_entry) == (
            untouched[0].max_timestamp,
            untouched[0].bytes_since_last_entry,
        )
        assert (offsets.raw(), times.raw()) == (untouched[1].raw(), untouched[2].raw())
        return
    offset_raw, time_raw = builder.index_run(run, start, offsets, times)
    ref_builder, ref_offsets, ref_times = reference
    assert (offsets.raw(), times.raw()) == (ref_offsets.raw(), ref_times.raw())
    assert (builder.max_timestamp, builder.bytes_since_last_entry) == (
        ref_builder.max_timestamp,
        ref_builder.bytes_since_last_entry,
    )
    held = before.state()
    assert (offset_raw, time_raw) == (
        ref_offsets.raw()[len(held[1].raw()) :],
        ref_times.raw()[len(held[2].raw()) :],
    )


def test_index_run_refuses_an_offset_past_what_the_segment_can_hold() -> None:
    """A relative offset must fit an int32: the run is refused whole, nothing added."""
    fields = [
        _field_tuple(BASE + 2**31 - 3, INTERVAL, 1, 1000),
        _field_tuple(BASE + 2**31 - 1, INTERVAL, 1, 1001),  # indexed at BASE + 2**31
    ]
    run = BatchRun(fields, 0, 2 * (INTERVAL + LOG_OVERHEAD))
    builder, offsets, times = _Before(0, -1, BASE - 1, 0, 0, 64, 64).state()
    with pytest.raises(ValueError, match=f"offset {BASE + 2**31} does not fit segment {BASE}"):
        builder.index_run(run, 0, offsets, times)
    assert offsets.entries == 0 and times.entries == 0
    assert builder.bytes_since_last_entry == 0
