"""tools/chaos/leadership.py: replicad follows leadership moves on the session's real
three-node Apache Kafka cluster, each scenario ending with its invariant (the replica
equals the current leader's segment files byte for byte; nothing acknowledged lost)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos import leadership
from tools.chaos.scenarios import CI
from tools.peers.kafka_cluster import KafkaCluster

# One run of each move, a few partitions: the moves themselves (node restarts) are
# most of the time.
SIZE = CI


@pytest.mark.parametrize("name", sorted(leadership.SCENARIOS))
def test_replicad_follows_the_move(kafka_cluster: KafkaCluster, tmp_path: Path, name: str) -> None:
    result = leadership.SCENARIOS[name](kafka_cluster, tmp_path, SIZE)
    print(result.summary())
    assert result.ok, result.summary()
    assert result.runs == SIZE.runs
    assert result.records_checked > 0
    assert (result.lost, result.duplicated) == (0, 0)
    # Every move was followed, and timed.
    assert result.recovery_s, result.summary()
    assert all(node.running for node in kafka_cluster.nodes)
