"""The CI-sized version of every fault scenario of docs/reliability.md, against real Kafka.

Each test runs one scenario of `tools.chaos.scenarios` at size CI and asserts what the
reliability table promises: faults were injected, records were checked, none was lost
or duplicated, the daemon survived and stopped cleanly, and its counters explain the
faults. The scenario's summary is printed (visible with -s or on failure).
"""

from __future__ import annotations

import os

import pytest

from tools.chaos.scenarios import (
    CI,
    NETWORK_FAULTS,
    TINY_SESSION_CACHE_SLOTS,
    ScenarioResult,
    corrupt_batches,
    disk_full,
    disk_full_tenant,
    follower_sigkill,
    leader_restart,
    leader_rounds,
    leader_sigkill,
    network_faults,
    session_cache_pressure,
    slow_disk,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def assert_survived(result: ScenarioResult) -> None:
    """Everything the reliability table promises."""
    print(result.summary())
    assert result.ok, result.summary()
    assert not result.known_issues, result.summary()
    assert result.faults_injected > 0, result.summary()
    assert result.records_checked > 0, result.summary()
    assert (result.lost, result.duplicated) == (0, 0), result.summary()
    assert result.daemon == "ran to the end, stopped cleanly", result.summary()


def test_network_faults(kafka_broker, tmp_path) -> None:
    result = network_faults(kafka_broker, tmp_path, CI)
    assert_survived(result)
    assert result.faults == dict.fromkeys(NETWORK_FAULTS, CI.rounds)
    assert len(result.recovery_s) == CI.rounds * len(NETWORK_FAULTS)
    assert result.counters.errors > 0
    assert result.counters.session_recoveries > 0


def test_corrupt_batches_are_caught_and_refetched(kafka_broker, tmp_path) -> None:
    result = corrupt_batches(kafka_broker, tmp_path, CI)
    assert_survived(result)
    flips = result.faults["flipped byte in a batch"]
    assert flips == CI.rounds * 6
    assert result.counters.crc_failures == flips


def test_follower_sigkill(kafka_broker, tmp_path) -> None:
    result = follower_sigkill(kafka_broker, tmp_path, CI)
    assert_survived(result)
    assert result.faults == {"SIGKILL": CI.rounds * 3}
    # A crash leaves a prefix of the leader's log: nothing for the leader to contradict.
    assert result.counters.truncations == 0


def test_leader_sigkill_and_restart(make_kafka_broker, tmp_path) -> None:
    broker = make_kafka_broker()
    killed = leader_sigkill(broker, tmp_path / "kill", CI)
    assert_survived(killed)
    assert killed.faults == {"broker SIGKILL": leader_rounds(CI)}
    assert killed.counters.truncations == 0  # the broker's log did not diverge from ours
    restarted = leader_restart(broker, tmp_path / "restart", CI)
    assert_survived(restarted)
    assert restarted.faults == {"broker restart": leader_rounds(CI)}
    assert restarted.counters.session_recoveries >= leader_rounds(CI)


def test_session_cache_pressure(make_kafka_broker, tmp_path) -> None:
    broker = make_kafka_broker(
        broker_config={"max.incremental.fetch.session.cache.slots": str(TINY_SESSION_CACHE_SLOTS)}
    )
    result = session_cache_pressure(broker, tmp_path, CI)
    assert_survived(result)
    assert result.counters.session_recoveries > 0


# A full disk is a tmpfs of a set size under the data directory; only root may mount one.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a disk of a set size (a tmpfs mount) needs root"
)


@needs_root
def test_disk_full(kafka_broker, tmp_path) -> None:
    """Partitions pause with whole batches only and resume when space comes back."""
    result = disk_full(kafka_broker, tmp_path, CI)
    assert_survived(result)
    assert result.faults == {"disk full": CI.runs}


@needs_root
def test_disk_full_to_the_last_byte(kafka_broker, tmp_path) -> None:
    """A disk full to the last byte, checkpoints included: housekeeping survives a failed
    checkpoint (it keeps the previous one and retries) and the daemon stops cleanly."""
    result = disk_full_tenant(kafka_broker, tmp_path, CI)
    assert_survived(result)
    assert result.faults == {"disk full": CI.runs, "disk 100% full": CI.runs}
    assert result.counters.checkpoint_failures > 0  # the counters say what happened


def test_slow_disk(kafka_broker, tmp_path) -> None:
    result = slow_disk(kafka_broker, tmp_path, CI)
    assert_survived(result)
    assert result.faults["delayed write or fsync"] > 100
