"""Walking a segment's byte range in bounded chunks: whole entries, tails, corruption."""

from __future__ import annotations

import os

import pytest

from replicad.records.batch import Compression, ScanStop
from replicad.spark.walk import Walk


@pytest.fixture
def segment(tmp_path, make_batches):
    batches = [make_batches.data(i * 5, 5, codec=Compression(i % 5)) for i in range(40)]
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(batches))
    return path, batches


def walk_all(path, start, end, **kwargs):
    fd = os.open(path, os.O_RDONLY)
    try:
        walk = Walk(fd, start, end, **kwargs)
        chunks = list(walk)
        return chunks, walk.tail
    finally:
        os.close(fd)


@pytest.mark.parametrize("chunk_bytes", [1, 100, 1000, 10**6])
def test_every_entry_once_whatever_the_chunk_size(segment, chunk_bytes):
    path, _ = segment
    chunks, tail = walk_all(path, 0, path.stat().st_size, chunk_bytes=chunk_bytes)
    seen = [h.base_offset for c in chunks for h in c.batches]
    assert seen == [i * 5 for i in range(40)]
    assert tail.stop is ScanStop.END and tail.position == path.stat().st_size
    # positions are relative to the chunk, the chunk knows where it starts
    data = path.read_bytes()
    for chunk in chunks:
        for h in chunk.batches:
            start = chunk.position + h.position
            assert data[start : start + h.size] == chunk.data[h.position : h.end_position]
    if chunk_bytes >= 10**6:
        assert len(chunks) == 1


def test_a_range_in_the_middle(segment):
    path, batches = segment
    start = sum(len(b) for b in batches[:10])
    end = sum(len(b) for b in batches[:20])
    chunks, tail = walk_all(path, start, end, chunk_bytes=300)
    assert [h.base_offset for c in chunks for h in c.batches] == [i * 5 for i in range(10, 20)]
    assert tail == type(tail)(end, ScanStop.END)


def test_a_torn_tail_is_reported_with_its_position(tmp_path, segment):
    path, batches = segment
    torn = tmp_path / "torn.log"
    whole = sum(len(b) for b in batches[:39])
    torn.write_bytes(path.read_bytes()[: whole + 30])
    chunks, tail = walk_all(torn, 0, whole + 30, chunk_bytes=500)
    assert len([h for c in chunks for h in c.batches]) == 39
    assert tail.stop is ScanStop.PARTIAL and tail.position == whole


def test_a_file_shorter_than_planned_ends_as_a_torn_tail(segment):
    path, _ = segment
    size = path.stat().st_size
    chunks, tail = walk_all(path, 0, size + 5000)
    assert len([h for c in chunks for h in c.batches]) == 40
    assert tail.stop is ScanStop.PARTIAL and tail.position == size


def test_corruption_stops_the_walk_at_the_bad_entry(tmp_path, segment):
    path, batches = segment
    data = bytearray(path.read_bytes())
    bad_at = sum(len(b) for b in batches[:7])
    data[bad_at + 70] ^= 0xFF  # inside the records: the CRC32C no longer matches
    broken = tmp_path / "broken.log"
    broken.write_bytes(bytes(data))
    chunks, tail = walk_all(broken, 0, len(data), chunk_bytes=400)
    assert len([h for c in chunks for h in c.batches]) == 7
    assert tail.stop is ScanStop.CORRUPT and tail.position == bad_at
    assert "CRC32C" in tail.error
    unchecked, tail = walk_all(broken, 0, len(data), verify_crc=False)
    assert tail.stop is ScanStop.END
    assert len([h for c in unchecked for h in c.batches]) == 40


def test_an_entry_larger_than_the_chunk_is_read_whole(tmp_path, make_batches):
    big = make_batches.data(0, 3, value_size=50_000)
    small = make_batches.data(3, 2)
    path = tmp_path / "big.log"
    path.write_bytes(big + small)
    chunks, tail = walk_all(path, 0, len(big) + len(small), chunk_bytes=1024)
    assert [h.base_offset for c in chunks for h in c.batches] == [0, 3]
    assert max(len(c.data) for c in chunks) == len(big)
    assert tail.stop is ScanStop.END
