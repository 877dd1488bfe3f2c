"""The asyncio side of the one memory pool: requests the rules (rules.py:BytePool) queue
wait here, first come, first served, and each is handed what its shell lends for its grant.

Rules:
- `take` asks the rules; a grant given at once is lent at once, else the caller waits
  until a `give_back` (or a waiter given up) grants it. Nothing here decides who is next.
- A waiter given up (cancelled: its connection closed, its deadline passed) takes nothing:
  it is withdrawn from the rules' queue, and those behind it may be granted at once. One
  granted just as it was given up hands back what was lent to it; one whose future was
  cancelled before its grant came passes the grant straight back, so the next waiters get
  their turn without anyone waiting on a grant nobody holds.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from replicad.pool.rules import BytePool, Grant

T = TypeVar("T")


class WaitingPool(Generic[T]):
    def __init__(
        self, rules: BytePool, lend: Callable[[Grant], T], unlend: Callable[[T], None]
    ) -> None:
        """`lend` makes what a grant is given (a buffer, a byte count); `unlend` gives it back."""
        self.rules = rules
        self._lend = lend
        self._unlend = unlend
        self._waiters: dict[int, asyncio.Future[T]] = {}

    async def take(self, size: int) -> T:
        """Wait until `size` bytes are granted, and return what was lent for them."""
        asked = self.rules.ask(size)
        if asked.grant is not None:
            return self._lend(asked.grant)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiters[asked.ticket] = future
        try:
            return await future
        except BaseException:
            if future.done() and not future.cancelled():
                self._unlend(future.result())  # granted just as it was given up
            else:
                self._waiters.pop(asked.ticket, None)
                self._hand_out(self.rules.withdraw(asked.ticket))
            raise

    def give_back(self, charged: int) -> None:
        """A grant's `charged` bytes come back; the waiters that now fit are lent theirs."""
        self._hand_out(self.rules.give_back(charged))

    def _hand_out(self, grants: list[Grant]) -> None:
        pending = deque(grants)
        while pending:
            grant = pending.popleft()
            future = self._waiters.pop(grant.ticket)
            if future.done():
                # Cancelled, its task not yet run to withdraw: nothing was lent, so the grant
                # goes straight back, and may let the next waiters in.
                pending.extend(self.rules.give_back(grant.charged))
                continue
            future.set_result(self._lend(grant))
