"""BatchRun: the columns a scan returns answer what the headers answered, without them."""

from __future__ import annotations

import pytest

from replicad.records.batch import Compression, scan_batches
from replicad.records.run import BatchRun
from tools.logdata.batches import legacy_message_set, producer_batch


def _stream() -> tuple[bytes, list[bytes]]:
    """Five batches at offsets 10.., epochs 3, 3, 5, 4, 6 (a lower one in between), with
    1, 2, 3, 4 and 5 records."""
    parts = []
    offset = 10
    for i, epoch in enumerate([3, 3, 5, 4, 6]):
        values = [f"v{offset + j}".encode() * 30 for j in range(i + 1)]
        parts.append(
            producer_batch(offset, values, leader_epoch=epoch, timestamp_ms=1_000 + 100 * (i % 3))
        )
        offset += len(values)
    return b"".join(parts), parts


def test_the_run_of_a_scan_is_its_headers() -> None:
    data, _ = _stream()
    scan = scan_batches(data)
    run = scan.run
    headers = scan.batches
    assert len(run) == 5
    assert list(run) == headers
    assert [run[i] for i in range(5)] == headers
    assert run[-1] == headers[-1]
    assert run == headers
    assert run.positions() == [h.position for h in headers]
    assert (run.start, run.end, run.size) == (0, len(data), len(data))
    assert (run.base_offset, run.last_offset, run.next_offset) == (10, 24, 25)
    assert run.record_count == 15
    assert run.max_timestamp == max(h.max_timestamp for h in headers)
    assert run.max_leader_epoch() == 6
    assert run.rising  # the scan saw the offsets rise


def test_slices_and_rebasing_keep_positions() -> None:
    data, parts = _stream()
    run = scan_batches(data).run
    middle = run[1:4]
    assert isinstance(middle, BatchRun)
    assert list(middle) == scan_batches(data).batches[1:4]
    assert (middle.start, middle.end) == (len(parts[0]), len(b"".join(parts[:4])))
    assert middle.base_offset == 11 and middle.next_offset == 20
    rebased = middle.rebased(0)
    assert list(rebased) == scan_batches(b"".join(parts[1:4])).batches
    assert run[3:3].size == 0 and not run[3:3]
    with pytest.raises(ValueError):
        run[::2]


def test_epoch_starts_are_where_the_epoch_cache_grows() -> None:
    run = scan_batches(_stream()[0]).run
    # The epoch rises at offsets 10 (3), 13 (5) and 20 (6); 4 at 16 is below 5: no entry.
    assert run.epoch_starts(-1) == [(3, 10), (5, 13), (6, 20)]
    assert run.epoch_starts(4) == [(5, 13), (6, 20)]
    assert run.epoch_starts(6) == []


def test_legacy_entries_count_one_record_and_no_epoch() -> None:
    plain = legacy_message_set(0, [b"a", b"b"], magic=1)
    wrapper = legacy_message_set(2, [b"c", b"d", b"e"], magic=1, codec=Compression.GZIP)
    v2 = producer_batch(5, [b"f", b"g"], leader_epoch=7)
    run = scan_batches(plain + wrapper + v2).run
    # Two plain messages (1 each), a wrapper that does not say (-1: counted as 1), then 2.
    assert [h.record_count for h in run] == [1, 1, -1, 2]
    assert run.record_count == 5
    assert run.max_leader_epoch() == 7  # the legacy entries' -1 is no epoch
    assert run.epoch_starts(-1) == [(7, 5)]
    assert scan_batches(plain).run.max_leader_epoch() is None
    assert run.first_overlap() is None


def test_first_overlap_finds_offsets_that_go_back() -> None:
    data, _ = _stream()
    headers = scan_batches(data).batches
    # The fourth batch claims offsets 12.. (inside the second batch's 11..12).
    bad = [*headers[:3], headers[3]._replace(base_offset=12), headers[4]]
    run = BatchRun.of(bad)
    assert not run.rising
    assert run.first_overlap() == 3
    assert run.first_overlap(3) is None  # from the fourth on they rise again
    assert BatchRun.of(headers).first_overlap() is None


def test_the_scan_marks_a_run_whose_offsets_go_back() -> None:
    first = producer_batch(10, [b"a", b"b", b"c"])
    again = producer_batch(11, [b"d"])  # the offset is outside the CRC: still a sound batch
    run = scan_batches(first + again).run
    assert len(run) == 2
    assert not run.rising
    assert run.first_overlap() == 1


def test_of_refuses_headers_that_are_not_end_to_end() -> None:
    data, _ = _stream()
    headers = scan_batches(data).batches
    with pytest.raises(ValueError, match="does not follow"):
        BatchRun.of([headers[0], headers[2]])
    assert BatchRun.of(headers[2:]).start == headers[2].position
    assert BatchRun.of([]).size == 0
