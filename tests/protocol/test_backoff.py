import random

from replicad.protocol.backoff import Backoff


def test_grows_exponentially_to_the_cap_with_bounded_jitter():
    b = Backoff(base_ms=100, max_ms=1000, jitter=0.2, rng=random.Random(7))
    delays = [b.next_delay_ms() for _ in range(8)]
    for attempt, delay in enumerate(delays):
        raw = min(1000, 100 * 2**attempt)
        assert raw * 0.8 <= delay <= raw * 1.2
    assert delays[-1] <= 1200


def test_reset_starts_over():
    b = Backoff(base_ms=50, max_ms=10_000, jitter=0.0)
    for _ in range(5):
        b.next_delay_ms()
    b.reset()
    assert b.next_delay_ms() == 50


def test_jitter_spreads_simultaneous_failures():
    delays = {Backoff(1000, 1000, rng=random.Random(seed)).next_delay_ms() for seed in range(20)}
    assert len(delays) > 10
