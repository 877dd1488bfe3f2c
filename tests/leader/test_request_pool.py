"""RequestMemoryPool: large frames share a bounded pool, first come first served; small
ones never wait; a waiter given up takes nothing."""

from __future__ import annotations

import asyncio

import pytest

from replicad.leader.request_pool import SMALL_FRAME_BYTES, RequestMemoryPool

MIB = 1024 * 1024


async def test_small_frames_never_wait_and_take_nothing() -> None:
    pool = RequestMemoryPool(MIB)
    pool.used = MIB  # full
    assert await pool.take(SMALL_FRAME_BYTES) == 0
    assert pool.used == MIB


async def test_a_frame_waits_for_room_and_gets_it_when_one_is_given_back() -> None:
    pool = RequestMemoryPool(3 * MIB)
    first = await pool.take(2 * MIB)
    waiting = asyncio.create_task(pool.take(2 * MIB))
    await asyncio.sleep(0)
    assert not waiting.done() and pool.stats().waiting == 1
    pool.give_back(first)
    assert await asyncio.wait_for(waiting, 1) == 2 * MIB
    assert pool.used == 2 * MIB and pool.waits_total == 1


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
    assert pool.used == 4 * MIB


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
    assert pool.used == MIB and pool.stats().waiting == 0


async def test_a_frame_larger_than_the_pool_takes_all_of_it_once_empty() -> None:
    pool = RequestMemoryPool(MIB)
    assert await pool.take(5 * MIB) == MIB
    assert pool.used == MIB
