"""RequestQuota: Kafka's request_percentage quota per client address, throttle by Kafka's
formula, state dropped with the client."""

from __future__ import annotations

from replicad.leader.quotas import RequestQuota


def test_within_the_quota_nothing_is_throttled() -> None:
    quota = RequestQuota(50)  # 500 ms of each second, over 10 s at least: 5,000 ms
    now = 100_000
    assert all(quota.record("a", 100, now + i * 100) == 0 for i in range(40))  # 4,000 ms


def test_over_the_quota_the_throttle_brings_the_rate_back_to_it() -> None:
    quota = RequestQuota(10)  # 100 ms a second; the span is 10 s at first
    now = 100_000
    assert quota.record("a", 900, now) == 0  # 900 <= 10% of 10 s
    throttle = quota.record("a", 300, now)
    # (1,200 - 0.1 * 10,000) / 0.1 = 2,000 ms of silence brings it back to 10%.
    assert throttle == 2000
    assert quota.record("b", 300, now) == 0  # another client has its own quota


def test_the_throttle_is_capped_at_the_windows_span() -> None:
    quota = RequestQuota(1, windows=11, window_ms=1000)
    assert quota.record("a", 60_000, 0) == 11_000


def test_old_windows_are_forgotten_and_so_is_a_client() -> None:
    quota = RequestQuota(10)
    assert quota.record("a", 1500, 0) > 0
    assert quota.record("a", 0, 30_000) == 0  # 30 s later, the burst is out of the windows
    quota.forget("a")
    assert quota.clients == 0
