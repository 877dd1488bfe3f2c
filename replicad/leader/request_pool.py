"""The request memory pool of `replicad serve` (Kafka's `queued.max.request.bytes`, KIP-72):
the leader-side twin of the follower's fetch-response pool (KIP-81, follower/memory_pool.py).

Rules:
- A frame larger than `SMALL_FRAME_BYTES` takes its declared size from the pool when its
  size prefix is read, before a byte of it is held, and gives it back once it has been
  answered (or its connection closed). Smaller frames do not wait on the pool: each
  connection's stream buffer already bounds what they hold, and they are what keeps
  ordinary clients served while large frames wait.
- When the pool cannot grant a frame, the connection waits, reading nothing more
  (back-pressure: TCP tells the client to stop) -- never allocating past the pool.
  Waiters are served first come, first served, so a stream of small grants cannot starve
  a large one; a frame larger than the whole pool waits until the pool is empty and then
  takes all of it (config keeps the pool >= the largest frame allowed; this is a guard).
- A waiter given up (its deadline passed, its connection closed) takes nothing with it.
- Memory held by clients is then at most the pool, plus each connection's buffers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass

# asyncio's StreamReader limit: frames up to it bypass the pool (see the rules).
SMALL_FRAME_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class PoolStats:
    capacity: int
    used: int
    waiting: int
    waits_total: int


class RequestMemoryPool:
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, not {capacity}")
        self.capacity = capacity
        self.used = 0
        self.waits_total = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def needs(self, size: int) -> int:
        """What a frame of `size` bytes takes from the pool (0 for a small one)."""
        return 0 if size <= SMALL_FRAME_BYTES else min(size, self.capacity)

    async def take(self, size: int) -> int:
        """Take what a frame of `size` needs, waiting for room; returns what was taken
        (give it back with `give_back`)."""
        need = self.needs(size)
        if need == 0:
            return 0
        if not self._waiters and self.used + need <= self.capacity:
            self.used += need
            return need
        self.waits_total += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (need, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give_back(need)  # granted just as it was given up
            else:
                with contextlib.suppress(ValueError):  # _grant may have dropped it
                    self._waiters.remove(entry)
                self._grant()
            raise
        return need

    def give_back(self, taken: int) -> None:
        if taken:
            self.used -= taken
            self._grant()

    def _grant(self) -> None:
        while self._waiters:
            need, waiter = self._waiters[0]
            if waiter.done():  # cancelled; its task has not cleaned up yet
                self._waiters.popleft()
                continue
            if self.used + need > self.capacity:
                return
            self._waiters.popleft()
            self.used += need
            waiter.set_result(None)

    def stats(self) -> PoolStats:
        return PoolStats(self.capacity, self.used, len(self._waiters), self.waits_total)
