"""One bound on all fetch-response memory across every leader connection (KIP-81).

Rules:
- A fetch response's bytes are reserved before its body is read from the socket;
  while the pool cannot hold it, that socket is simply not read (TCP backpressure
  reaches the leader). Metadata, ApiVersions and ListOffsets use other
  connections and never wait here: the control plane is never starved.
- The pool owns the buffers. A reservation is a `Lease` of a buffer of at least the
  frame's size; the connection reads the frame straight into it (recv_into) and the
  buffer goes back to the pool's idle list when the lease is released, to be lent
  again: no allocation, page faults or unmapping per frame once the pool is warm.
- The bound counts real bytes: every buffer the pool owns, lent or idle, is counted
  at its full size (`used` + `idle` <= `capacity`). When a reservation does not fit,
  idle buffers are freed first (largest first); only then does it wait.
- The bound is hard, and so is the oversize rule: a single response larger than the
  whole pool can never be held; it is refused (the caller treats it as a failed
  request), not let through. (Kafka's own pool may lend one oversized buffer; here
  `fetch.buffer_memory` is what sizes the daemon's memory, and the fix -- raising it
  above the source's largest batch -- is named in the error.)
- Buffers come in size classes (a multiple of an eighth of the size's power of two,
  pages at least), so a frame a little larger than the last one reuses its buffer or a
  slightly larger one; when the class does not fit the bound, the frame's own size in
  whole pages is tried before waiting. An idle buffer is lent for a frame only when it
  is at most twice the frame's class, so small frames do not tie up large buffers.
- Waiters are served first come, first served, so one busy leader cannot starve
  the others of memory.
- Memory goes back as soon as the response's data is on disk (the caller
  releases its lease after appending). Views of a released buffer must no longer be
  read: the buffer is lent again.

`PoolAccount` is the sans-I/O bookkeeping; `MemoryPool` adds the buffers and asyncio
waiting.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from dataclasses import dataclass

from replicad.errors import PoolTooSmallError

PAGE = 4096
# A lent buffer is at most this many times the size class of the frame it holds.
MAX_REUSE_RATIO = 2


def size_class(size: int, capacity: int) -> int:
    """The size of the buffer lent for a frame of `size` bytes: whole pages, rounded up
    to an eighth of the size's power of two (at most 12.5% more), never above capacity."""
    step = max(PAGE, 1 << max(size.bit_length() - 4, 0))
    return min(-(-size // step) * step, max(capacity, size))


@dataclass(slots=True)
class PoolAccount:
    """Bytes lent (`used`) and held idle (`idle`); the two together stay within capacity."""

    capacity: int
    used: int = 0
    idle: int = 0
    peak: int = 0
    reservations: int = 0
    waits: int = 0
    reused: int = 0

    def can_hold(self, size: int) -> bool:
        return self.used + size <= self.capacity

    def take(self, size: int) -> None:
        if size > self.capacity:
            raise PoolTooSmallError(
                f"a fetch response of {size:,} bytes exceeds buffer_memory ({self.capacity:,})"
            )
        if not self.can_hold(size):
            raise AssertionError("take() without room: the caller must wait first")
        self.used += size
        self.reservations += 1
        self.peak = max(self.peak, self.used + self.idle)

    def give_back(self, size: int) -> None:
        if size > self.used:
            raise AssertionError(f"releasing {size} bytes with only {self.used} in use")
        self.used -= size


class Lease:
    """A pool buffer lent for one frame: `buffer` is exactly the frame's size. Calling the
    lease (or `release()`) gives the buffer back; a second call does nothing."""

    __slots__ = ("_block", "_pool", "buffer", "size")

    def __init__(self, pool: MemoryPool | None, block: bytearray, size: int) -> None:
        self._pool = pool
        self._block = block
        self.size = size
        self.buffer = memoryview(block)[:size]

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self._block)

    __call__ = release


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.account = PoolAccount(capacity)
        self._waiters: deque[tuple[int, asyncio.Future[bytearray]]] = deque()
        # Idle buffers, sorted by size (parallel lists: sizes for bisect, the buffers).
        self._idle_sizes: list[int] = []
        self._idle: list[bytearray] = []

    async def reserve(self, size: int) -> Lease:
        """Wait until a buffer for `size` bytes fits, and lend it."""
        account = self.account
        if size > account.capacity:
            account.take(size)  # raises PoolTooSmallError with the figures
        if not self._waiters:
            block = self._grant(size)
            if block is not None:
                return Lease(self, block, size)
        account.waits += 1
        future: asyncio.Future[bytearray] = asyncio.get_running_loop().create_future()
        self._waiters.append((size, future))
        try:
            block = await future
        except BaseException:
            if future.done() and not future.cancelled():
                # Granted while we were being cancelled: hand the buffer back.
                self._give_back(future.result())
            else:
                self._waiters = deque(w for w in self._waiters if w[1] is not future)
                self._wake()
            raise
        return Lease(self, block, size)

    def _grant(self, size: int) -> bytearray | None:
        """A buffer for `size` bytes taken from the bound (an idle one if one fits), or
        None when the bound has no room even with every idle buffer freed."""
        block = self._take_idle(size)
        if block is not None:
            self.account.take(len(block))
            self.account.reused += 1
            return block
        capacity = self.account.capacity
        # The size class when it fits; else only whole pages, so a tight pool holds as
        # many frames as their own sizes allow.
        for want in (size_class(size, capacity), min(-(-size // PAGE) * PAGE, capacity)):
            if self._make_room(want):
                self.account.take(want)
                return bytearray(want)
        return None

    def _take_idle(self, size: int) -> bytearray | None:
        """The smallest idle buffer that holds `size` and is not too large for it."""
        i = bisect.bisect_left(self._idle_sizes, size)
        if i == len(self._idle_sizes):
            return None
        if self._idle_sizes[i] > MAX_REUSE_RATIO * size_class(size, self.account.capacity):
            return None
        del self._idle_sizes[i]
        block = self._idle.pop(i)
        self.account.idle -= len(block)
        return block

    def _put_idle(self, block: bytearray) -> None:
        i = bisect.bisect_right(self._idle_sizes, len(block))
        self._idle_sizes.insert(i, len(block))
        self._idle.insert(i, block)
        self.account.idle += len(block)

    def _make_room(self, size: int) -> bool:
        """Free idle buffers (largest first) until `size` more bytes fit within the bound."""
        account = self.account
        while account.used + account.idle + size > account.capacity and self._idle:
            self._idle_sizes.pop()
            account.idle -= len(self._idle.pop())
        return account.used + account.idle + size <= account.capacity

    def _give_back(self, block: bytearray) -> None:
        self.account.give_back(len(block))
        self._put_idle(block)
        self._wake()

    def _wake(self) -> None:
        # First come, first served: stop at the first waiter that does not fit.
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            block = self._grant(size)
            if block is None:
                return
            self._waiters.popleft()
            future.set_result(block)

    def snapshot(self) -> dict[str, int]:
        a = self.account
        return {
            "capacity": a.capacity,
            "used": a.used,
            "idle": a.idle,
            "peak": a.peak,
            "reservations": a.reservations,
            "reused": a.reused,
            "waits": a.waits,
            "waiting": len(self._waiters),
        }
