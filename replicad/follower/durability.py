"""The follower's disk work off the event loop: one thread of its own for checkpoints.

Rules:
- Checkpoints (every partition written since the last one flushed, then the checkpoint
  files whose entries changed written: log/manager.py), time-based flushes
  (`log.flush_ms`), retention passes, the final checkpoint and the log store's close run on
  one dedicated thread, one job at a time, in the order asked. The event loop only
  awaits them, so fetching, the control socket and `serve` keep answering while a
  checkpoint waits on thousands of fsyncs or on a slow disk.
- Why a thread of our own and not aiofiles: aiofiles runs each call on a file object (open,
  write, flush) as one hop to the loop's default executor. A checkpoint is a few thousand
  fsyncs of descriptors the log store's handle cache owns, directory fsyncs and renames, in
  an order that matters (segments synced before the recovery-point file that names them);
  that is one job for one thread, not thousands of hops whose order the loop would have to
  keep. The default executor is also shared (start-up recovery, getaddrinfo): a slow disk
  there would stall name lookups too. And one thread means two checkpoints never overlap,
  so an older one can never finish last and overwrite a newer file.
- Consistency is the log store's (log/partition.py, log/manager.py): its methods take the
  partition lock, a flush fsyncs outside it and claims as its recovery point only the log
  end it picked before fsyncing (nothing, if a truncation came meanwhile), and the
  checkpoint files are written after every flush and atomically. So a checkpoint never
  claims more than was fsynced, whatever the loop appends or truncates while it runs, and
  a crash at any point leaves the previous files or the new ones, each true.
- A job that fails raises its error in the awaiting task (the caller counts and retries).
  A caller cancelled while its job runs does not stop the job: the next job starts after it.
- `submit` is for work nobody awaits: the flushes `log.flush_messages` makes due while the
  loop appends, the leader-epoch files of partitions whose epoch changed, the unlinks
  of a moved log start, and a truncation's fsyncs and unlinks (log/partition.py). A
  failure there is counted and logged (once a minute with a count); the data stays
  unsynced until the next flush or checkpoint, which claims no more than it synced (and
  writes the epoch file first).
- Which job runs next is decided by a sans-I/O queue (disk_queue.py): first asked, first
  run; a keyed job asked again while it waits is merged into the waiting one, so a
  failover that changes a partition's epoch many times writes its epoch file once. Each
  ask that queues a job hands the thread one turn, and each turn runs the queue's next
  job: the thread's order is the queue's.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import structlog

from replicad.clock import monotonic_ms
from replicad.follower.disk_queue import DiskQueue
from replicad.ratelimit import RateLimitedLog

log = structlog.get_logger("replicad.durability")

T = TypeVar("T")

THREAD_NAME = "replicad-durability"


@dataclass(frozen=True, slots=True)
class DurabilityStats:
    jobs: int
    running: bool
    # Jobs handed over with `submit` that failed (their error was logged).
    failed_unawaited: int
    # How long the last finished job took, and the longest one so far (thread time, ms).
    last_job_ms: int
    longest_job_ms: int
    # Asks merged into a job already waiting (disk_queue.py).
    merged: int = 0


class DurabilityThread:
    """Runs the log store's slow disk work, one job at a time, on a thread of its own."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._jobs = 0
        self._running = False
        self._last_ms = 0
        self._longest_ms = 0
        self._failed_unawaited = 0
        self._say = RateLimitedLog(interval_ms=60_000)
        self._queue = DiskQueue()
        # The loop asks, the thread takes: the queue is shared between them.
        self._queue_lock = threading.Lock()

    def submit(self, job: Callable[[], object], what: str, key: Hashable | None = None) -> None:
        """`job()` on the durability thread, after every job asked before it; nobody waits.
        With a `key`, merged into a job of that key still waiting (disk_queue.py)."""
        # Ask and hand the turn under one lock: turns reach the thread in the queue's order.
        with self._queue_lock:
            if not self._queue.ask(job, what, key).queued:
                return
            done = self._executor.submit(self._turn)
        done.add_done_callback(functools.partial(self._unawaited_done, what))

    def _turn(self) -> object:
        """One turn of the thread: the queue's next job (there is one per turn asked)."""
        with self._queue_lock:
            job = self._queue.next()
        assert job is not None, "a turn with no job: every queued job hands one turn"
        return self._timed(job.run)

    def _unawaited_done(self, what: str, done: Future[object]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is None:
            return
        self._failed_unawaited += 1
        emit = self._say.should_emit("unawaited", monotonic_ms())
        if emit.emit:
            log.error(
                "disk work off the event loop failed; the next checkpoint retries it",
                job=what,
                error=str(error),
                failures_suppressed=emit.suppressed,
            )

    async def run(self, job: Callable[..., T], *args: object) -> T:
        """`job(*args)` on the durability thread, after every job asked before it."""
        loop = asyncio.get_running_loop()
        with self._queue_lock:
            self._queue.ask(functools.partial(job, *args), getattr(job, "__name__", "job"))
            turn = loop.run_in_executor(self._executor, self._turn)
        return await turn  # type: ignore[no-any-return]

    def _timed(self, job: Callable[..., T], *args: object) -> T:
        self._running = True
        started = monotonic_ms()
        try:
            return job(*args)
        finally:
            took = monotonic_ms() - started
            self._jobs += 1
            self._last_ms = took
            self._longest_ms = max(self._longest_ms, took)
            self._running = False

    def stats(self) -> DurabilityStats:
        return DurabilityStats(
            self._jobs,
            self._running,
            self._failed_unawaited,
            self._last_ms,
            self._longest_ms,
            self._queue.merged,
        )

    def close(self) -> None:
        """No more jobs; returns once the thread is done with the ones it has."""
        self._executor.shutdown(wait=True)
