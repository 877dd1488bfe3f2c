"""The request memory pool of `replicad serve` (Kafka's `queued.max.request.bytes`, KIP-72):
the shell of the one pool whose rules are replicad/pool/rules.py's (the follower's
fetch-response pool, KIP-81, is its other shell).

Rules:
- A frame larger than `SMALL_FRAME_BYTES` takes its declared size from the pool when its
  size prefix is read, before a byte of it is held, and gives it back once it has been
  answered (or its connection closed). Smaller frames do not wait on the pool: each
  connection's stream buffer already bounds what they hold, and they are what keeps
  ordinary clients served while large frames wait.
- When the pool cannot grant a frame, the connection waits, reading nothing more
  (back-pressure: TCP tells the client to stop) -- never allocating past the pool.
  Waiters are served first come, first served, so a stream of small grants cannot starve
  a large one; a frame larger than the whole pool (config keeps the pool >= the largest
  frame allowed, so only a guard) is granted alone once nothing else is held, and counted
  at its size (pool/rules.py's oversize rule).
- A waiter given up (its deadline passed, its connection closed) takes nothing with it.
- Memory held by clients is then at most the pool (or one frame larger than it), plus each
  connection's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.pool.rules import BytePool
from replicad.pool.waiting import WaitingPool

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
        self.account = BytePool(capacity)
        self._waiting = WaitingPool(self.account, lambda grant: grant.charged, self.give_back)

    def needs(self, size: int) -> int:
        """What a frame of `size` bytes takes from the pool (0 for a small one)."""
        return 0 if size <= SMALL_FRAME_BYTES else size

    async def take(self, size: int) -> int:
        """Take what a frame of `size` needs, waiting for room; returns what was taken
        (give it back with `give_back`)."""
        need = self.needs(size)
        return await self._waiting.take(need) if need else 0

    async def take_exactly(self, size: int) -> int:
        """Take `size` bytes whatever their size, waiting for room (memory a request holds
        besides its frame: the records of a read of the archive's bucket, remote_fetch.py)."""
        return await self._waiting.take(size) if size > 0 else 0

    def give_back(self, taken: int) -> None:
        if taken:
            self._waiting.give_back(taken)

    def stats(self) -> PoolStats:
        a = self.account
        return PoolStats(a.capacity, a.used, a.waiting, a.waits)
