import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.ratelimit import Emit, RateLimitedLog


def test_first_event_of_a_key_is_emitted() -> None:
    limiter = RateLimitedLog(interval_ms=1000)
    assert limiter.should_emit("a", 0) == Emit(emit=True, suppressed=0)
    assert limiter.should_emit("b", 0) == Emit(emit=True, suppressed=0)


def test_repeats_within_the_interval_are_suppressed_and_counted() -> None:
    limiter = RateLimitedLog(interval_ms=1000)
    limiter.should_emit("a", 0)
    assert limiter.should_emit("a", 10) == Emit(emit=False, suppressed=1)
    assert limiter.should_emit("a", 999) == Emit(emit=False, suppressed=2)
    assert limiter.pending("a") == 2
    # The next emitted event reports the repeats held back since the last one.
    assert limiter.should_emit("a", 1000) == Emit(emit=True, suppressed=2)
    assert limiter.pending("a") == 0
    assert limiter.should_emit("a", 1500) == Emit(emit=False, suppressed=1)


def test_keys_are_independent() -> None:
    limiter = RateLimitedLog(interval_ms=1000)
    limiter.should_emit("a", 0)
    limiter.should_emit("a", 1)
    assert limiter.should_emit("b", 2).emit
    assert limiter.pending("b") == 0
    assert limiter.pending("a") == 1


def test_clock_going_backwards_does_not_emit_early() -> None:
    limiter = RateLimitedLog(interval_ms=1000)
    limiter.should_emit("a", 5000)
    assert not limiter.should_emit("a", 100).emit
    assert limiter.should_emit("a", 6000).emit


def test_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError):
        RateLimitedLog(interval_ms=-1)


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=200))
def test_every_event_is_emitted_or_counted_exactly_once(gaps: list[int]) -> None:
    limiter = RateLimitedLog(interval_ms=100)
    now = 0
    emitted = 0
    reported = 0
    last_emit = None
    for gap in gaps:
        now += gap
        result = limiter.should_emit("k", now)
        if result.emit:
            assert last_emit is None or now - last_emit >= 100
            emitted += 1
            reported += result.suppressed
            last_emit = now
    assert emitted + reported + limiter.pending("k") == len(gaps)


def test_keys_that_come_and_go_do_not_accumulate() -> None:
    """A key per group or partition: after each has had its say and its interval passed, the
    limiter does not hold them all (serve's group sync keyed warnings by group id, kept for
    the life of the process)."""
    limiter = RateLimitedLog(interval_ms=1_000)
    for i in range(10_000):
        assert limiter.should_emit(f"group:{i}", now_ms=i * 10).emit
    assert len(limiter) <= 1_024


def test_forgetting_a_key_changes_nothing_said() -> None:
    limiter = RateLimitedLog(interval_ms=1_000)
    assert limiter.should_emit("held", 0).emit
    assert not limiter.should_emit("held", 1).emit  # one held back: kept through a prune
    assert limiter.should_emit("quiet", 0).emit
    for i in range(5_000):
        limiter.should_emit(f"k{i}", 2_000 + i)
    assert limiter.pending("held") == 1
    assert limiter.should_emit("held", 9_000) == Emit(emit=True, suppressed=1)
    # "quiet" was forgotten: its next event is emitted, as it would have been anyway.
    assert limiter.should_emit("quiet", 9_000) == Emit(emit=True, suppressed=0)
    assert not limiter.should_emit("quiet", 9_001).emit
