"""BytePool, the one memory pool's rules (replicad/pool/rules.py): first come first served,
never past capacity but for one oversize request held alone, a waiter given up takes
nothing, and a charge may round up within the room left."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import LocalProtocolError
from replicad.pool.rules import BytePool, Grant


def test_a_request_that_fits_is_granted_at_once_and_counted() -> None:
    pool = BytePool(100)
    asked = pool.ask(60)
    assert asked.grant == Grant(asked.ticket, 60, 60, oversize=False)
    assert (pool.used, pool.grants, pool.waits) == (60, 1, 0)
    assert pool.ask(40).grant is not None and pool.used == 100
    assert pool.give_back(60) == [] and pool.used == 40


def test_waiters_are_granted_in_order_and_the_head_is_never_passed() -> None:
    pool = BytePool(100)
    held = pool.ask(70).grant
    large = pool.ask(50)
    small = pool.ask(10)  # would fit now, but comes after a waiter
    assert large.grant is None and small.grant is None and pool.waiting == 2
    assert held is not None
    granted = pool.give_back(held.charged)
    assert [g.ticket for g in granted] == [large.ticket, small.ticket]
    assert pool.used == 60 and pool.waits == 2


def test_an_oversize_request_waits_for_an_empty_pool_then_holds_it_alone() -> None:
    pool = BytePool(100)
    first = pool.ask(30).grant
    huge = pool.ask(250)
    after = pool.ask(10)  # fits beside the first, but waits behind the oversize one
    assert huge.grant is None and after.grant is None
    assert first is not None
    [grant] = pool.give_back(first.charged)
    assert grant == Grant(huge.ticket, 250, 250, oversize=True)
    assert pool.used == 250 and pool.oversize_grants == 1
    assert not pool.fits(1)  # alone: nothing else while it is out
    assert [g.ticket for g in pool.give_back(250)] == [after.ticket]


def test_an_oversize_request_is_granted_at_once_by_an_empty_pool() -> None:
    pool = BytePool(100)
    grant = pool.ask(1_000).grant
    assert grant is not None and grant.oversize and pool.used == 1_000
    assert pool.ask(1).grant is None


def test_a_waiter_withdrawn_takes_nothing_and_lets_the_next_in() -> None:
    pool = BytePool(100)
    pool.ask(90)
    gone = pool.ask(50)
    nxt = pool.ask(10)
    assert gone.grant is None and nxt.grant is None
    assert [g.ticket for g in pool.withdraw(gone.ticket)] == [nxt.ticket]
    assert pool.used == 100 and pool.waiting == 0
    assert pool.withdraw(gone.ticket) == []  # a second time: nothing


def test_the_charge_rounds_up_within_the_room_and_a_bad_one_is_refused() -> None:
    pool = BytePool(100, charge=lambda size, room: min(room, -(-size // 16) * 16))
    assert pool.ask(20).grant == Grant(0, 20, 32, oversize=False)
    assert pool.ask(60).grant == Grant(1, 60, 64, oversize=False)
    assert pool.ask(4).grant == Grant(2, 4, 4, oversize=False)  # only 4 left
    greedy = BytePool(100, charge=lambda size, room: room + 1)
    with pytest.raises(LocalProtocolError, match="breaks the bound"):
        greedy.ask(10)
    with pytest.raises(LocalProtocolError, match="giving back 5 bytes with 0"):
        BytePool(10).give_back(5)
    with pytest.raises(ValueError):
        BytePool(0)
    with pytest.raises(ValueError):
        BytePool(10).ask(0)


# -- the property: bound, order, no starvation -------------------------------------------

CAPACITY = 100
steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.integers(1, 2 * CAPACITY)),
        st.tuples(st.just("give_back"), st.integers(0, 50)),
        st.tuples(st.just("withdraw"), st.integers(0, 50)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans())
def test_never_past_capacity_but_alone_in_order_and_nobody_starves(
    ops: list[tuple[str, int]], round_up: bool
) -> None:
    def charge(size: int, room: int) -> int:
        return min(room, -(-size // 8) * 8) if round_up else size

    pool = BytePool(CAPACITY, charge)
    held: list[Grant] = []
    waiting: list[int] = []  # tickets, in the order they asked
    last_granted = -1

    def granted(grants: list[Grant]) -> None:
        nonlocal last_granted
        for g in grants:
            # First come, first served: a grant is the oldest waiter, after every earlier one.
            assert waiting and g.ticket == waiting[0], (g, waiting)
            waiting.pop(0)
            assert g.ticket > last_granted
            last_granted = g.ticket
            held.append(g)

    def check() -> None:
        outstanding = sum(g.charged for g in held)
        assert pool.used == outstanding
        if outstanding > CAPACITY:  # only the documented oversize case
            assert len(held) == 1 and held[0].oversize and held[0].charged == held[0].size
        assert all(g.size <= g.charged for g in held)
        assert pool.waiting == len(waiting)

    for op, n in ops:
        if op == "ask":
            asked = pool.ask(n)
            waiting.append(asked.ticket)
            if asked.grant is not None:
                granted([asked.grant])
        elif op == "give_back" and held:
            g = held.pop(n % len(held))
            granted(pool.give_back(g.charged))
        elif op == "withdraw" and waiting:
            ticket = waiting.pop(n % len(waiting))
            granted(pool.withdraw(ticket))
        check()
    # No starvation: holders giving back, in any order, lets every waiter in.
    while held:
        granted(pool.give_back(held.pop(0).charged))
        check()
    assert waiting == [] and pool.used == 0 and pool.waiting == 0
