"""The soak's sources: the peer the long soak replicates from, and the faults it can suffer.

- `kafka`: one Apache Kafka broker (KRaft, combined node). A leader SIGKILL is the broker
  killed and started again; a rolling restart is its controlled restart (one node is the
  whole roll). The producers pause while it is down: there is nothing to produce to, and a
  producer cut off inside a transaction leaves it open until the broker times it out.
- `kafka-cluster`: three KRaft nodes (tools/peers/kafka_cluster.py), topics of replication
  factor 3 and `min.insync.replicas` 2, the producers going on throughout. A leader SIGKILL
  kills the node leading most partitions (tools/chaos/leadership.py's choice), waits until
  every partition has another leader, starts the node again and waits until every replica
  is back in sync; a rolling restart is leadership.py's: a controlled shutdown and start of
  each node in the seed's order, each back in sync before the next, then a preferred-leader
  election.
- `tansu`: one Tansu broker (tools/peers/tansu.py), memory storage by default: a restart
  empties it, so a leader SIGKILL and a rolling restart cannot be done. On S3 storage (a
  bucket of the test S3 server, versitygw: `--tansu-storage s3`) what it held survives, and
  both are done as on one Kafka broker (a SIGTERM restart is its controlled one). It opens
  no fetch sessions (KIP-227), so there is no session to evict. `cannot` says so and the
  soak skips them.

Session evictions (tools/chaos/evictor.py) need a broker whose session cache has one slot
per shard (`max.incremental.fetch.session.cache.slots` 8): the soak's own Kafka peers are
started so (`SMALL_SESSION_CACHE`); a broker without it cannot have the fault.

A source fault has two parts: what it does (a node killed, restarted) and the source's own
recovery from it (a node serving again, every replica back in sync), each waited for up to
a deadline. A recovery that does not come in time raises `SourceNotRecovered`: the soak
reports it as the source's ("source not recovered in N s") and goes on; it does not fail
replicad's verdict, whose checks (stalls, verify, the invariant, lag, memory) still do.

Each source gives the addresses the fault proxies stand in front of (one per node), the
source's ends as a consumer sees them, read in bulk (the cluster: one ListOffsets for many
partitions; one broker: its segment files; Tansu: Fetch's high watermark, many partitions a
request, since its ListOffsets "latest" under-reports), and for Kafka the invariant against
the current leaders' own segment files (tools/chaos/invariant.py); Tansu keeps no files, so
`replicad verify --against-source` is its only oracle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from confluent_kafka import ElectionType, IsolationLevel, KafkaException

from replicad.types import TopicPartition
from tools.chaos.invariant import InvariantReport, check_partition, check_replica, end_offsets
from tools.chaos.load import SteadyLoad
from tools.chaos.scenarios import wait_for
from tools.peers.admin import latest_offsets
from tools.peers.kafka import KafkaBroker
from tools.peers.kafka_cluster import CLUSTER_HEAP, DEFAULT_NODES, KafkaCluster
from tools.peers.process import PeerError
from tools.peers.tansu import TansuBroker

Address = tuple[str, int]

SEGMENT_BYTES = 1024 * 1024
CACHE_SLOTS_KEY = "max.incremental.fetch.session.cache.slots"
# One slot in each of Kafka's 8 session-cache shards: a privileged session evicts any.
SMALL_SESSION_CACHE = {CACHE_SLOTS_KEY: "8"}
CLUSTER_TOPIC_CONFIG = {"min.insync.replicas": "2"}
CLUSTER_REPLICATION = 3
# Deadlines only a hang reaches (three JVMs on two shared cores take minutes to start).
LEADERS_TIMEOUT_S = 300
# 1,000 partitions of replication factor 3 were not all served within the harness's 120 s at
# load 50: a hang's deadline, not a guess at the time it takes.
CREATE_TIMEOUT_S = 900
IN_SYNC_TIMEOUT_S = 600
# The soak's cluster nodes' heap: a base plus a share per replica a node hosts (3 nodes,
# replication factor 3: every node hosts every partition). Session 12: a node of 768 MiB
# died of OutOfMemoryError (Java heap space) with 10,000 partitions, taking over a killed
# node's leaders; 1,000 partitions ran in it all of session 11. An estimate from those two
# points, rounded up to HEAP_STEP_MIB, never below the harness's CLUSTER_HEAP.
NODE_HEAP_BASE_MIB = 512
NODE_HEAP_PER_REPLICA_KIB = 100
HEAP_STEP_MIB = 128


class SourceNotRecovered(PeerError):
    """The source did not recover from a fault within its deadline: the source's own
    failure, not replicad's (the soak reports it apart)."""

    def __init__(self, what: str, deadline_s: float) -> None:
        super().__init__(f"source not recovered in {deadline_s:.0f} s: {what}")
        self.what = what
        self.deadline_s = deadline_s


