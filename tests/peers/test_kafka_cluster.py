"""KafkaCluster: three real KRaft nodes, one quorum, topics led by every node."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from confluent_kafka import Producer

from replicad.types import TopicPartition
from tools.peers.kafka_cluster import KafkaCluster
from tools.peers.process import PeerError

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_three_nodes_lead_a_topic_together_and_stop_for_good(tmp_path):
    cluster = KafkaCluster(tmp_path / "cluster", nodes=3)
    with cluster:
        assert cluster.node_ids == [1, 2, 3]
        assert len(set(cluster.bootstrap.split(","))) == 3
        pids = cluster.pids
        assert len(pids) == 3

        # The nodes share one quorum: metadata from any node names all three brokers.
        for node in cluster.nodes:
            brokers = node.admin().list_topics(timeout=10).brokers
            assert sorted(brokers) == [1, 2, 3]

        cluster.create_topic("spread", 30, segment_bytes=64 * 1024)
        leaders = cluster.leaders("spread")
        assert len(leaders) == 30
        # RF 1 and round-robin placement: every node leads a third.
        assert Counter(leaders.values()) == {1: 10, 2: 10, 3: 10}

        producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
        for p in range(30):
            for i in range(p + 1):
                producer.produce("spread", value=b"v%d" % i, partition=p)
        assert producer.flush(30) == 0
        ends = cluster.end_offsets(["spread"])
        assert ends == {TopicPartition("spread", p): p + 1 for p in range(30)}

        # Each partition's segments live on its leader's node and nowhere else.
        for p in (0, 1, 2):
            here = cluster.partition_dir("spread", p)
            assert here.is_dir() and list(here.glob("*.log"))
            owner = cluster.node(leaders[p])
            assert here.is_relative_to(owner.log_dir)
            others = [n for n in cluster.nodes if n is not owner]
            assert not any(n.partition_dir("spread", p).exists() for n in others)

    assert cluster.pids == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ten_thousand_partitions_in_one_topic_are_refused_up_front(tmp_path):
    cluster = KafkaCluster(tmp_path / "unused")
    with pytest.raises(ValueError, match="several topics"):
        cluster.create_topic("too-wide", 10_000)
    with pytest.raises(PeerError, match="not been started"):
        _ = cluster.bootstrap
