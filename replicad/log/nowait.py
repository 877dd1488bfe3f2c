"""Reads that do not wait on the disk: what serve's event loop reads from the log.

Rules:
- Inside `not_waiting()` (a block of one thread that awaits nothing: serve's event loop),
  `pread` reads with preadv2's RWF_NOWAIT: bytes in the page cache are read as os.pread
  reads them, and a read whose bytes are not all there raises `WouldWait` instead of
  waiting on the disk. The log's reads of batch headers (segment.py, handles.py) go
  through `pread`, so a partition's read (PartitionLog.read) does not wait either.
- A short read is one that would wait (RWF_NOWAIT stops where the cached bytes do): the
  caller reads again where waiting is allowed (a worker thread), and a file that did end
  there is found out as any read finds it.
- A file system that does not take RWF_NOWAIT (tmpfs answers EOPNOTSUPP), or a platform
  without it, raises WouldWait as well: nothing says that its read would not wait, so the
  caller reads on a worker thread, as every read did before this rule.
- A segment whose indexes are not in memory yet (the first read after a start) would wait:
  loading them reads their files (partition.py asks `waiting_allowed`).
- `all_cached` tells (cachestat, Linux 6.5) whether a range the kernel is to send
  (sendfile, which waits on the disk even for a non-blocking socket) is all in the page
  cache; where it cannot tell, it is not. `read_into_cache` reads one in (a worker thread).
- Outside the block `pread` is os.pread, `preadv` os.preadv: the follower, verify and the
  worker threads read as they always did. The block is the thread's own (threading.local),
  never inherited.
- WouldWait is not an OSError: no `except OSError` that answers KAFKA_STORAGE_ERROR (a
  failing disk) may take a read that only would have waited for one.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType

# preadv2's flag (Linux 4.14 for buffered reads); 0 where the platform has none.
RWF_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)


class WouldWait(Exception):
    """A read inside `not_waiting()` found bytes that are not in the page cache, or
    (`cannot_tell`) could not ask: no RWF_NOWAIT here, or the file system refuses it."""

    def __init__(self, why: str, *, cannot_tell: bool = False) -> None:
        super().__init__(why)
        self.cannot_tell = cannot_tell


class _Mode(threading.local):
    on = False


_MODE = _Mode()


class _NotWaiting:
    """The block of `not_waiting()` (a class, not a generator: one a Fetch)."""

    __slots__ = ()

    def __enter__(self) -> None:
        _MODE.on = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _MODE.on = False


_NOT_WAITING = _NotWaiting()


def not_waiting() -> _NotWaiting:
    """`with not_waiting():` the log's reads on this thread raise WouldWait rather than
    wait on the disk (see the module rules). Blocks do not nest."""
    return _NOT_WAITING


def waiting_allowed() -> bool:
    """False inside a `not_waiting()` block of this thread."""
    return not _MODE.on


def pread(fd: int, size: int, position: int) -> bytes:
    """os.pread, or inside `not_waiting()` the bytes if all are in the page cache, else
    WouldWait (see the module rules)."""
    if not _MODE.on:
        return os.pread(fd, size, position)
    return pread_cached(fd, size, position)


def preadv(fd: int, into: memoryview, position: int) -> int:
    """os.preadv into `into`, or inside `not_waiting()` all of `into` if all is in the page
    cache, else WouldWait (see the module rules: a short read would wait)."""
    if not _MODE.on:
        return os.preadv(fd, [into], position)
    return _preadv_cached(fd, into, position)


def pread_cached(fd: int, size: int, position: int) -> bytes:
    """`size` bytes at `position` if all are in the page cache; else WouldWait."""
    buffer = bytearray(size)
    _preadv_cached(fd, memoryview(buffer), position)
    return bytes(buffer)  # one copy of a few bytes (headers) to a small region's 64 KiB


def _preadv_cached(fd: int, into: memoryview, position: int) -> int:
    """All of `into` from `position`, read without waiting; else WouldWait."""
    if not RWF_NOWAIT:
        raise WouldWait("no RWF_NOWAIT on this platform", cannot_tell=True)
    try:
        got = os.preadv(fd, [into], position, RWF_NOWAIT)
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            raise WouldWait("not in the page cache") from None
        if exc.errno == errno.EOPNOTSUPP:
            raise WouldWait("RWF_NOWAIT refused by the file system", cannot_tell=True) from None
        raise
    if got < len(into):
        raise WouldWait(f"{got} of {len(into)} bytes cached")
    return got


# -- regions the kernel sends (sendfile) -----------------------------------------------------

# cachestat(2) (Linux 6.5): how many of a file range's pages are in the page cache, in one
# call. The number is the same on every architecture (the unified syscall table).
_CACHESTAT = 451
PAGE_BYTES: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def all_cached(fd: int, position: int, size: int) -> bool:
    """Whether every page of `size` bytes at `position` is in the page cache (cachestat),
    so that sendfile on the loop does not wait on the disk. False where that cannot be
    told (no cachestat: an older kernel, another platform): the caller reads the range in
    first (`read_into_cache`, on a worker thread), as for any read that would wait. A
    page evicted between this answer and the send is read by the send: the check is as
    good as the moment it is made, as a read without waiting is."""
    if size <= 0:
        return True
    cachestat = _cachestat()
    if cachestat is None:
        return False
    pages = (position + size + PAGE_BYTES - 1) // PAGE_BYTES - position // PAGE_BYTES
    cached = cachestat(fd, position, size)
    return cached is not None and cached >= pages


def can_tell_cached() -> bool:
    """Whether `all_cached` can ask the kernel (cachestat) here, rather than answering False
    because it cannot tell."""
    return _cachestat() is not None


def read_into_cache(fd: int, position: int, size: int) -> int:
    """On a worker thread: `size` bytes at `position` read into the page cache (not into
    this process: sendfile into /dev/null, else preadv into a scratch buffer); the bytes
    read, fewer where the file ends."""
    got = 0
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        null = -1
    try:
        while null >= 0 and got < size:
            n = os.sendfile(null, fd, position + got, size - got)
            if n <= 0:
                return got
            got += n
    except OSError:
        pass  # a /dev/null that takes no sendfile: read below
    finally:
        if null >= 0:
            os.close(null)
    scratch = memoryview(bytearray(min(size - got, 256 * 1024) or 1))
    while got < size:
        n = os.preadv(fd, [scratch[: size - got]], position + got)
        if n <= 0:
            break
        got += n
    return got


@functools.cache
def _cachestat() -> Callable[[int, int, int], int | None] | None:
    """cachestat(fd, position, size) -> the range's pages in the page cache (None: the call
    failed), through libc's syscall(); None where the kernel has no cachestat. ctypes is
    imported on first use (serve's first large region), never by a follower."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long

    class Range(ctypes.Structure):
        _fields_ = (("off", ctypes.c_uint64), ("len", ctypes.c_uint64))

    class Stat(ctypes.Structure):
        _fields_ = tuple(
            (name, ctypes.c_uint64)
            for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recent")
        )

    class Arguments(threading.local):
        """A thread's own range and answer, made once: a Fetch asks once a partition, and
        making two ctypes structures a call was most of a call's cost."""

        def __init__(self) -> None:
            self.range = Range()
            self.stat = Stat()
            self.range_ref = ctypes.byref(self.range)
            self.stat_ref = ctypes.byref(self.stat)

    arguments = Arguments()

    def cachestat(fd: int, position: int, size: int) -> int | None:
        mine = arguments
        mine.range.off = position
        mine.range.len = size
        if call(_CACHESTAT, fd, mine.range_ref, mine.stat_ref, 0) < 0:
            return None
        return int(mine.stat.nr_cache)

    probe = os.open(os.devnull, os.O_RDONLY)
    try:
        works = cachestat(probe, 0, 1) is not None  # ENOSYS before Linux 6.5
    finally:
        os.close(probe)
    return cachestat if works else None
