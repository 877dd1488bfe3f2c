"""Waiting for an event: the one way tests and tools wait.

A wait asks for what it waits for (a status field, an offset, a log line, a port, a
counter) again and again until it holds, under a deadline so generous that only a hang
reaches it; it never sleeps a fixed time hoping the event came meanwhile, and a test
never asserts how long the wait took (a busy machine makes every wait longer, and a
test that fails for that tests the machine). `tools/clockcheck.py` holds the suite to it.

`wait_until` is for threads, `until` for coroutines; both return the predicate's first
true value (so a probe can hand back what it found) and raise `TimeoutError` naming
what did not happen. (`tools.peers.process.wait_until` is the peers' own form: a probe
that returns None until the peer answers, and a check that stops at once when the peer's
process has exited.)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Long enough that a loaded machine (two cores, eight test runs and a CPU hog) never
# reaches it; a wait that does is a hang, or the event never comes.
DEADLINE_S = 120.0


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float = DEADLINE_S,
    interval_s: float = 0.1,
    what: str = "",
) -> T:
    """Call `predicate` until it returns something true; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what or predicate}")
        time.sleep(interval_s)


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = DEADLINE_S,
    interval_s: float = 0.01,
    what: str = "",
) -> T:
    """`wait_until` for a coroutine: the loop runs between tries; `predicate` may be a
    coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what or predicate}")
        await asyncio.sleep(interval_s)
