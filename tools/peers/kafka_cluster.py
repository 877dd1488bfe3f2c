"""A real multi-broker Apache Kafka cluster for tests: N KRaft nodes on 127.0.0.1.

Each node is a `KafkaBroker` (tools/peers/kafka.py) in combined mode
(broker + controller); the N controllers form one static quorum
(`controller.quorum.voters` names all of them), and every node is formatted
with the same cluster id. Combined nodes were chosen over one controller plus
N brokers because that is N JVMs instead of N + 1, and on a 2-core machine the
JVMs' start-up is most of the wait; a 3-voter quorum elects its leader within
a second of the second node coming up.

Topics are created with replication factor 1, so each partition has exactly
one leader and Kafka spreads the leaders round-robin over the nodes: a
follower of such a topic fetches from every node (one fetch session per
leader). A combined node cannot serve until a majority of the voters runs, so
all nodes are launched before the first is waited for.

    cluster = KafkaCluster(workdir, nodes=3, heap="512m")
    with cluster:
        cluster.create_topic("wide", 2_500)
        cluster.leaders("wide")        # {partition: node id}
        cluster.end_offsets(["wide"])  # {TopicPartition: log end}

Work directories: `<workdir>/node-<id>/` per node, laid out as KafkaBroker's.
Ports are picked free at the first start and kept across restarts.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import IsolationLevel
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from replicad.types import TopicPartition
from tools.peers.admin import admin_client, create_one_topic
from tools.peers.broker import BIND_ATTEMPTS
from tools.peers.kafka import KafkaBroker, KafkaTopics, _new_cluster_id, topic_config
from tools.peers.process import LOOPBACK, PeerError, free_port, wait_until
from tools.peers.service import Service
from tools.wait import DEADLINE_S

DEFAULT_NODES = 3
# Small heaps: the suite's topics of replication factor 1 cost a broker well under this,
# and three 1 GiB JVMs would compete with the process under test for memory. 10,000
# partitions of replication factor 3 do not fit (a node died of OutOfMemoryError in
# session 12): the soak gives its nodes more (tools/chaos/soak_sources.cluster_node_heap).
CLUSTER_HEAP = "768m"
FIRST_NODE_ID = 1
# How long one metadata or ListOffsets round over the whole cluster may take.
PROBE_TIMEOUT_S = 30.0


def served_probe_interval_s(partitions: int) -> float:
    """How often a new topic's partitions are probed until all are served: a topic of a test
    is served a moment after CreateTopics answers, so a second's wait would be most of its
    creation; a probe of thousands of partitions is a bulk ListOffsets, sent once a second."""
    return 0.1 if partitions <= 100 else 1.0


# Kafka's controller refuses a single request that makes more than 10,000 metadata
# records (QuorumController's per-operation cap); a topic costs one record per
# partition plus a few, so 10,000 partitions must be spread over several topics.
MAX_PARTITIONS_PER_TOPIC = 9_000

_log = logging.getLogger(__name__)


def cluster_broker_config(nodes: int) -> dict[str, str]:
    """What a cluster's nodes get on top of `harness_broker_config()`.

    Internal topics stay at replication factor 1 (a test of RF 1 topics needs no
    more). The controller snapshots less often than its default so that creating
    thousands of partitions is not slowed by snapshot writing.
    """
    return {
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "default.replication.factor": "1",
        "metadata.log.max.record.bytes.between.snapshots": str(256 * 1024 * 1024),
        # One thread per core is plenty for loopback tests on small machines.
        "num.network.threads": "2",
        "num.io.threads": str(max(2, nodes)),
    }


class _ClusterNode(KafkaBroker):
    """A KafkaBroker that is one voter of a shared quorum, on ports the cluster chose."""

    def __init__(
        self,
        workdir: Path,
        *,
        node_id: int,
        ports: tuple[int, int],
        voters: str,
        cluster_id: str,
        broker_config: Mapping[str, str],
        heap: str,
    ) -> None:
        # KafkaBroker writes its own single-voter quorum; the caller's config wins over it.
        config = {**broker_config, "controller.quorum.voters": voters}
        super().__init__(workdir, broker_config=config, heap=heap)
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._port, self._controller_port = ports


class KafkaCluster(KafkaTopics, Service):
    """`nodes` Apache Kafka nodes (combined broker + controller), one quorum, in `workdir`.

    `broker_config` is given to every node on top of the harness's and the
    cluster's own settings. `segment_bytes` is the default segment size of the
    topics `create_topic` makes.
    """

    what = "Kafka cluster"
    CREATE_TIMEOUT_S = DEADLINE_S

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = DEFAULT_NODES,
        broker_config: Mapping[str, str] | None = None,
        segment_bytes: int | None = None,
        heap: str = CLUSTER_HEAP,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.workdir = Path(workdir).resolve()
        self.segment_bytes = segment_bytes
        self._count = nodes
        self._config = {**cluster_broker_config(nodes), **(broker_config or {})}
        self._heap = heap
        self.nodes: list[KafkaBroker] = []

    # -- addresses -------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's client listener, comma-separated (any one of them would do)."""
        if not self.nodes:
            raise PeerError("the Kafka cluster has not been started yet: no addresses")
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.nodes]

    def node(self, node_id: int) -> KafkaBroker:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in the cluster (nodes {self.node_ids})")

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self.nodes if node.pid is not None]

    # -- life cycle ------------------------------------------------------------------

    def start(self, timeout_s: float = 300) -> None:
        """Format every node (in parallel), launch them all, wait until each serves metadata."""
        started = time.monotonic()
        for attempt in range(1, BIND_ATTEMPTS + 1):
            first_start = not self.nodes
            if first_start:
                self.nodes = list(self._make_nodes())
            nodes = [node for node in self.nodes if isinstance(node, _ClusterNode)]
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda node: node.prepare(), nodes))
            for node in nodes:
                node.launch()
            try:
                for node in nodes:
                    node.wait_ready(max(1.0, timeout_s - (time.monotonic() - started)))
            except PeerError:
                taken = any(node.bind_failed() for node in nodes)
                self.kill()
                if first_start and taken and attempt < BIND_ATTEMPTS:
                    _log.warning("kafka cluster: a port was taken, retrying on new ports")
                    # Formatted for the old ports' quorum: start over from nothing.
                    for node in nodes:
                        shutil.rmtree(node.workdir, ignore_errors=True)
                    self.nodes = []
                    continue
                raise
            _log.info(
                "kafka cluster %s up in %.1f s (workdir %s)",
                self.bootstrap,
                time.monotonic() - started,
                self.workdir,
            )
            return

    def stop(self, timeout_s: float = 30) -> None:
        """Controlled shutdown of all nodes at once (one by one, the last would wait for
        a quorum that is gone); SIGKILL what takes longer than `timeout_s`."""
        if self.nodes:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda node: node.stop(timeout_s), self.nodes))

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    @contextlib.contextmanager
    def stopped(self, node_id: int, timeout_s: float = 120) -> Iterator[None]:
        """One node stopped (controlled shutdown) for the block, then started again on the
        same ports with the same data: a cluster shared between tests stays whole."""
        node = self.node(node_id)
        node.stop()
        try:
            yield
        finally:
            node.start(timeout_s)

    # -- topics ----------------------------------------------------------------------

    def admin(self) -> AdminClient:
        return admin_client(self.bootstrap)

    def create_replicated_topic(
        self,
        name: str,
        config: Mapping[str, str] | None = None,
        *,
        partitions: int | None = None,
        replication_factor: int = DEFAULT_NODES,
        assignment: Sequence[Sequence[int]] | None = None,
        segment_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """A topic whose partitions have `replication_factor` replicas, or the replicas of an
        explicit `assignment` (one list per partition, preferred leader first), back once
        every partition is served. For tests where leadership moves between nodes."""
        if (partitions is None) == (assignment is None):
            raise ValueError("give either partitions or an assignment")
        size = segment_bytes if segment_bytes is not None else self.segment_bytes
        settings = topic_config(size, config)
        if assignment is not None:
            # librdkafka wants the partition count and no replication factor with an
            # assignment (-1 partitions would mean "the broker's default").
            new_topic = NewTopic(
                name,
                num_partitions=len(assignment),
                replication_factor=-1,
                replica_assignment=[list(r) for r in assignment],
                config=settings,
            )
        else:
            new_topic = NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                config=settings,
            )
        self._create_and_wait(
            [new_topic], self.CREATE_TIMEOUT_S if timeout_s is None else timeout_s
        )

    def _create_topics(
        self, names: list[str], partitions: int, settings: dict[str, str], timeout_s: float
    ) -> None:
        # Leaders spread over the nodes; served means every partition has a leader that
        # answers ListOffsets.
        if partitions > MAX_PARTITIONS_PER_TOPIC:
            raise ValueError(
                f"{partitions:,} partitions in one topic exceeds what the controller accepts in "
                f"one operation; use several topics of at most {MAX_PARTITIONS_PER_TOPIC:,}"
            )
        self._create_and_wait(
            [
                NewTopic(name, num_partitions=partitions, replication_factor=1, config=settings)
                for name in names
            ],
            timeout_s,
        )

    def _create_and_wait(self, topics: list[NewTopic], timeout_s: float) -> None:
        admin = self.admin()
        names = [t.topic for t in topics]
        for new_topic in topics:
            create_one_topic(admin, self.bootstrap, new_topic, timeout_s)
        wanted = [
            TopicPartition(t.topic, p)
            for t in topics
            for p in range(t.num_partitions if t.num_partitions > 0 else len(t.replica_assignment))
        ]

        def all_served() -> bool | None:
            # A leader in metadata is not enough: the broker may not have opened the log
            # yet (NOT_LEADER_OR_FOLLOWER); ListOffsets answers only once it has. A fresh
            # client each time: librdkafka remembers a topic it was told is unknown.
            served = self._list_offsets(self.admin(), wanted, OffsetSpec.latest())
            return True if len(served) == len(wanted) else None

        wait_until(
            all_served,
            timeout_s=timeout_s,
            what=f"{len(wanted):,} partitions of {names} served",
            interval_s=served_probe_interval_s(len(wanted)),
            alive=self._dead_nodes,
        )

    def leaders(self, topic: str) -> dict[int, int]:
        """{partition: leader node id} from the cluster's metadata."""
        meta = self.admin().list_topics(topic=topic, timeout=PROBE_TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None:
            raise PeerError(f"topic {topic!r} not found on {self.bootstrap}")
        return {p: part.leader for p, part in meta.partitions.items()}

    def partition_dir(self, topic: str, partition: int) -> Path:
        """The leader's own directory of one partition's segments."""
        return self.node(self.leaders(topic)[partition]).partition_dir(topic, partition)

    def end_offsets(self, topics: Iterable[str]) -> dict[TopicPartition, int]:
        """Every partition's log end offset (ListOffsets latest, read_uncommitted)."""
        admin = self.admin()
        wanted = [TopicPartition(topic, p) for topic in topics for p in sorted(self.leaders(topic))]
        return self._list_offsets(admin, wanted, OffsetSpec.latest())

    def _dead_nodes(self) -> str | None:
        dead = [str(node.node_id) for node in self.nodes if not node.running]
        return f"node(s) {', '.join(dead)} exited (see their broker.out)" if dead else None

    @staticmethod
    def _list_offsets(
        admin: AdminClient, wanted: list[TopicPartition], spec: OffsetSpec
    ) -> dict[TopicPartition, int]:
        """One ListOffsets round for all of `wanted` (librdkafka sends one request per
        leader); raises when any partition fails."""
        futures = admin.list_offsets(
            {KafkaTopicPartition(tp.topic, tp.partition): spec for tp in wanted},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=PROBE_TIMEOUT_S,
        )
        found: dict[TopicPartition, int] = {}
        for where, future in futures.items():
            found[TopicPartition(where.topic, where.partition)] = future.result().offset
        return found

    # -- internals -------------------------------------------------------------------

    def _make_nodes(self) -> Iterable[_ClusterNode]:
        ids = range(FIRST_NODE_ID, FIRST_NODE_ID + self._count)
        ports: dict[int, tuple[int, int]] = {}
        taken: set[int] = set()
        for node_id in ids:
            pair = []
            while len(pair) < 2:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    pair.append(port)
            ports[node_id] = (pair[0], pair[1])
        voters = ",".join(f"{n}@{LOOPBACK}:{ports[n][1]}" for n in ids)
        cluster_id = _new_cluster_id()
        for node_id in ids:
            yield _ClusterNode(
                self.workdir / f"node-{node_id}",
                node_id=node_id,
                ports=ports[node_id],
                voters=voters,
                cluster_id=cluster_id,
                broker_config=self._config,
                heap=self._heap,
            )
