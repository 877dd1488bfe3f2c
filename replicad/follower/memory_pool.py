"""One bound on all fetch-response memory across every leader connection (KIP-81).

Rules:
- Who is granted memory, and when, is replicad/pool/rules.py's (the one pool's rules, also
  serve's): a fetch response's bytes are asked for before its body is read from the
  socket; while the pool cannot hold it, that socket is simply not read (TCP backpressure
  reaches the leader). Waiters are served first come, first served, so one busy leader
  cannot starve the others of memory. Metadata, ApiVersions and ListOffsets use other
  connections and never wait here: the control plane is never starved.
- A response larger than the whole pool (a record batch larger than `fetch.buffer_memory`:
  KIP-74 sends the first batch whole) is read alone, once nothing else is held, and the
  pool is exceeded by it for as long as it is held (pool/rules.py's oversize rule says why:
  refusing it stopped that leader's partitions for good). It is said loudly, with the fix --
  raising `fetch.buffer_memory` above the source's largest batch -- and counted
  (`oversize`). Its buffer is anonymous memory the kernel fills page by page as bytes
  arrive, and it is never kept idle: a size prefix alone holds nothing.
- The pool owns the buffers. A reservation is a `Lease` of a buffer of at least the
  frame's size; the connection reads the frame straight into it (recv_into) and the
  buffer goes back to the pool's idle list when the lease is released, to be lent
  again: no allocation, page faults or unmapping per frame once the pool is warm.
- The bound counts real bytes: every buffer the pool owns, lent or idle, is counted
  at its full size (`used` + `idle` <= `capacity`, but for one oversize response). When a
  buffer does not fit beside the idle ones, idle buffers are freed first (largest first);
  the pool waits only when the bytes lent leave no room.
- Buffers come in size classes (a multiple of an eighth of the size's power of two,
  pages at least), so a frame a little larger than the last one reuses its buffer or a
  slightly larger one; when the class does not fit the room left, the frame's own size in
  whole pages (or else its size) is lent. An idle buffer is lent for a frame only when it
  is at most twice the frame's class, so small frames do not tie up large buffers.
- Idle buffers are kept for reuse only while they are needed: `trim()`, called now and then
  (the follower calls it every checkpoint interval), frees idle buffers beyond the most bytes
  lent at once since the last trim. Replicating at full speed keeps them; a follower that
  has caught up, whose responses are small, gives back what catching up took (issue 32:
  the 32 MiB a 10,000-partition catch-up left idle was a third of the daemon's RSS).
- Memory goes back as soon as the response's data is on disk (the caller
  releases its lease after appending). Views of a released buffer must no longer be
  read: the buffer is lent again. Nor kept: an idle buffer the pool frees while something
  still holds it (a view, a lingering response) is not freed at all, and the one made in
  its place is memory over the bound. Each such free is counted (`freed_in_use`, bytes),
  so a run says whether the transient over `fetch.buffer_memory` is one.

`BytePool` (replicad/pool/rules.py) decides; `MemoryPool` lends the buffers and waits.
"""

from __future__ import annotations

import bisect
import mmap
import sys

import structlog

from replicad.clock import monotonic_ms
from replicad.pool.rules import BytePool, Grant
from replicad.pool.waiting import WaitingPool
from replicad.ratelimit import RateLimitedLog

log = structlog.get_logger(__name__)

PAGE = 4096
# A lent buffer is at most this many times the size class of the frame it holds.
MAX_REUSE_RATIO = 2
OVERSIZE_LOG_INTERVAL_MS = 60_000

Block = bytearray | mmap.mmap
_RELEASED = bytearray()
_RELEASED_VIEW = memoryview(_RELEASED)


