"""The real KIP-81 memory pool (replicad/follower/memory_pool.py:MemoryPool) shared by every
leader of a simulation, driven without a thread and without a clock.

Each response a leader sends is reserved from the one pool before the follower reads it,
as BrokerConnection does. The reservations are asyncio tasks on a loop of our own, and
the simulation turns that loop itself (a few passes of `sleep(0)`: no timers, no I/O), so a
seed runs the same every time. A leader whose reservation waits takes no turn until it is
granted; a granted response may be held for a while before it is appended (a busy loop, a
slow disk), and its memory goes back once its appends are done.

What must hold (checked after every change, tools/sim/invariants.py's rules 5 and 6):
5. No overdraw: the bytes the pool lends (and holds idle) stay within its capacity (but for
   one response larger than the pool, held alone), and what it counts as lent is exactly
   the buffers our leaders hold.
6. No leader starved: a reservation is granted only when every earlier one has been
   (first come, first served: one busy leader cannot keep memory from the others), and at
   the end no leader still waits and every buffer is back.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from replicad.follower.memory_pool import Lease, MemoryPool
from tools.sim.invariants import InvariantError


@dataclass(eq=False)
class Reservation:
    ticket: int
    node: int
    size: int
    task: asyncio.Task[Lease]
    lease: Lease | None = field(default=None)

    @property
    def granted(self) -> bool:
        return self.lease is not None


async def _spin(passes: int) -> None:
    for _ in range(passes):
        await asyncio.sleep(0)


class SimMemory:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.loop = asyncio.new_event_loop()
        self.pool = MemoryPool(capacity)
        self._tickets = itertools.count()
        self.waiting: list[Reservation] = []
        self.lent: list[Reservation] = []
        self._granted: list[Reservation] = []
        self.waits = 0

    def reserve(self, node: int, size: int) -> Reservation:
        task = self.loop.create_task(self.pool.reserve(size))
        reservation = Reservation(next(self._tickets), node, size, task)
        # Tasks end in the order the pool granted them: that order is what rule 6 judges.
        task.add_done_callback(lambda _: self._granted.append(reservation))
        self.waiting.append(reservation)
        self.settle()
        if not reservation.granted:
            self.waits += 1
        return reservation

    def release(self, reservation: Reservation) -> None:
        assert reservation.lease is not None
        reservation.lease.release()
        self.lent.remove(reservation)
        self.settle()

    def settle(self) -> None:
        """Turn the loop until the pool's grants have reached their tasks; check 5 and 6."""
        self.loop.run_until_complete(_spin(4))
        granted, self._granted = self._granted, []
        for r in granted:  # in the order granted
            if r.task.cancelled():
                continue
            r.lease = r.task.result()
            earlier = [w for w in self.waiting if w.lease is None and w.ticket < r.ticket]
            if earlier:
                raise InvariantError(
                    f"memory pool: leader {r.node}'s reservation {r.ticket} ({r.size} bytes) "
                    f"was granted while leader {earlier[0].node}'s earlier one "
                    f"{earlier[0].ticket} ({earlier[0].size} bytes) still waited (overtaken: "
                    "a leader can be starved)"
                )
            self.lent.append(r)
        self.waiting = [w for w in self.waiting if w.lease is None]
        self.check_bound()

    def check_bound(self) -> None:
        """Lent and idle within the capacity, but for one response larger than the whole
        pool, held alone (replicad/pool/rules.py's oversize rule)."""
        used, idle = self.pool.account.used, self.pool.idle
        held = sum(len(r.lease.buffer.obj) for r in self.lent if r.lease is not None)
        alone = len(self.lent) == 1 and self.lent[0].size > self.capacity and idle == 0
        if (used + idle > self.capacity and not alone) or held != used:
            raise InvariantError(
                f"memory pool overdrawn: {used} lent + {idle} idle of {self.capacity} "
                f"(the leaders hold {held} in {len(self.lent)} buffers)"
            )

    def check_done(self) -> None:
        """At the end: no leader waits for memory and every buffer is back."""
        if self.waiting or self.lent or self.pool.account.used:
            raise InvariantError(
                f"memory pool at the end: {len(self.waiting)} reservations still wait "
                f"(leaders {sorted({r.node for r in self.waiting})}), {len(self.lent)} "
                f"buffers not given back, {self.pool.account.used} bytes lent"
            )

    def restart(self) -> None:
        """The process stops: waiting reservations are cancelled, buffers dropped, and the
        next process has a pool of its own."""
        for r in self.waiting:
            r.task.cancel()
        self.loop.run_until_complete(_spin(4))
        self.waiting, self.lent, self._granted = [], [], []
        self.pool = MemoryPool(self.capacity)

    def close(self) -> None:
        self.restart()
        self.loop.close()
