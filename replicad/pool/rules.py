"""The one memory pool's rules: who is granted bytes of a bounded pool, and when.

Both daemons hold what peers send them to one bound each: the follower every fetch
response of every leader (`fetch.buffer_memory`, KIP-81; replicad/follower/memory_pool.py
lends the buffers), `serve` every large request frame (`serve.queued_max_request_bytes`,
Kafka's `queued.max.request.bytes`; replicad/leader/request_pool.py). This module decides
for both; they wait in waiting.py's queue (asyncio), read and hold the bytes.

Rules:
- A request asks for a size when its size prefix is read, before a byte of it is held. It
  is granted at once only when no earlier request waits and it fits; otherwise it joins
  the queue. Waiters are granted first come, first served, and the head is never passed:
  one busy peer with small frames cannot starve another's large one.
- It fits when what is granted and not given back (`used`) plus its size stays within
  `capacity`.
- The oversize rule: a request larger than the whole pool is granted alone. It waits in
  line like any other; at the head it waits until nothing at all is granted, then takes
  its whole size, and everything behind it waits until it is given back. So:
    - the pool never holds more than `capacity`, except while one oversize grant is out,
      and then that grant is the only one (never more than `max(capacity, its size)`);
    - it never deadlocks: an empty pool grants its head whatever its size;
    - it never starves: the head is never passed, and since nothing new is granted while
      it waits, what is held can only drain (each holder gives back without waiting on
      the pool again -- true of both shells: a frame is read, used and given back).
- Why this rule and not another:
    - Refusing an oversize request (the follower's old rule) turns a memory setting into an
      outage: a record batch larger than `fetch.buffer_memory` is legal Kafka (KIP-74 sends
      the first batch whole whatever the limits) and refusing it stopped every partition of
      that leader until an operator raised the setting. A frame too large to be a Kafka
      message at all is refused before it reaches the pool (replicad/protocol/codec.py, and
      serve's replicad/leader/request_limits.py), so the pool never needs to.
    - Kafka's own pool (SimpleMemoryPool, as the broker uses it) grants any request while a
      single byte is free, so every contended moment may overshoot by up to one frame, and
      it has no queue. Ours keeps the bound exact for every request that fits the pool, and
      exceeds it only for the request that could not otherwise be served, and only alone.
    - Waiting for room that can never come (a request larger than the pool, at the head of
      a strict FIFO) would deadlock; taking only `capacity` for it (serve's old rule) kept
      the count within bounds while the bytes held were not.
- A shell may lend a little more than asked (the follower rounds buffers up to size classes
  and reuses idle ones): `charge(size, room)` says how much, at least `size` and at most the
  `room` left; an oversize grant is charged exactly its size.
- A waiter given up (its connection closed, its deadline passed) is withdrawn and takes
  nothing; if it was the head, those behind it are granted at once if they fit.

Events in (`ask`, `give_back`, `withdraw`), grants out, in order. No clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from replicad.errors import LocalProtocolError


def exact(size: int, room: int) -> int:
    """The default charge: what was asked."""
    return size


@dataclass(frozen=True, slots=True)
class Grant:
    """Bytes granted to request `ticket`: `charged` (>= its `size`) taken from the pool;
    `oversize` when the request was larger than the whole pool and holds it alone."""

    ticket: int
    size: int
    charged: int
    oversize: bool


@dataclass(frozen=True, slots=True)
class Asked:
    """The answer to `ask`: granted at once, or queued (`grant` is None) until a later
    `give_back` or `withdraw` grants it."""

    ticket: int
    grant: Grant | None


class BytePool:
    def __init__(self, capacity: int, charge: Callable[[int, int], int] = exact) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, not {capacity}")
        self.capacity = capacity
        self._charge = charge
        self.used = 0
        self.grants = 0
        self.oversize_grants = 0
        self.waits = 0
        self._next_ticket = 0
        self._queue: deque[tuple[int, int]] = deque()  # (ticket, size), first come first

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def fits(self, size: int) -> bool:
        """Whether a request of `size` may be granted now, were it at the head (the rule)."""
        if size > self.capacity:
            return self.used == 0
        return self.used + size <= self.capacity

    def ask(self, size: int) -> Asked:
        if size <= 0:
            raise ValueError(f"a request asks for a positive size, not {size}")
        ticket = self._next_ticket
        self._next_ticket += 1
        if not self._queue and self.fits(size):
            return Asked(ticket, self._take(ticket, size))
        self._queue.append((ticket, size))
        self.waits += 1
        return Asked(ticket, None)

    def give_back(self, charged: int) -> list[Grant]:
        """A grant's `charged` bytes come back; the waiters that now fit, in order."""
        if not 0 < charged <= self.used:
            raise LocalProtocolError(f"giving back {charged} bytes with {self.used} granted")
        self.used -= charged
        return self._grant_waiters()

    def withdraw(self, ticket: int) -> list[Grant]:
        """A waiter given up leaves the queue; the waiters that now fit (it may have been
        the head), in order. A ticket no longer waiting is ignored."""
        self._queue = deque(w for w in self._queue if w[0] != ticket)
        return self._grant_waiters()

    def _grant_waiters(self) -> list[Grant]:
        granted = []
        while self._queue and self.fits(self._queue[0][1]):
            ticket, size = self._queue.popleft()
            granted.append(self._take(ticket, size))
        return granted

    def _take(self, ticket: int, size: int) -> Grant:
        oversize = size > self.capacity
        room = self.capacity - self.used
        charged = size if oversize else self._charge(size, room)
        if not oversize and not size <= charged <= room:
            raise LocalProtocolError(
                f"charge of {charged} bytes for {size} with {room} left breaks the bound"
            )
        self.used += charged
        self.grants += 1
        self.oversize_grants += oversize
        return Grant(ticket, size, charged, oversize)
