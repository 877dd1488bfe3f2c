"""Open file descriptors of the log store, bounded: an LRU cache shared by one LogManager.

A descriptor per segment file (`.log`, `.index`, `.timeindex`) is 30,000+ descriptors at
10,000 partitions, past a usual hard RLIMIT_NOFILE. So a segment file is a `FileHandle` (a
path) that gets a descriptor from `FileHandles` for the length of one operation (a system
call, or a short sequence such as an mmap'd scan); the cache keeps up to `max_open` of
them open for the next operation.

Rules (`OpenFileLru` decides, `FileHandles` does the system calls):
- At most `max_open` descriptors are open, except while pinned: a handle in use by a running
  sequence of calls is pinned (a count) and never closed. When every open handle is pinned,
  an open goes over the cap by one, and the excess is closed as soon as the pins allow. A
  sequence here pins one handle at a time, so the excess is at most the number of threads
  inside the log store at once, plus one.
- Eviction order: the least recently used clean handle first, then the least recently used
  dirty one ("dirty" = written since its last fsync). The active segment of a busy partition
  is dirty and recent, so it is the last thing closed, and appends to it do not reopen it.
- A dirty handle is evicted without fsync. Dirty pages belong to the file (the inode), not to
  the descriptor: close(2) loses nothing, the handle stays dirty, and the next sync opens the
  file again and fsyncs it (Linux reports a writeback error to a later opener that nobody
  has seen yet). Durability is promised only by a sync (the recovery point, checkpoints),
  and a sync covers every dirty handle, open or not. Evicting clean handles first keeps that
  reopen rare. Why not fsync at eviction: with more busy partitions than `max_open`, every
  append would evict a dirty handle -- one fsync per append.
- A sync does not go through the LRU: it fsyncs a duplicate of the open descriptor, or one
  opened just for it, then closes that. A checkpoint that syncs 10,000 partitions thus
  leaves the hot handles open.
- Writes are counted per handle (a generation, bumped when the write has returned); a sync
  records the generation it started from, so a write racing a sync on another thread keeps
  the handle dirty.
- A handle's first open may create (and truncate) the file; reopening does not create: a
  segment file that vanished under us is an error, not a new empty file.
- EMFILE/ENFILE on open (the process limit is below `max_open` plus everything else open):
  close the next least recently used unpinned handle and try again, until none is left.
- Thread use: one lock guards the cache. A single system call on a handle (pread, pwrite,
  ftruncate, fstat: an append's write is one) runs with the lock held, so no pin is needed;
  a sequence (a scan, an mmap) pins the handle and runs without the lock.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from replicad.errors import LogError
from replicad.log import nowait

log = structlog.get_logger("replicad.log.handles")

K = TypeVar("K", bound=Hashable)
# A file's path as callers hold it; FileHandle keeps the str.
StrPath = str | os.PathLike[str]

# Reopening never creates: see the module rules.
REOPEN_FLAGS = os.O_RDWR
CREATE_FLAGS = os.O_RDWR | os.O_CREAT
CREATE_EMPTY_FLAGS = os.O_RDWR | os.O_CREAT | os.O_TRUNC
FILE_MODE = 0o644
# A sync of a handle that is not open needs the inode, not write access.
SYNC_FLAGS = os.O_RDONLY
# A FileHandle's flags once it is closed for good (no open flags are negative).
CLOSED_FOR_GOOD = -1
_TOO_MANY_OPEN = (errno.EMFILE, errno.ENFILE)


# -- the decisions (sans-I/O) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evictions(Generic[K]):
    """Open keys to close now, least recently used first."""

    victims: tuple[K, ...]


NO_EVICTIONS: Evictions[Any] = Evictions(())


class OpenFileLru(Generic[K]):
    """Which keys (open files) stay open and which to close, by the module's rules.

    Keys in, keys out: no descriptors, no clock. Every key it holds is open and is in exactly
    one of two recency orders, clean or dirty; a key may be pinned (a count).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"at least one open file is needed, not {capacity}")
        self.capacity = capacity
        self._clean: OrderedDict[K, None] = OrderedDict()
        self._dirty: OrderedDict[K, None] = OrderedDict()
        self._pins: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._clean) + len(self._dirty)

    def __contains__(self, key: object) -> bool:
        return key in self._clean or key in self._dirty

    def is_dirty(self, key: K) -> bool:
        return key in self._dirty

    def pins(self, key: K) -> int:
        return self._pins.get(key, 0)

    @property
    def pinned(self) -> int:
        """How many keys are pinned now."""
        return len(self._pins)

    def order(self) -> tuple[K, ...]:
        """The eviction order if nothing were pinned: clean keys, then dirty, LRU first."""
        return (*self._clean, *self._dirty)

    def touch(self, key: K) -> None:
        """An open key is used: it becomes the most recent of its kind."""
        if key in self._dirty:
            self._dirty.move_to_end(key)
        else:
            self._clean.move_to_end(key)

    def admit(self, key: K, *, dirty: bool) -> Evictions[K]:
        """`key` is about to be opened, as the most recent; which open keys to close first."""
        if key in self:
            raise ValueError(f"{key!r} is already open")
        # Everything open may be pinned: then over the cap until `trim` brings it back.
        victims = self._evict_down_to(self.capacity - 1)
        (self._dirty if dirty else self._clean)[key] = None
        return Evictions(victims) if victims else NO_EVICTIONS

    def pin(self, key: K) -> None:
        """`key` is in use and must stay open until `release`."""
        if key not in self:
            raise ValueError(f"{key!r} is not open")
        pins = self._pins
        pins[key] = pins.get(key, 0) + 1

    def release(self, key: K) -> Evictions[K]:
        """One use of `key` ended; which keys to close if pins had pushed past the cap."""
        pins = self._pins
        left = pins[key] - 1
        if left:
            pins[key] = left
            return NO_EVICTIONS
        del pins[key]
        return self.trim()

    def trim(self) -> Evictions[K]:
        """Which keys to close to be within the cap again (after pins pushed past it)."""
        if len(self._clean) + len(self._dirty) <= self.capacity:
            return NO_EVICTIONS
        return Evictions(self._evict_down_to(self.capacity))

    def _evict_down_to(self, size: int) -> tuple[K, ...]:
        victims: list[K] = []
        while len(self) > size and (victim := self.evict_one()) is not None:
            victims.append(victim)
        return tuple(victims)

    def evict_one(self, keep: K | None = None) -> K | None:
        """Remove and return the key to close next: LRU unpinned clean, else LRU unpinned dirty
        (never `keep`: the one being opened when the process ran out of descriptors)."""
        for order in (self._clean, self._dirty):
            for key in order:
                if key not in self._pins and key != keep:
                    del order[key]
                    return key
        return None

    def mark_dirty(self, key: K) -> None:
        """An open key was written: it moves to the dirty order, as its most recent."""
        if key in self._clean:
            del self._clean[key]
        elif key not in self._dirty:
            raise ValueError(f"{key!r} is not open")
        self._dirty[key] = None
        self._dirty.move_to_end(key)

    def mark_clean(self, key: K) -> None:
        """An open key was synced: it moves to the clean order, as its most recent (it was
        written no longer ago than the sync interval)."""
        if key in self._dirty:
            del self._dirty[key]
            self._clean[key] = None

    def remove(self, key: K) -> None:
        """`key` is closed for good (or its open failed): forget it, pins included."""
        self._clean.pop(key, None)
        self._dirty.pop(key, None)
        self._pins.pop(key, None)


