"""tools/chaos/leadership.py: replicad follows a leadership move on the session's real
three-node Apache Kafka cluster, ending with the scenarios' invariant (the replica equals
the current leader's segment files byte for byte; nothing acknowledged lost).

The suite runs one short seeded move, the reassignment: every partition's leader moves
to a node the seed picks, which held no replica of it, and no node stops. The moves that
restart nodes (a rolling restart, the busiest leader SIGKILLed, an unclean election) take
minutes each on two cores and run from their tool: `python -m tools.chaos.leadership`
(`make chaos-leadership`). The CLI is tested here without a cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos import leadership
from tools.chaos.scenarios import CI
from tools.peers.kafka_cluster import KafkaCluster

# One run, a few partitions.
SIZE = CI
# first, second, third = 2, 1, 3: the topic is placed on nodes 2 and 1, and every leader
# moves from node 2 to node 3.
SEED = 29


def test_replicad_follows_a_seeded_leader_move(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    scenario = leadership.SCENARIOS[leadership.SUITE_SCENARIO]
    result = scenario(kafka_cluster, tmp_path, SIZE, SEED)
    print(result.summary())
    assert result.ok, result.summary()
    assert result.runs == SIZE.runs
    assert result.faults == {"reassignment": 1}
    assert result.records_checked > 0
    assert (result.lost, result.duplicated) == (0, 0)
    # The move was followed, and timed.
    assert result.recovery_s, result.summary()
    assert all(node.running for node in kafka_cluster.nodes)


def test_the_seed_picks_the_nodes_and_every_order_is_reachable() -> None:
    class Nodes:
        node_ids = [1, 2, 3]

    cluster: KafkaCluster = Nodes()  # type: ignore[assignment]
    orders = {tuple(leadership._seeded_nodes(cluster, seed)) for seed in range(50)}
    assert len(orders) == 6
    assert leadership._seeded_nodes(cluster, SEED) == [2, 1, 3]


def test_the_tool_names_an_unknown_scenario_and_lists_the_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        leadership.main(["cluster-rolling-restrat"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "no scenario cluster-rolling-restrat" in err
    for name in leadership.SCENARIOS:
        assert name in err


def test_every_scenario_of_the_tool_takes_a_seed() -> None:
    import inspect

    for name, scenario in leadership.SCENARIOS.items():
        assert "seed" in inspect.signature(scenario).parameters, name


class _StoppedNode:
    """A node of a stand-in cluster: what all_nodes_running asks of it, in order."""

    def __init__(self, name: str, calls: list[str], *, running: bool, ready: bool = True) -> None:
        self.name, self.calls, self.running, self.ready = name, calls, running, ready
        self.start_timeout_s = 1.0

    def prepare(self) -> None:
        self.calls.append(f"prepare {self.name}")

    def launch(self) -> None:
        self.calls.append(f"launch {self.name}")

    def wait_ready(self, timeout_s: float) -> None:
        self.calls.append(f"wait {self.name}")
        if not self.ready:
            raise leadership.PeerError(f"{self.name} did not register\nits log's tail")

    def kill(self) -> None:
        self.calls.append(f"kill {self.name}")


class _Cluster:
    def __init__(self, nodes: list[_StoppedNode]) -> None:
        self.nodes = nodes


def test_every_stopped_node_is_launched_before_any_is_waited_for() -> None:
    # Two of three down: one started and waited for alone would wait for a quorum that
    # needs the other (session 15's soak lost its whole cluster that way).
    calls: list[str] = []
    nodes = [
        _StoppedNode("1", calls, running=False),
        _StoppedNode("2", calls, running=True),
        _StoppedNode("3", calls, running=False),
    ]
    leadership.all_nodes_running(_Cluster(nodes))  # type: ignore[arg-type]
    assert calls == ["prepare 1", "launch 1", "prepare 3", "launch 3", "wait 1", "wait 3"]


def test_a_node_that_does_not_come_back_is_killed_and_named_after_the_others_were_waited_for() -> (
    None
):
    calls: list[str] = []
    nodes = [
        _StoppedNode("1", calls, running=False, ready=False),
        _StoppedNode("3", calls, running=False),
    ]
    with pytest.raises(leadership.PeerError, match=r"^1 did not register$"):
        leadership.all_nodes_running(_Cluster(nodes))  # type: ignore[arg-type]
    assert calls[-3:] == ["wait 1", "kill 1", "wait 3"]
