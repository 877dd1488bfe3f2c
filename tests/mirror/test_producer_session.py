"""The mirror's producer session (replicad/mirror/producer_session.py): one session for the
whole mirror, renewed once by whoever lost it first, asked again after a back-off when
refused, and nobody sends while it is asked for."""

from __future__ import annotations

import random

import pytest

from replicad.errors import LocalProtocolError
from replicad.mirror.producer_session import ProducerSession, SessionPhase
from replicad.mirror.restamp import ProducerStamp

FIRST, SECOND = ProducerStamp(1, 0), ProducerStamp(2, 0)


def session() -> ProducerSession:
    return ProducerSession(100, 1_000, rng=random.Random(1))


def test_granted_at_start_then_usable() -> None:
    s = session()
    assert s.usable is None and s.ask_wanted(0)
    assert not s.ask_wanted(0)  # one ask at a time
    s.granted(FIRST)
    assert s.usable == FIRST and s.phase is SessionPhase.ACTIVE and s.renewals == 0


def test_the_first_to_lose_it_renews_the_others_find_the_new_one() -> None:
    s = session()
    s.ask_wanted(0)
    s.granted(FIRST)
    assert s.lost(FIRST)
    assert s.usable is None and s.phase is SessionPhase.RENEWING
    assert not s.lost(FIRST)  # a second partition: already renewing
    assert s.ask_wanted(5)
    s.granted(SECOND)
    assert not s.lost(FIRST)  # an old loss, reported late: renewed already
    assert s.usable == SECOND and s.renewals == 1


def test_a_refused_ask_is_asked_again_after_a_growing_back_off_reset_when_granted() -> None:
    s = session()
    delays = []
    now = 0
    for _ in range(5):
        assert s.ask_wanted(now)
        s.refused(now)
        wake = s.next_wakeup_ms(now)
        assert wake is not None and wake > now and not s.ask_wanted(wake - 1)
        delays.append(wake - now)
        now = wake
    assert delays[-1] > delays[0] and max(delays) <= 1_000
    assert s.ask_wanted(now)
    s.granted(FIRST)
    assert s.next_wakeup_ms(now) is None
    s.lost(FIRST)
    assert s.ask_wanted(now)  # a renewal asks at once
    s.refused(now)
    assert s.next_wakeup_ms(now) - now <= 2 * delays[0]  # type: ignore[operator]


def test_an_illegal_transition_or_an_answer_without_an_ask_raises() -> None:
    s = session()
    with pytest.raises(LocalProtocolError):
        s.granted(FIRST)  # no ask
    s.ask_wanted(0)
    s.granted(FIRST)
    with pytest.raises(LocalProtocolError):
        s.refused(0)
    from replicad.mirror.producer_session import SessionEvent, next_session_phase

    with pytest.raises(LocalProtocolError, match="no transition from active on granted"):
        next_session_phase(SessionPhase.ACTIVE, SessionEvent.GRANTED)
