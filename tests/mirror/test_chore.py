"""The mirror shell's mirror-wide chores (replicad/mirror/chore.py), on a fake clock: the
destination's metadata asked at most once a back-off, asks folded into the run under way,
a failed run tried again after a growing back-off, a periodic chore due each interval."""

from __future__ import annotations

import random

import pytest

from replicad.errors import LocalProtocolError
from replicad.mirror.chore import TRANSITIONS, Chore, ChoreEvent, ChorePhase, next_chore_phase


def metadata() -> Chore:
    return Chore(100, 1_000, min_gap_ms=100, rng=random.Random(1))


def test_an_ask_runs_at_once_then_no_sooner_than_the_gap_after_the_last_run() -> None:
    chore = metadata()
    assert not chore.start(0) and chore.next_wakeup_ms(0) is None  # nobody asked
    chore.ask(1_000)
    assert chore.next_wakeup_ms(1_000) == 1_000 and chore.start(1_000)
    chore.succeeded(1_030)
    assert chore.phase is ChorePhase.IDLE and chore.next_wakeup_ms(1_030) is None
    chore.ask(1_050)  # a leader still not known: asked again at once
    assert chore.next_wakeup_ms(1_050) == 1_130
    assert not chore.start(1_129) and chore.start(1_130)
    chore.succeeded(1_140)
    chore.ask(5_000)  # long after: no wait
    assert chore.start(5_000)


def test_asks_while_due_or_running_are_one_run() -> None:
    chore = metadata()
    chore.ask(0)
    chore.ask(0)
    assert chore.start(0) and not chore.start(0)  # one run at a time
    chore.ask(10)  # answered by the run under way
    chore.succeeded(20)
    assert chore.phase is ChorePhase.IDLE and not chore.start(500)


def test_a_failed_run_is_tried_again_after_a_growing_backoff_that_a_success_resets() -> None:
    chore = metadata()
    chore.ask(0)
    delays = []
    now = 0
    for _ in range(6):
        assert chore.start(now)
        chore.failed(now)
        wake = chore.next_wakeup_ms(now)
        assert wake is not None and not chore.start(wake - 1)
        delays.append(wake - now)
        now = wake
    assert delays[1] > delays[0] and max(delays) <= 1_200  # jittered, capped near 1 s
    assert chore.failures == 6
    assert chore.start(now)
    chore.succeeded(now)
    chore.ask(now + 1_000)
    assert chore.start(now + 1_000)
    chore.failed(now + 1_000)
    assert chore.next_wakeup_ms(now + 1_000) - (now + 1_000) <= 120  # back to the first step


def test_a_periodic_chore_is_due_each_interval_after_a_success() -> None:
    topics = Chore(100, 1_000, every_ms=30_000, rng=random.Random(1))
    topics.ask(0)  # at start
    assert topics.start(0)
    topics.succeeded(50)
    assert topics.phase is ChorePhase.DUE and topics.next_wakeup_ms(50) == 30_050
    assert not topics.start(30_049) and topics.start(30_050)
    topics.failed(30_060)  # the destination is down: sooner than the interval
    wake = topics.next_wakeup_ms(30_060)
    assert wake is not None and wake < 30_060 + 30_000


def test_a_move_not_in_the_table_raises() -> None:
    chore = metadata()
    with pytest.raises(LocalProtocolError, match="no transition from idle on succeeded"):
        chore.succeeded(0)
    with pytest.raises(LocalProtocolError):
        next_chore_phase(ChorePhase.IDLE, ChoreEvent.FAILED)
    assert (ChorePhase.DUE, ChoreEvent.SUCCEEDED) not in TRANSITIONS