# -- the descriptors ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandleStats:
    open: int
    max_open: int
    # The most descriptors the cache ever had open at once (pinned ones included).
    peak_open: int
    opens: int
    evictions: int
    # Evictions of handles written since their last sync (their sync reopens the file).
    dirty_evictions: int
    # Evictions forced by EMFILE/ENFILE: the process limit is too low for max_open.
    pressure_evictions: int


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """A descriptor to fsync (then close) and the write generation that fsync covers."""

    fd: int
    generation: int


class FileHandle:
    """One file of a segment; its descriptor, when it has one, belongs to `FileHandles`."""

    # One per segment file of every partition, tens of thousands at once: the path is
    # kept as its directory's str (the partition's, shared by its handles: os.fspath of its
    # directory's Path is the str that Path keeps) and the file's name (interned: every
    # partition's first segment has the same three), joined at each open; a Path is made
    # when first asked for, then kept (serve asks on every read of a segment: a Path each
    # time was a fifth of a 200-partition Fetch's reads; the follower hardly ever asks).
    # Three full path strs a partition were about 330 bytes. Closed for good is a value of
    # `_flags`, not a slot of its own: eight slots are 96 bytes, nine 112 (pymalloc's sizes).
    __slots__ = (
        "_cache",
        "_directory",
        "_flags",
        "_name",
        "_path_object",
        "fd",
        "synced",
        "written",
    )

    def __init__(self, cache: FileHandles, directory: StrPath, name: str, flags: int) -> None:
        self._cache = cache
        self._directory = os.fspath(directory)
        self._name = sys.intern(name)
        self._path_object: Path | None = None
        # For the next open; REOPEN_FLAGS once it has been opened; CLOSED_FOR_GOOD after
        # `close`.
        self._flags = flags
        self.fd = -1
        self.written = 0  # write generation
        self.synced = 0  # the generation the last completed fsync covered

    def __repr__(self) -> str:
        return f"FileHandle({self._path!r}, fd={self.fd})"

    @property
    def closed(self) -> bool:
        """Closed for good: no further use."""
        return self._flags == CLOSED_FOR_GOOD

    @property
    def _path(self) -> str:
        return os.path.join(self._directory, self._name)

    @property
    def path(self) -> Path:
        if self._path_object is None:
            self._path_object = Path(self._path)
        return self._path_object

    @property
    def dirty(self) -> bool:
        return self.written > self.synced

    def pinned(self, *, write: bool = False) -> _Pinned:
        """`with handle.pinned() as fd:` the open descriptor, kept open until the block ends
        (for a sequence of calls); `write`: the block writes through it."""
        return _Pinned(self, write)

    # One system call each, made under the cache's lock: nothing can close the descriptor
    # meanwhile, and no pin is needed (the hot path: an append is one pwrite).

    def pread(self, size: int, position: int) -> bytes:
        cache = self._cache
        with cache._lock:
            fd = cache._ready(self)
            try:
                return nowait.pread(fd, size, position)  # see nowait.py: serve's loop
            finally:
                cache._trim()

    def write_all(self, data: bytes | bytearray | memoryview, position: int) -> None:
        cache = self._cache
        with cache._lock:
            fd = cache._ready(self)
            try:
                written = os.pwrite(fd, data, position)
                if written < len(data):
                    view = memoryview(data)[written:]
                    while view:
                        position += written
                        written = os.pwrite(fd, view, position)
                        view = view[written:]
            finally:
                cache._wrote(self)
                cache._trim()

    def truncate(self, size: int) -> None:
        cache = self._cache
        with cache._lock:
            fd = cache._ready(self)
            try:
                os.ftruncate(fd, size)
            finally:
                cache._wrote(self)
                cache._trim()

    def size(self) -> int:
        cache = self._cache
        with cache._lock:
            fd = cache._ready(self)
            try:
                return os.fstat(fd).st_size
            finally:
                cache._trim()

    def sync(self) -> None:
        """fsync whatever was written through this handle since its last sync."""
        self._cache.sync(self)

    def mark_unsynced(self) -> None:
        """Treat the file as written and not synced (found on disk after an unclean stop)."""
        self._cache.mark_unsynced(self)

    def close(self) -> None:
        """Close for good (the segment is closed or deleted); unsynced writes stay unsynced."""
        self._cache.discard(self)