def size_class(size: int, capacity: int) -> int:
    """The size of the buffer lent for a frame of `size` bytes: whole pages, rounded up
    to an eighth of the size's power of two (at most 12.5% more), never above capacity."""
    step = max(PAGE, 1 << max(size.bit_length() - 4, 0))
    return min(-(-size // step) * step, max(capacity, size))


class Lease:
    """A pool buffer lent for one frame: `buffer` is exactly the frame's size. Calling the
    lease (or `release()`) gives the buffer back; a second call does nothing."""

    __slots__ = ("_block", "_pool", "buffer", "size")

    def __init__(self, pool: MemoryPool | None, block: Block, size: int) -> None:
        self._pool = pool
        self._block = block
        self.size = size
        self.buffer = memoryview(block)[:size]

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._take_back(self)

    __call__ = release


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.account = BytePool(capacity, self._charge)
        self._waiting = WaitingPool(self.account, self._lend, self._give_back)
        self.idle = 0
        self.peak = 0
        self.reused = 0
        # Bytes of idle buffers freed while something else still held them (see the rules).
        self.freed_in_use = 0
        # The most bytes lent at once since the last trim.
        self._lent_most = 0
        # Idle buffers, sorted by size (parallel lists: sizes for bisect, the buffers).
        self._idle_sizes: list[int] = []
        self._idle: list[bytearray] = []
        self._say = RateLimitedLog(OVERSIZE_LOG_INTERVAL_MS)

    async def reserve(self, size: int) -> Lease:
        """Wait until a buffer for `size` bytes may be lent (pool/rules.py), and lend it."""
        return Lease(self, await self._waiting.take(size), size)

    def _charge(self, size: int, room: int) -> int:
        """What to lend a frame of `size` that fits the `room` left (idle buffers are
        freeable, so they count as room): an idle buffer not too large for it, else its size
        class, else whole pages, else its size."""
        i = bisect.bisect_left(self._idle_sizes, size)
        capacity = self.account.capacity
        # Never above the room: several grants of one give-back are charged before any is
        # lent, so an idle buffer already charged to one may still be listed here (found by
        # tests/sim/test_sim_memory.py: 8 KiB charged for 100 bytes with 4 KiB left).
        reuse_at_most = min(MAX_REUSE_RATIO * size_class(size, capacity), room)
        if i < len(self._idle_sizes) and self._idle_sizes[i] <= reuse_at_most:
            return self._idle_sizes[i]
        for want in (size_class(size, capacity), -(-size // PAGE) * PAGE):
            if want <= room:
                return want
        return size

    def _lend(self, grant: Grant) -> Block:
        """The buffer for a grant: the idle one `_charge` chose, or a new one once enough
        idle buffers are freed to keep the bound."""
        if grant.oversize:
            self._free_idle(0)
            self.peak = max(self.peak, self.account.used)
            self._say_oversize(grant)
            return mmap.mmap(-1, grant.charged)
        i = bisect.bisect_left(self._idle_sizes, grant.charged)
        if i < len(self._idle_sizes) and self._idle_sizes[i] == grant.charged:
            del self._idle_sizes[i]
            block = self._idle.pop(i)
            self.idle -= len(block)
            self.reused += 1
        else:
            self._free_idle(self.account.capacity - self.account.used)
            block = bytearray(grant.charged)
        self.peak = max(self.peak, self.account.used + self.idle)
        self._lent_most = max(self._lent_most, self.account.used)
        return block

    def trim(self) -> int:
        """Free idle buffers beyond the most bytes lent at once since the last trim (largest
        first), and start counting again; returns the bytes freed."""
        used = self.account.used
        before = self.idle
        self._free_idle(max(0, self._lent_most - used))
        self._lent_most = used
        return before - self.idle

    def _free_idle(self, keep: int) -> None:
        """Free idle buffers, largest first, until at most `keep` bytes are idle."""
        while self.idle > keep:
            self._idle_sizes.pop()
            block = self._idle.pop()
            self.idle -= len(block)
            # Ours: this local and getrefcount's argument. More: someone still holds it.
            if sys.getrefcount(block) > 2:
                self.freed_in_use += len(block)
            del block

    def _say_oversize(self, grant: Grant) -> None:
        emit = self._say.should_emit("oversize", monotonic_ms())
        if emit.emit:
            log.warning(
                "a fetch response larger than fetch.buffer_memory is read alone, past the "
                "bound; raise fetch.buffer_memory above the largest record batch of the "
                "source (its message.max.bytes)",
                response_bytes=grant.size,
                buffer_memory=self.account.capacity,
                repeats_suppressed=emit.suppressed,
            )

    def _take_back(self, lease: Lease) -> None:
        """A lease's buffer comes back, and the waiters its bytes let in are lent theirs, at
        once (waiting.py). The lease lets go of the buffer first, and no local variable here
        holds it meanwhile: the idle list is its only holder, so when a waiter's buffer needs
        it freed (`_free_idle`), it is freed before the new one is made. A reference left in
        a frame of this call chain kept it alive beside its replacement: 30 + 12 MiB held at
        once under a 32 MiB pool (tests/follower/test_memory_pool.py), the transient over
        `fetch.buffer_memory` issue 32 found at 2,000 partitions. A lease kept by its caller
        must not keep it alive either."""
        size = self._keep_idle(lease._block)
        lease._block, lease.buffer = _RELEASED, _RELEASED_VIEW
        self._waiting.give_back(size)

    def _give_back(self, block: Block) -> None:
        """A buffer lent to a waiter that gave up as it was granted (waiting.py)."""
        size = self._keep_idle(block)
        del block
        self._waiting.give_back(size)

    def _keep_idle(self, block: Block) -> int:
        """Keep a returned buffer idle, so the waiters granted by its bytes may be lent this
        very buffer; returns its size."""
        size = len(block)
        if isinstance(block, bytearray):
            i = bisect.bisect_right(self._idle_sizes, size)
            self._idle_sizes.insert(i, size)
            self._idle.insert(i, block)
            self.idle += size
        # else: an oversize buffer, never kept (it alone would break the bound)
        return size

    def snapshot(self) -> dict[str, int]:
        a = self.account
        return {
            "capacity": a.capacity,
            "used": a.used,
            "idle": self.idle,
            "peak": self.peak,
            "reservations": a.grants,
            "reused": self.reused,
            "waits": a.waits,
            "waiting": a.waiting,
            "oversize": a.oversize_grants,
            "freed_in_use": self.freed_in_use,
        }
