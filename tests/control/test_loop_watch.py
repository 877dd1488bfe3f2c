"""control/loop_watch.py: how long the loop was blocked, from the times it woke the watch."""

from __future__ import annotations

from replicad.control.loop_watch import LoopWatch


def test_waking_late_is_a_block_and_waking_on_time_is_none() -> None:
    watch = LoopWatch(interval_ms=100, window_ms=10_000)
    assert watch.tick(1_000) == 0.0  # the first tick only starts the clock
    assert watch.tick(1_100) == 0.0
    assert watch.tick(1_450) == 250.0  # asked for 100 ms, woke after 350
    assert watch.tick(1_550) == 0.0
    assert watch.status() == {
        "max_block_ms": 250.0,
        "recent_max_block_ms": 250.0,
        "interval_ms": 100,
    }


def test_the_recent_figure_forgets_after_two_windows_and_the_maximum_does_not() -> None:
    watch = LoopWatch(interval_ms=100, window_ms=1_000)
    now = 0
    watch.tick(now)
    now += 100 + 700
    watch.tick(now)  # a 700 ms block
    for _ in range(25):  # 2.5 s of ticks on time: two windows go by
        now += 100
        watch.tick(now)
    assert watch.max_block_ms == 700
    assert watch.recent_max_block_ms == 0
