"""The suite-sized version of every fault scenario of docs/reliability.md, against real Kafka.

Each test runs one scenario of `tools.chaos.scenarios` at size SUITE and asserts what the
reliability table promises: faults were injected, records were checked, none was lost
or duplicated, the daemon survived and stopped cleanly, and its counters explain the
faults. The scenario's summary is printed (visible with -s or on failure).

SUITE is the report's size `ci` with one round of each fault instead of two: every kind
of fault is still injected and recovered from, in half the time (the network scenario's
faults hold for about 12 s a round). The table of docs/reliability.md, two rounds, is
`python -m tools.chaos.report`; its `full` size, six rounds of three runs, is the long run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

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
from tools.peers.kafka import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SUITE = dataclasses.replace(CI, name="suite", rounds=1)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker of this module's own, for the scenarios that kill and restart the broker and
    the one that needs an 8-slot session cache: one broker start (a JVM, 10-30 s) instead of
    one per test. The leader scenarios run one follower, so the small cache holds its one
    session; every scenario makes topics of its own."""
    from tests.conftest import _running

    yield from _running(
        KafkaBroker(
            tmp_path_factory.mktemp("own-kafka"),
            broker_config={
                "max.incremental.fetch.session.cache.slots": str(TINY_SESSION_CACHE_SLOTS)
            },
        )
    )


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
    result = network_faults(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.faults == dict.fromkeys(NETWORK_FAULTS, SUITE.rounds)
    assert len(result.recovery_s) == SUITE.rounds * len(NETWORK_FAULTS)
    assert result.counters.errors > 0
    assert result.counters.session_recoveries > 0


def test_corrupt_batches_are_caught_and_refetched(kafka_broker, tmp_path) -> None:
    result = corrupt_batches(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    flips = result.faults["flipped byte in a batch"]
    assert flips == SUITE.rounds * 6
    assert result.counters.crc_failures == flips


def test_follower_sigkill(kafka_broker, tmp_path) -> None:
    result = follower_sigkill(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.faults == {"SIGKILL": SUITE.rounds * 3}
    # A crash leaves a prefix of the leader's log: nothing for the leader to contradict.
    assert result.counters.truncations == 0


def test_leader_sigkill_and_restart(own_broker, tmp_path) -> None:
    broker = own_broker
    killed = leader_sigkill(broker, tmp_path / "kill", SUITE)
    assert_survived(killed)
    assert killed.faults == {"broker SIGKILL": leader_rounds(SUITE)}
    assert killed.counters.truncations == 0  # the broker's log did not diverge from ours
    restarted = leader_restart(broker, tmp_path / "restart", SUITE)
    assert_survived(restarted)
    assert restarted.faults == {"broker restart": leader_rounds(SUITE)}
    assert restarted.counters.session_recoveries >= leader_rounds(SUITE)


def test_session_cache_pressure(own_broker, tmp_path) -> None:
    result = session_cache_pressure(own_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.counters.session_recoveries > 0


# A full disk is a tmpfs of a set size under the data directory; only root may mount one.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a disk of a set size (a tmpfs mount) needs root"
)


@needs_root
def test_disk_full(kafka_broker, tmp_path) -> None:
    """Partitions pause with whole batches only and resume when space comes back."""
    result = disk_full(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.faults == {"disk full": SUITE.runs}


@needs_root
def test_disk_full_to_the_last_byte(kafka_broker, tmp_path) -> None:
    """A disk full to the last byte, checkpoints included: housekeeping survives a failed
    checkpoint (it keeps the previous one and retries) and the daemon stops cleanly."""
    result = disk_full_tenant(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.faults == {"disk full": SUITE.runs, "disk 100% full": SUITE.runs}
    assert result.counters.checkpoint_failures > 0  # the counters say what happened


def test_slow_disk(kafka_broker, tmp_path) -> None:
    result = slow_disk(kafka_broker, tmp_path, SUITE)
    assert_survived(result)
    assert result.faults["delayed write or fsync"] > 100
