"""RequestMemoryPool: large frames share a bounded pool, first come first served; small
ones never wait; a waiter given up takes nothing."""

from __future__ import annotations

import asyncio

import pytest

from replicad.leader.request_pool import SMALL_FRAME_BYTES, RequestMemoryPool

MIB = 1024 * 1024


async def test_small_frames_never_wait_and_take_nothing() -> None:
    pool = RequestMemoryPool(MIB)
    assert await pool.take(MIB) == MIB  # full
    assert await pool.take(SMALL_FRAME_BYTES) == 0
    assert pool.stats().used == MIB


async def test_a_frame_waits_for_room_and_gets_it_when_one_is_given_back() -> None:
    pool = RequestMemoryPool(3 * MIB)
    first = await pool.take(2 * MIB)
    waiting = asyncio.create_task(pool.take(2 * MIB))
    await asyncio.sleep(0)
    assert not waiting.done() and pool.stats().waiting == 1
    pool.give_back(first)
    assert await asyncio.wait_for(waiting, 1) == 2 * MIB
    assert pool.stats().used == 2 * MIB and pool.stats().waits_total == 1


async def test_waiters_are_served_in_order_so_a_large_one_is_not_starved() -> None:
    pool = RequestMemoryPool(4 * MIB)
    held = await pool.take(3 * MIB)
    large = asyncio.create_task(pool.take(3 * MIB))
    await asyncio.sleep(0)
    small = asyncio.create_task(pool.take(MIB))  # would fit now, but queues behind
    await asyncio.sleep(0)
    assert not small.done()
    pool.give_back(held)
    await asyncio.wait_for(large, 1)
    await asyncio.wait_for(small, 1)
    assert pool.stats().used == 4 * MIB


async def test_a_waiter_given_up_takes_nothing_and_lets_the_next_in() -> None:
    pool = RequestMemoryPool(2 * MIB)
    held = await pool.take(2 * MIB)
    gone = asyncio.create_task(pool.take(2 * MIB))
    await asyncio.sleep(0)
    nxt = asyncio.create_task(pool.take(MIB))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    pool.give_back(held)
    await asyncio.wait_for(nxt, 1)
    assert pool.stats().used == MIB and pool.stats().waiting == 0


async def test_a_frame_larger_than_the_pool_waits_for_it_to_empty_and_is_held_alone() -> None:
    """The oversize rule (replicad/pool/rules.py). It used to take only the pool's capacity
    for such a frame: the count now says what is really held (5 MiB), and what comes
    after it waits until it is given back."""
    pool = RequestMemoryPool(MIB)
    held = await pool.take(MIB // 2)
    large = asyncio.create_task(pool.take(5 * MIB))
    await asyncio.sleep(0)
    small = asyncio.create_task(pool.take(MIB // 4))  # would fit now, but queues behind
    await asyncio.sleep(0)
    assert not large.done() and not small.done() and pool.stats().waiting == 2
    pool.give_back(held)
    assert await asyncio.wait_for(large, 1) == 5 * MIB
    assert pool.stats().used == 5 * MIB and not small.done()
    pool.give_back(5 * MIB)
    await asyncio.wait_for(small, 1)
    assert pool.stats().used == MIB // 4 and pool.account.oversize_grants == 1


async def test_a_waiter_cancelled_as_it_is_granted_passes_its_turn_on() -> None:
    pool = RequestMemoryPool(2 * MIB)
    held = await pool.take(2 * MIB)
    gone = asyncio.create_task(pool.take(2 * MIB))
    await asyncio.sleep(0)
    nxt = asyncio.create_task(pool.take(2 * MIB))
    await asyncio.sleep(0)
    gone.cancel()  # its future is cancelled now; its task learns it on the next turn
    pool.give_back(held)  # grants `gone` first: nothing to hand it, so `nxt` gets it
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await asyncio.wait_for(nxt, 1) == 2 * MIB
    assert pool.stats().used == 2 * MIB and pool.stats().waiting == 0
