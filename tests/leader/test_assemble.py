"""leader/assemble.py: a run of bytes and small file regions as one buffer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicad.leader.assemble import assemble
from replicad.log.nowait import WouldWait, not_waiting, pread_cached
from replicad.log.segment import FileRegion
from replicad.records.downconvert import overflow_entry
from tests.page_cache import dropped


def test_bytes_and_regions_are_laid_out_in_order_each_file_read_in_place(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(bytes(range(200)))
    b.write_bytes(b"B" * 50)
    parts = [b"head", FileRegion(a, 10, 20), b"", FileRegion(b, 0, 50), FileRegion(a, 0, 3)]
    done = assemble(parts)
    assert done.buffer == b"head" + bytes(range(10, 30)) + b"B" * 50 + bytes(range(3))
    assert (done.region_bytes, done.short_regions) == (73, 0)


def test_a_region_of_a_file_that_shrank_or_vanished_ends_in_an_overflow_entry(
    tmp_path: Path,
) -> None:
    """The buffer keeps the size the frame announced: what is missing is KIP-283's
    trailing partial entry, which the client drops."""
    shrunk = tmp_path / "shrunk.log"
    shrunk.write_bytes(b"x" * 30)
    parts = [FileRegion(shrunk, 10, 40), b"mid", FileRegion(tmp_path / "gone.log", 0, 16)]
    done = assemble(parts)
    assert len(done.buffer) == 40 + 3 + 16
    assert done.buffer[:20] == b"x" * 20
    assert done.buffer[20:40] == b"".join(overflow_entry(20))
    assert done.buffer[40:43] == b"mid"
    assert done.buffer[43:] == b"".join(overflow_entry(16))
    assert (done.region_bytes, done.short_regions) == (20, 2)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_on_the_loop_a_run_of_cached_regions_is_assembled_as_anywhere(tmp_path: Path) -> None:
    a = tmp_path / "a.log"
    a.write_bytes(bytes(range(200)))
    fd = os.open(a, os.O_RDONLY)
    try:
        os.pread(fd, 200, 0)
        try:
            pread_cached(fd, 200, 0)
        except WouldWait as exc:
            pytest.skip(f"no read without waiting on {tmp_path}: {exc}")
    finally:
        os.close(fd)
    parts = [b"head", FileRegion(a, 10, 20), FileRegion(a, 0, 3)]
    with not_waiting():
        done = assemble(parts)
    assert done == assemble(parts)
    assert done.buffer == b"head" + bytes(range(10, 30)) + bytes(range(3))


def test_on_the_loop_a_region_not_cached_would_wait_and_leaves_no_file_open(
    tmp_path: Path,
) -> None:
    """serve then assembles the run on a worker thread (a shrunk file is told apart there:
    on the loop a short read only says the bytes are not all cached)."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(bytes(range(200)))
    b.write_bytes(os.urandom(3 * 4096))
    dropped(b)
    before = _open_fds()
    with pytest.raises(WouldWait), not_waiting():
        assemble([FileRegion(a, 0, 10), FileRegion(b, 5000, 100)])
    assert _open_fds() == before
    assert assemble([FileRegion(b, 5000, 100)]).buffer == b.read_bytes()[5000:5100]
