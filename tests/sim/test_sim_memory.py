"""The simulation's memory pool (tools/sim/memory.py): the real MemoryPool shared by every
leader, its rules 5 and 6 checked after every change, and a planted defect for each that a
suite seed finds (as tests/sim/test_sim_run.py does for the others)."""

from __future__ import annotations

import logging

import pytest
import structlog

from replicad.follower.memory_pool import PAGE, MemoryPool
from replicad.pool.rules import BytePool, Grant
from tests.sim.seeded import planted_found
from tools.sim.invariants import InvariantError
from tools.sim.memory import SimMemory
from tools.sim.run import run_seeds

# The suite's seeds (tests/sim/test_sim_run.py's SUITE_SEEDS): each planted defect below is
# found within them.
SEEDS = range(200)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def test_reservations_are_granted_in_order_and_counted() -> None:
    memory = SimMemory(3 * PAGE)
    first = memory.reserve(1, 2 * PAGE)
    second = memory.reserve(2, 2 * PAGE)  # does not fit beside the first: waits
    third = memory.reserve(3, 100)  # would fit, but comes after a waiter: waits too
    assert first.granted and not second.granted and not third.granted
    assert memory.waits == 2
    memory.release(first)
    assert second.granted and third.granted
    memory.release(second)
    memory.release(third)
    memory.check_done()
    memory.close()


def test_a_leader_still_waiting_at_the_end_is_reported() -> None:
    memory = SimMemory(2 * PAGE)
    held = memory.reserve(1, 2 * PAGE)
    memory.reserve(2, PAGE)
    with pytest.raises(InvariantError, match=r"1 reservations still wait \(leaders \[2\]\)"):
        memory.check_done()
    memory.release(held)
    memory.restart()
    memory.check_done()
    memory.close()


def test_an_overdrawn_pool_is_found_by_a_suite_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: idle buffers are never freed to make room for a new one: the pool holds
    more than its bound."""
    monkeypatch.setattr(MemoryPool, "_free_idle", lambda self, keep: None)
    error = planted_found(run_seeds, SEEDS, "overdraw")
    assert "memory pool overdrawn" in error


def _newest_first(self: BytePool) -> list[Grant]:
    """Planted: memory given back goes to the newest waiter first; while others keep
    asking, the oldest can wait forever (a leader starved)."""
    granted = []
    while self._queue and self.fits(self._queue[-1][1]):
        ticket, size = self._queue.pop()
        granted.append(self._take(ticket, size))
    return granted


def test_a_pool_that_serves_its_newest_waiter_first_is_found_by_a_suite_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule 6 judges the order the pool grants in; seeds with a pool smaller than a page
    (tools/sim/run.py) have several leaders waiting at once."""
    monkeypatch.setattr(BytePool, "_grant_waiters", _newest_first)
    error = planted_found(run_seeds, SEEDS, "starvation")
    assert "overtaken: a leader can be starved" in error


def test_a_pool_that_serves_its_newest_waiter_first_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same defect, driven step by step."""
    monkeypatch.setattr(BytePool, "_grant_waiters", _newest_first)
    memory = SimMemory(3 * PAGE)
    first = memory.reserve(1, 3 * PAGE)
    memory.reserve(2, PAGE)
    memory.reserve(3, PAGE)
    with pytest.raises(InvariantError, match=r"reservation 2 .* earlier one 1 .*overtaken"):
        memory.release(first)
    memory.close()
