"""WaitingPool, the queue the one memory pool's shells wait in (replicad/pool/waiting.py):
waiters get what is lent for their grants in order; one given up takes nothing, before
or after its grant."""

from __future__ import annotations

import asyncio

import pytest

from replicad.pool.rules import BytePool, Grant
from replicad.pool.waiting import WaitingPool


def _pool(capacity: int) -> tuple[WaitingPool[str], list[str]]:
    """Lends a label per grant; `returned` lists what came back through unlend."""
    returned: list[str] = []
    rules = BytePool(capacity)

    def lend(grant: Grant) -> str:
        return f"{grant.ticket}:{grant.charged}"

    def unlend(lent: str) -> None:
        returned.append(lent)
        rules.give_back(int(lent.split(":")[1]))

    return WaitingPool(rules, lend, unlend), returned


async def test_a_grant_given_at_once_is_lent_at_once_and_waiters_in_order() -> None:
    pool, _ = _pool(10)
    assert await pool.take(6) == "0:6"
    first = asyncio.create_task(pool.take(6))
    second = asyncio.create_task(pool.take(4))  # would fit, but comes after a waiter
    await asyncio.sleep(0)
    assert pool.rules.waiting == 2 and not first.done() and not second.done()
    pool.give_back(6)
    assert await first == "1:6" and await second == "2:4"
    assert pool.rules.used == 10


async def test_a_waiter_given_up_takes_nothing_and_lets_the_next_in() -> None:
    pool, returned = _pool(10)
    await pool.take(10)
    gone = asyncio.create_task(pool.take(8))
    nxt = asyncio.create_task(pool.take(2))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    pool.give_back(10)
    assert await nxt == "2:2" and pool.rules.used == 2 and returned == []


async def test_one_cancelled_before_its_grant_came_passes_it_on() -> None:
    pool, returned = _pool(10)
    await pool.take(10)
    gone = asyncio.create_task(pool.take(10))
    nxt = asyncio.create_task(pool.take(10))
    await asyncio.sleep(0)
    gone.cancel()  # its future is cancelled now; its task learns it on the next turn
    pool.give_back(10)  # grants `gone` first: nothing is lent to it, `nxt` is granted
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await nxt == "2:10" and returned == [] and pool.rules.waiting == 0


async def test_one_granted_just_as_it_was_given_up_hands_back_what_it_was_lent() -> None:
    pool, returned = _pool(10)
    await pool.take(10)
    late = asyncio.create_task(pool.take(10))
    await asyncio.sleep(0)
    pool.give_back(10)  # granted: its future holds the lent label
    late.cancel()  # cancelled before its task ran to take it
    with pytest.raises(asyncio.CancelledError):
        await late
    assert returned == ["1:10"] and pool.rules.used == 0
