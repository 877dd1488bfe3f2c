"""The request memory pool of `replicad serve` (Kafka's `queued.max.request.bytes`, KIP-72):
the shell of the one pool whose rules are replicad/byte_pool.py's (the follower's
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
  at its size (byte_pool.py's oversize rule).
- A waiter given up (its deadline passed, its connection closed) takes nothing with it.
- Memory held by clients is then at most the pool (or one frame larger than it), plus each
  connection's buffers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from replicad.byte_pool import BytePool, Grant

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
        self._waiters: dict[int, asyncio.Future[None]] = {}

    @property
    def capacity(self) -> int:
        return self.account.capacity

    @property
    def used(self) -> int:
        return self.account.used

    @property
    def waits_total(self) -> int:
        return self.account.waits

    def needs(self, size: int) -> int:
        """What a frame of `size` bytes takes from the pool (0 for a small one)."""
        return 0 if size <= SMALL_FRAME_BYTES else size

    async def take(self, size: int) -> int:
        """Take what a frame of `size` needs, waiting for room; returns what was taken
        (give it back with `give_back`)."""
        need = self.needs(size)
        if need == 0:
            return 0
        asked = self.account.ask(need)
        if asked.grant is not None:
            return need
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[asked.ticket] = waiter
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give_back(need)  # granted just as it was given up
            else:
                self._waiters.pop(asked.ticket, None)
                self._hand_out(self.account.withdraw(asked.ticket))
            raise
        return need

    def give_back(self, taken: int) -> None:
        if taken:
            self._hand_out(self.account.give_back(taken))

    def _hand_out(self, grants: list[Grant]) -> None:
        pending = deque(grants)
        while pending:
            grant = pending.popleft()
            waiter = self._waiters.pop(grant.ticket)
            if waiter.done():  # cancelled; its task has not withdrawn yet: nothing held
                pending.extend(self.account.give_back(grant.charged))
                continue
            waiter.set_result(None)

    def stats(self) -> PoolStats:
        return PoolStats(self.capacity, self.used, self.account.waiting, self.waits_total)
