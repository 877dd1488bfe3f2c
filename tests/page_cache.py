"""A file's bytes put into or out of the page cache, for the tests of reads that must not
wait on the disk (replicad/log/nowait.py and serve's reads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicad.log.nowait import WouldWait, pread_cached


def dropped(path: Path) -> None:
    """`path`'s bytes out of the page cache (written back first: only clean pages go). Not
    checked by a read without waiting: the kernel starts reading ahead where one fails. (On
    tmpfs nothing is dropped, but no read there can say it would not wait.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached(path: Path) -> None:
    """`path`'s bytes in the page cache; the test is skipped on a file system whose reads
    cannot say they would not wait (tmpfs): its reads always leave the loop."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.pread(fd, size, 0)
        try:
            pread_cached(fd, size, 0)
        except WouldWait as exc:
            pytest.skip(f"no read without waiting on {path.parent}: {exc}")
    finally:
        os.close(fd)
