"""One bound on all fetch-response memory across every leader connection (KIP-81).

Rules:
- A fetch response's bytes are reserved before its body is read from the socket;
  while the pool cannot hold it, that socket is simply not read (TCP backpressure
  reaches the leader). Metadata, ApiVersions and ListOffsets use other
  connections and never wait here: the control plane is never starved.
- The bound is hard: `used` never exceeds `capacity`. A single response larger
  than the whole pool can never be held; it is refused (the caller treats it as a
  failed request), not let through.
- Waiters are served first come, first served, so one busy leader cannot starve
  the others of memory.
- Memory goes back as soon as the response's data is on disk (the caller
  releases its reservation after appending).

`PoolAccount` is the sans-I/O bookkeeping; `MemoryPool` adds asyncio waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from replicad.errors import PoolTooSmallError


@dataclass(slots=True)
class PoolAccount:
    capacity: int
    used: int = 0
    peak: int = 0
    reservations: int = 0
    waits: int = 0

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
        self.peak = max(self.peak, self.used)

    def give_back(self, size: int) -> None:
        if size > self.used:
            raise AssertionError(f"releasing {size} bytes with only {self.used} in use")
        self.used -= size


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.account = PoolAccount(capacity)
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def reserve(self, size: int) -> Callable[[], None]:
        """Wait until `size` bytes fit, take them, and return the one-shot release."""
        account = self.account
        if size > account.capacity:
            account.take(size)  # raises PoolTooSmallError with the figures
        if self._waiters or not account.can_hold(size):
            account.waits += 1
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((size, future))
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():
                    # Granted while we were being cancelled: hand the bytes back.
                    account.give_back(size)
                    self._wake()
                else:
                    self._waiters = deque(w for w in self._waiters if w[1] is not future)
                    self._wake()
                raise
        else:
            account.take(size)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                account.give_back(size)
                self._wake()

        return release

    def _wake(self) -> None:
        # First come, first served: stop at the first waiter that does not fit.
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if not self.account.can_hold(size):
                return
            self._waiters.popleft()
            self.account.take(size)
            future.set_result(None)

    def snapshot(self) -> dict[str, int]:
        a = self.account
        return {
            "capacity": a.capacity,
            "used": a.used,
            "peak": a.peak,
            "reservations": a.reservations,
            "waits": a.waits,
            "waiting": len(self._waiters),
        }
