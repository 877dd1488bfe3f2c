"""KafkaCluster: three real KRaft nodes, one quorum, topics led by every node."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from replicad.types import TopicPartition
from tools.peers.kafka_cluster import KafkaCluster
from tools.peers.process import PeerError
from tools.peers.produce import CheckedProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_three_nodes_lead_a_topic_together(kafka_cluster, unique_topic):
    """On the session's cluster. That no node's process is left when it ends is checked
    where that cluster ends, in tests/conftest.py, on every run that starts it; a private
    cluster here cost the suite half a minute of its own start-up."""
    cluster = kafka_cluster
    assert cluster.node_ids == [1, 2, 3]
    assert len(set(cluster.bootstrap.split(","))) == 3
    pids = cluster.pids
    assert len(pids) == 3
    for pid in pids:
        os.kill(pid, 0)  # alive

    # The nodes share one quorum: metadata from any node names all three brokers.
    for node in cluster.nodes:
        brokers = node.admin().list_topics(timeout=10).brokers
        assert sorted(brokers) == [1, 2, 3]

    topic = unique_topic()
    cluster.create_topic(topic, 30, segment_bytes=64 * 1024)
    leaders = cluster.leaders(topic)
    assert len(leaders) == 30
    # RF 1 and round-robin placement: every node leads a third.
    assert Counter(leaders.values()) == {1: 10, 2: 10, 3: 10}

    producer = CheckedProducer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for p in range(30):
        for i in range(p + 1):
            producer.produce(topic, value=b"v%d" % i, partition=p)
    assert producer.flush(30) == 0
    ends = cluster.end_offsets([topic])
    assert ends == {TopicPartition(topic, p): p + 1 for p in range(30)}

    # Each partition's segments live on its leader's node and nowhere else.
    for p in (0, 1, 2):
        here = cluster.partition_dir(topic, p)
        assert here.is_dir() and list(here.glob("*.log"))
        owner = cluster.node(leaders[p])
        assert here.is_relative_to(owner.log_dir)
        others = [n for n in cluster.nodes if n is not owner]
        assert not any(n.partition_dir(topic, p).exists() for n in others)


def test_ten_thousand_partitions_in_one_topic_are_refused_up_front(tmp_path):
    cluster = KafkaCluster(tmp_path / "unused")
    with pytest.raises(ValueError, match="several topics"):
        cluster.create_topic("too-wide", 10_000)
    with pytest.raises(PeerError, match="not been started"):
        _ = cluster.bootstrap
