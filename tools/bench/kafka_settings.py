"""The Kafka settings a bench's brokers run with, said under its table.

The benches start Kafka through tools/peers (one broker, or a cluster of KRaft nodes):
Kafka's defaults, but what the test harness sets for every broker
(`harness_broker_config`: replication factors of one node, no topic auto-creation, a
4 s broker session, the controller's no-op record every 5 s of quiet, ...), what a
cluster adds (`cluster_broker_config`), and what the bench itself sets. One line for all
three, from the same functions the brokers are configured with, so what is printed is what
ran.
"""

from __future__ import annotations

from collections.abc import Mapping

from tools.peers.kafka import harness_broker_config
from tools.peers.kafka_cluster import cluster_broker_config


def kafka_settings(*, nodes: int | None = None, bench: Mapping[str, str] | None = None) -> str:
    """`nodes`: a cluster of that many nodes (None: one broker); `bench`: the bench's own
    broker settings, which win."""
    settings = harness_broker_config()
    if nodes is not None:
        settings.update(cluster_broker_config(nodes))
    settings.update(bench or {})
    where = f"each of the {nodes} nodes" if nodes is not None else "the broker"
    return f"Kafka ({where}): its defaults but " + ", ".join(
        f"{key}={value}" for key, value in settings.items()
    )