def serving_again(start: Callable[[], None], what: str, deadline_s: float) -> None:
    """`start` a node again; its failure to serve in time is the source's (SourceNotRecovered)."""
    try:
        start()
    except SourceNotRecovered:
        raise
    except PeerError as exc:
        raise SourceNotRecovered(f"{what} not serving again ({exc})"[:300], deadline_s) from exc


LEADER_SIGKILL = "leader-sigkill"
ROLLING_RESTART = "rolling-restart"
SESSION_EVICTIONS = "session-evictions"
DISK_FULL = "disk-full"


# The bucket a Tansu on S3 stores in.
TANSU_BUCKET = "tansu"


class SoakSource:
    """What the soak needs of its source; see the module doc for each kind."""

    name = "source"

    @property
    def bootstrap(self) -> str:
        raise NotImplementedError

    def upstreams(self) -> list[Callable[[], Address]]:
        """One address per node (a callable: a node picks its port when it starts)."""
        raise NotImplementedError

    def create_topics(self, topics: Mapping[str, int]) -> None:
        raise NotImplementedError

    def ends(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int] | None:
        """Each partition's high watermark; None while the source cannot say."""
        raise NotImplementedError

    def cannot(self, fault: str) -> str | None:
        """Why this source cannot have `fault` (None: it can)."""
        return None

    def evictor_bootstraps(self) -> list[str]:
        """Where a session evictor goes: every node."""
        return []

    def leader_sigkill(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        raise NotImplementedError

    def rolling_restart(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        raise NotImplementedError

    def invariant(
        self, data_dir: Path, partitions: Sequence[TopicPartition]
    ) -> InvariantReport | None:
        """The replica against the leaders' own files; None: the source keeps none."""
        return None

    def restore(self) -> None:
        """After a fault that failed half-way: every node running again."""

    def recovered(self, topics: Sequence[str]) -> bool:
        """Whether the source is whole again: every node serving (and, on a cluster, every
        replica in sync)."""
        return True


def _small_cache(config: Mapping[str, str]) -> bool:
    return config.get(CACHE_SLOTS_KEY) == SMALL_SESSION_CACHE[CACHE_SLOTS_KEY]


def _no_eviction(config: Mapping[str, str]) -> str | None:
    if _small_cache(config):
        return None
    return (
        f"the broker's session cache is not {SMALL_SESSION_CACHE[CACHE_SLOTS_KEY]} slots "
        "(one per shard), so a privileged session evicts nothing"
    )


class OneBrokerSource(SoakSource):
    """A source of one broker (Kafka or Tansu): one proxy in front of it, topics created on it
    with `topic_options`."""

    # Keyword arguments of the broker's create_topic.
    topic_options: Mapping[str, int] = {}

    def __init__(self, broker: KafkaBroker | TansuBroker) -> None:
        self.broker = broker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def upstreams(self) -> list[Callable[[], Address]]:
        return [lambda: ("127.0.0.1", self.broker.port)]

    def create_topics(self, topics: Mapping[str, int]) -> None:
        for name, partitions in topics.items():
            self.broker.create_topic(name, partitions, **self.topic_options)

    def leader_sigkill(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        load.pause()
        try:
            self.broker.kill()
            serving_again(self.broker.start, "the broker", self.broker.start_timeout_s)
        finally:
            load.resume()
        return "the broker SIGKILLed and started again"

    def rolling_restart(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        load.pause()
        try:
            serving_again(self.broker.restart, "the broker", self.broker.start_timeout_s)
        finally:
            load.resume()
        return "the broker restarted (controlled shutdown)"

    def restore(self) -> None:
        if not self.broker.running:
            self.broker.start()

    def recovered(self, topics: Sequence[str]) -> bool:
        return self.broker.running


class KafkaSource(OneBrokerSource):
    name = "kafka"
    topic_options = {"segment_bytes": SEGMENT_BYTES}
    broker: KafkaBroker

    def ends(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int] | None:
        return end_offsets(self.broker.log_dir, partitions)

    def cannot(self, fault: str) -> str | None:
        if fault == SESSION_EVICTIONS:
            return _no_eviction(getattr(self.broker, "_config", {}))
        return None

    def evictor_bootstraps(self) -> list[str]:
        return [self.broker.bootstrap]

    def invariant(
        self, data_dir: Path, partitions: Sequence[TopicPartition]
    ) -> InvariantReport | None:
        return check_replica(self.broker.log_dir, data_dir, partitions, caught_up=True)


class ClusterSource(SoakSource):
    name = "kafka-cluster"

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster = cluster

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def upstreams(self) -> list[Callable[[], Address]]:
        return [
            (lambda node=node: ("127.0.0.1", node.port))  # type: ignore[misc]
            for node in self.cluster.nodes
        ]

    def create_topics(self, topics: Mapping[str, int]) -> None:
        for name, partitions in topics.items():
            self.cluster.create_replicated_topic(
                name,
                CLUSTER_TOPIC_CONFIG,
                partitions=partitions,
                replication_factor=CLUSTER_REPLICATION,
                segment_bytes=SEGMENT_BYTES,
                timeout_s=CREATE_TIMEOUT_S,
            )

    def ends(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int] | None:
        """The high watermarks, one ListOffsets round a topic, with a deadline for
        thousands of partitions on a loaded cluster (LIST_OFFSETS_TIMEOUT_S; the harness's
        probe gives a round 5 s)."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        admin = self.cluster.admin()
        try:
            return {
                TopicPartition(topic, p): end
                for topic, numbers in by_topic.items()
                for p, end in latest_offsets(
                    admin, topic, numbers, isolation=IsolationLevel.READ_UNCOMMITTED
                ).items()
            }
        except (KafkaException, PeerError, TimeoutError):
            return None  # a partition without a leader for the moment

    def cannot(self, fault: str) -> str | None:
        if fault == SESSION_EVICTIONS:
            return _no_eviction(getattr(self.cluster, "_config", {}))
        return None

    def evictor_bootstraps(self) -> list[str]:
        return [node.bootstrap for node in self.cluster.nodes]

    def leader_sigkill(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        from tools.chaos.leadership import _most_leading

        victim = _most_leading(self.cluster, topics[0], rng.randrange(1 << 30))
        node = self.cluster.node(victim)
        node.kill()
        moved = wait_for(lambda: self._led_without(victim, topics), LEADERS_TIMEOUT_S, interval_s=1)
        serving_again(node.start, f"node {victim}", node.start_timeout_s)
        self._wait_in_sync(topics)
        took = "did not move" if moved is None else f"moved in {moved:.0f} s"
        return f"node {victim} SIGKILLed (its leaders {took}), started again, back in sync"

    def rolling_restart(self, rng: random.Random, load: SteadyLoad, topics: Sequence[str]) -> str:
        from tools.chaos.leadership import _seeded_nodes, elect

        order = _seeded_nodes(self.cluster, rng.randrange(1 << 30))
        for node_id in order:
            node = self.cluster.node(node_id)
            node.stop()
            serving_again(node.start, f"node {node_id}", node.start_timeout_s)
            self._wait_in_sync(topics)
        partitions = [TopicPartition(t, p) for t in topics for p in self.cluster.leaders(t)]
        elect(self.cluster, ElectionType.PREFERRED, partitions)
        return f"nodes {order} restarted in turn, then a preferred-leader election"

    def restore(self) -> None:
        from tools.chaos.leadership import all_nodes_running

        all_nodes_running(self.cluster)

    def recovered(self, topics: Sequence[str]) -> bool:
        return all(node.running for node in self.cluster.nodes) and self._in_sync(topics)

    def invariant(
        self, data_dir: Path, partitions: Sequence[TopicPartition]
    ) -> InvariantReport | None:
        leaders: dict[str, dict[int, int]] = {}
        checks = []
        for tp in partitions:
            if tp.topic not in leaders:
                leaders[tp.topic] = self.cluster.leaders(tp.topic)
            node = self.cluster.node(leaders[tp.topic][tp.partition])
            checks.append(
                check_partition(
                    tp,
                    node.partition_dir(tp.topic, tp.partition),
                    data_dir / f"{tp.topic}-{tp.partition}",
                    caught_up=True,
                )
            )
        return InvariantReport(tuple(checks))

    def _led_without(self, victim: int, topics: Sequence[str]) -> bool:
        try:
            return all(
                0 <= leader != victim
                for topic in topics
                for leader in self.cluster.leaders(topic).values()
            )
        except (KafkaException, PeerError):
            return False

    def _in_sync(self, topics: Sequence[str]) -> bool:
        from tools.chaos.leadership import replicas_and_isr

        try:
            return all(
                set(replicas) <= set(isr)
                for topic in topics
                for replicas, isr in replicas_and_isr(self.cluster, topic).values()
            )
        except (KafkaException, PeerError, TimeoutError):
            return False

    def _wait_in_sync(self, topics: Sequence[str]) -> None:
        if wait_for(lambda: self._in_sync(topics), IN_SYNC_TIMEOUT_S, interval_s=1) is None:
            raise SourceNotRecovered("replicas not back in sync", IN_SYNC_TIMEOUT_S)


class TansuSource(OneBrokerSource):
    name = "tansu"
    broker: TansuBroker

    def ends(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int] | None:
        """Fetch's high watermarks, many partitions a request on one connection, each
        fetched past its end (no records read): one connection and one fetch from offset 0
        a partition took more than 10 minutes for 10,000 at load 35 (session 13)."""
        from tools.peers.wire import high_watermarks

        try:
            return high_watermarks(self.bootstrap, partitions)
        except (OSError, PeerError):
            return None

    def cannot(self, fault: str) -> str | None:
        if fault in (LEADER_SIGKILL, ROLLING_RESTART) and not self.broker.durable:
            return (
                "Tansu runs on memory storage here: a restart would empty it (--tansu-storage s3)"
            )
        if fault == SESSION_EVICTIONS:
            return "Tansu opens no fetch sessions (every Fetch is a full one)"
        return None


def as_source(peer: object) -> SoakSource:
    """The soak's view of a peer: a KafkaBroker, a KafkaCluster or a TansuBroker."""
    if isinstance(peer, SoakSource):
        return peer
    if isinstance(peer, KafkaCluster):
        return ClusterSource(peer)
    if isinstance(peer, KafkaBroker):
        return KafkaSource(peer)
    if isinstance(peer, TansuBroker):
        return TansuSource(peer)
    raise TypeError(f"no soak source for {type(peer).__name__}")


def heap_mib(heap: str) -> int:
    """A JVM heap size (`768m`, `2g`) in MiB."""
    units = {"m": 1, "g": 1024}
    number, unit = heap[:-1], heap[-1:].lower()
    if unit not in units or not number.isdigit():
        raise ValueError(f"a heap is a number of MiB or GiB (768m, 2g), not {heap!r}")
    return int(number) * units[unit]


def cluster_node_heap(
    partitions: int, *, nodes: int = DEFAULT_NODES, replication: int = CLUSTER_REPLICATION
) -> str:
    """The soak's cluster nodes' heap for `partitions` of `replication` over `nodes`: 768m up
    to about 2,600 partitions, 1536m at 10,000."""
    hosted = -(-partitions * min(replication, nodes) // nodes)  # replicas on one node
    wanted = NODE_HEAP_BASE_MIB + hosted * NODE_HEAP_PER_REPLICA_KIB / 1024
    stepped = -(-int(wanted) // HEAP_STEP_MIB) * HEAP_STEP_MIB
    return f"{max(stepped, heap_mib(CLUSTER_HEAP))}m"


def start_peer(
    kind: str,
    workdir: Path,
    broker_config: Mapping[str, str] | None = None,
    *,
    heap: str | None = None,
    s3_endpoint: str | None = None,
) -> object:
    """A peer of `kind` (not started: use it as a context manager); `heap`: a Kafka node's
    (the harness's own when None); `s3_endpoint`: Tansu stores in the bucket `tansu` there
    (it must exist) instead of memory."""
    heaps = {} if heap is None else {"heap": heap}
    if kind == "kafka":
        return KafkaBroker(
            workdir, broker_config={**SMALL_SESSION_CACHE, **(broker_config or {})}, **heaps
        )
    if kind == "kafka-cluster":
        return KafkaCluster(
            workdir, broker_config={**SMALL_SESSION_CACHE, **(broker_config or {})}, **heaps
        )
    if kind == "tansu":
        if s3_endpoint is not None:
            return TansuBroker.on_s3(workdir, s3_endpoint, TANSU_BUCKET)
        return TansuBroker(workdir)
    raise ValueError(f"no source {kind!r}: kafka, kafka-cluster or tansu")


SOURCES = ("kafka-cluster", "kafka", "tansu")