class _Pinned:
    """A handle's descriptor for the length of a `with` block (cheaper than a generator)."""

    __slots__ = ("_handle", "_write")

    def __init__(self, handle: FileHandle, write: bool) -> None:
        self._handle = handle
        self._write = write

    def __enter__(self) -> int:
        return self._handle._cache.acquire(self._handle)

    def __exit__(self, *exc: object) -> None:
        self._handle._cache.release(self._handle, wrote=self._write)


class FileHandles:
    """The open descriptors of one log store, at most `max_open` (see module rules)."""

    def __init__(self, max_open: int) -> None:
        self._lru: OpenFileLru[FileHandle] = OpenFileLru(max_open)
        self._lock = threading.Lock()
        self._peak = 0
        self._opens = 0
        self._evictions = 0
        self._dirty_evictions = 0
        self._pressure_evictions = 0

    @property
    def max_open(self) -> int:
        return self._lru.capacity

    def handle(self, directory: StrPath, name: str, *, create: bool = False) -> FileHandle:
        """A handle on the file `name` in `directory`, opened on first use (creating the
        file if `create`)."""
        return FileHandle(self, directory, name, CREATE_FLAGS if create else REOPEN_FLAGS)

    def create(self, directory: StrPath, name: str) -> FileHandle:
        """A handle on a new empty file `name` in `directory` (an existing one is
        truncated), now."""
        handle = FileHandle(self, directory, name, CREATE_EMPTY_FLAGS)
        with self._lock:
            self._ready(handle)
            self._wrote(handle)
            self._trim()
        return handle

    def stats(self) -> HandleStats:
        with self._lock:
            return HandleStats(
                len(self._lru),
                self._lru.capacity,
                self._peak,
                self._opens,
                self._evictions,
                self._dirty_evictions,
                self._pressure_evictions,
            )

    # -- use -------------------------------------------------------------------------------

    def acquire(self, handle: FileHandle) -> int:
        """The handle's descriptor, opened if need be, pinned until `release`."""
        with self._lock:
            fd = self._ready(handle)
            self._lru.pin(handle)
            return fd

    def release(self, handle: FileHandle, *, wrote: bool = False) -> None:
        with self._lock:
            if wrote:
                self._wrote(handle)
            for victim in self._lru.release(handle).victims:
                self._close(victim)
            if handle.closed and not self._lru.pins(handle):
                self._forget(handle)

    def _ready(self, handle: FileHandle) -> int:
        """The handle's descriptor, the most recently used, opened if need be (lock held)."""
        if handle.closed:
            raise LogError(f"{handle._path} was used after its segment was closed")
        if handle.fd >= 0:
            self._lru.touch(handle)
            return handle.fd
        for victim in self._lru.admit(handle, dirty=handle.dirty).victims:
            self._close(victim)
        try:
            handle.fd = self._open(handle._path, handle._flags, keep=handle)
        except BaseException:
            self._lru.remove(handle)
            raise
        handle._flags = REOPEN_FLAGS
        self._opens += 1
        self._peak = max(self._peak, len(self._lru))
        return handle.fd

    def _wrote(self, handle: FileHandle) -> None:
        """A write through `handle` returned (or failed): one generation more (lock held).

        Counted after the call, so a sync's generation never covers a write in flight."""
        if handle.written == handle.synced:
            self._lru.mark_dirty(handle)
        handle.written += 1

    def _trim(self) -> None:
        """Back within the cap, if a use while others were pinned went past it (lock held)."""
        for victim in self._lru.trim().victims:
            self._close(victim)

    def _open(self, path: str, flags: int, *, keep: FileHandle | None = None) -> int:
        """os.open, closing least recently used handles (never `keep`) while the process is
        out of descriptors (lock held)."""
        while True:
            try:
                return os.open(path, flags, FILE_MODE)
            except OSError as exc:
                if exc.errno not in _TOO_MANY_OPEN:
                    raise
                victim = self._lru.evict_one(keep=keep)
                if victim is None:
                    raise
                self._pressure_evictions += 1
                if self._pressure_evictions == 1:
                    log.warning(
                        "open file limit reached below log.max_open_files; closing more",
                        max_open_files=self._lru.capacity,
                        open=len(self._lru),
                    )
                self._close(victim)

    def _close(self, victim: FileHandle) -> None:
        """Close an evicted handle's descriptor (it may be opened again)."""
        self._evictions += 1
        if victim.dirty:
            self._dirty_evictions += 1
        fd, victim.fd = victim.fd, -1
        os.close(fd)

    # -- durability ------------------------------------------------------------------------

    def sync_ticket(self, handle: FileHandle) -> SyncTicket | None:
        """A descriptor for fsyncing `handle` outside any lock; None when there is nothing to
        sync (clean, or closed for good). The caller fsyncs, closes, then calls `synced`."""
        with self._lock:
            if handle.closed or not handle.dirty:
                return None
            generation = handle.written
            if handle.fd >= 0:
                return SyncTicket(os.dup(handle.fd), generation)
            # Not entered into the LRU: see the module rules.
            try:
                return SyncTicket(self._open(handle._path, SYNC_FLAGS), generation)
            except FileNotFoundError:
                if handle._flags == REOPEN_FLAGS:
                    raise  # it was open once: someone removed it under us
                # Never opened and not there (an index to be created): nothing to sync.
                handle.synced = generation
                return None

    def synced(self, handle: FileHandle, generation: int) -> None:
        """An fsync that started at write generation `generation` completed."""
        with self._lock:
            handle.synced = max(handle.synced, generation)
            if not handle.dirty and handle in self._lru:
                self._lru.mark_clean(handle)

    def sync(self, handle: FileHandle) -> None:
        ticket = self.sync_ticket(handle)
        if ticket is None:
            return
        try:
            os.fsync(ticket.fd)
        finally:
            os.close(ticket.fd)
        self.synced(handle, ticket.generation)

    def mark_unsynced(self, handle: FileHandle) -> None:
        with self._lock:
            handle.written += 1
            if handle in self._lru:
                self._lru.mark_dirty(handle)

    # -- closing ---------------------------------------------------------------------------

    def discard(self, handle: FileHandle) -> None:
        """Close `handle` for good; a pinned one is closed at its last release."""
        with self._lock:
            handle._flags = CLOSED_FOR_GOOD
            if not self._lru.pins(handle):
                self._forget(handle)

    def _forget(self, handle: FileHandle) -> None:
        self._lru.remove(handle)
        if handle.fd >= 0:
            fd, handle.fd = handle.fd, -1
            os.close(fd)
