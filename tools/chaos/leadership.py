"""Leadership moves on a real three-node Apache Kafka cluster while replicad follows it.

Production clusters move leaders all the time: rolling restarts, a node that dies,
preferred-leader elections, reassignments, and (where it is allowed) unclean elections.
Every scenario here runs on `tools.peers.kafka_cluster.KafkaCluster` with an idempotent
`acks=all` producer running throughout (`AckedLoad`, confluent-kafka), and:

1. creates its own topic (1 MiB segments): replication factor 3 and
   `min.insync.replicas` 2, unless the scenario says otherwise;
2. starts replicad (`tools.chaos.follower.Follower`) and the producer;
3. moves leadership; after each move, measures how long replicad took to follow: from
   the move until the replica holds everything the cluster's leaders held at that moment
   (ListOffsets) and the first records produced after it;
4. stops the producer, waits for the cluster to settle and the replica to catch up, stops
   replicad with SIGTERM (exit 0 expected), and checks: each partition of the replica
   equals, byte for byte, the segment files of its current leader
   (`tools.chaos.invariant.check_partition`, the broker's bytes as the oracle); every
   record the producer had acknowledged is in the replica (at or above the log start,
   below the replica's end, and no fewer records than were acknowledged); `replicad
   verify` passes.

The unclean election is the exception the brief names: the node elected holds less than
replicad already copied, so acknowledged records are gone from the cluster and replicad
must truncate to the new leader's log through a real broker's DivergingEpoch. Its check
is that the replica equals the new leader's log and that replicad truncated.

Nodes are always started again before a scenario returns: the cluster is shared.

Each scenario takes a seed: it orders the nodes the scenario picks from (the node a
partition moves to, the order of a rolling restart, which node an unclean election
elects), so a failing run can be repeated exactly.

The suite runs one short seeded move (`tests/faults/test_leadership.py`: the
reassignment, no node restarted); every scenario, at any size, runs from here:

    python -m tools.chaos.leadership                      # all four, size ci
    python -m tools.chaos.leadership cluster-rolling-restart --seed 7 --size full
    make chaos-leadership                                 # all four, size ci

on a three-node cluster of its own (`KafkaCluster` in a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import ElectionType, IsolationLevel, KafkaException, Producer, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import OffsetSpec

from replicad.types import TopicPartition
from tools.chaos.follower import Follower
from tools.chaos.invariant import check_partition, covers, end_offsets
from tools.chaos.load import wait_stable
from tools.chaos.scenarios import SIZES, ScenarioResult, Size, _Outcome, _started, wait_for
from tools.peers.kafka import run_kafka_class
from tools.peers.kafka_cluster import KafkaCluster
from tools.peers.process import PeerError

SEGMENT_BYTES = 1024 * 1024
REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
# The producer's pace: enough to see every move mid-stream, little enough for two cores.
RECORDS_PER_S = 400
# librdkafka retries a produce across leader moves until this runs out; far above any
# move here, so nothing acknowledged is ever a retry that gave up.
MESSAGE_TIMEOUT_MS = 300_000
IN_SYNC_TIMEOUT_S = 120
ADMIN_TIMEOUT_S = 30
ELECTION_TIMEOUT_S = 180


class AckedLoad:
    """An idempotent `acks=all` producer in a thread, remembering what was acknowledged.

    Values are a running sequence number, spread over the partitions; `acked` maps each
    partition to the offsets the brokers acknowledged; delivery failures are counted.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            }
        )
        self.acked: dict[int, list[int]] = defaultdict(list)
        self.failed: list[str] = []
        self.produced = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._run, name="acked-load", daemon=True)

    def start(self) -> AckedLoad:
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop producing and wait until everything produced so far is acknowledged."""
        self._running.clear()
        time.sleep(0.05)
        self._producer.flush(MESSAGE_TIMEOUT_MS / 1000)

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(60)
        self._producer.flush(MESSAGE_TIMEOUT_MS / 1000)

    @property
    def acked_count(self) -> int:
        with self._lock:
            return sum(len(offsets) for offsets in self.acked.values())

    def _delivered(self, err: object, msg: object) -> None:
        with self._lock:
            if err is not None:
                self.failed.append(str(err))
            else:
                self.acked[msg.partition()].append(msg.offset())  # type: ignore[attr-defined]

    def _run(self) -> None:
        interval = 1.0 / RECORDS_PER_S
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                break
            seq = self.produced
            try:
                self._producer.produce(
                    self.topic,
                    value=f"{seq:012d}".encode() * 8,
                    key=str(seq).encode(),
                    partition=seq % self.partitions,
                    on_delivery=self._delivered,
                )
                self.produced += 1
            except BufferError:
                pass  # the local queue is full while a leader moves: poll, then go on
            self._producer.poll(interval)


class Abandoned(Exception):
    """A run that could not start; its problem is in the outcome."""


@dataclass
class _Run:
    """One scenario run: its topic, the producer, replicad, and the outcome they feed."""

    out: _Outcome
    cluster: KafkaCluster
    topic: str
    partitions: list[TopicPartition]
    follower: Follower
    load: AckedLoad

    def source_ends(self) -> dict[TopicPartition, int] | None:
        """The leaders' ends (ListOffsets), None while some partition has no leader."""
        wanted = {
            KafkaTopicPartition(tp.topic, tp.partition): OffsetSpec.latest()
            for tp in self.partitions
        }
        try:
            # The client must outlive its futures: a dropped one fails them (_DESTROY).
            admin = self.cluster.admin()
            futures = admin.list_offsets(
                wanted,
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=ADMIN_TIMEOUT_S,
            )
            return {
                TopicPartition(where.topic, where.partition): future.result(
                    timeout=ADMIN_TIMEOUT_S + 5
                ).offset
                for where, future in futures.items()
            }
        except (KafkaException, PeerError, TimeoutError):
            # A partition without a leader for the moment, or a node not answering.
            return None

    def follow(self, what: str) -> float | None:
        """Seconds from now until the replica holds what the leaders hold now and the
        first records produced after now; a problem of the outcome if it does not."""
        started = time.monotonic()
        deadline = self.out.size.recovery_timeout_s
        target: dict[TopicPartition, int] = {}

        def source_read() -> bool:
            ends = self.source_ends()
            if ends is None:
                return False
            target.update(ends)
            return True

        if wait_for(source_read, deadline) is None:
            self.out.problem(f"no leader for every partition within {deadline:.0f} s of {what}")
            return None
        first = dict(target)
        grew = wait_for(
            lambda: source_read() and not covers(first, target), deadline, interval_s=0.1
        )
        if grew is None:
            self.out.problem(f"the source did not grow within {deadline:.0f} s after {what}")
            return None
        # Until the high watermark moves again no consumer sees new records, replicad
        # included: with acks=all it waits for the ISR to shrink (Kafka's
        # replica.lag.time.max.ms, 30 s by default) when a follower replica dies.
        stalled = time.monotonic() - started
        goal = dict(target)
        took = wait_for(
            lambda: covers(self.follower.ends(self.partitions), goal) or not self.follower.running,
            deadline,
            interval_s=0.1,
        )
        if took is None or not self.follower.running:
            self.out.problem(f"replicad did not follow {what} within {deadline:.0f} s")
            return None
        elapsed = time.monotonic() - started
        self.out.recovery_s.append(elapsed)
        self.out.note(
            f"{what}: followed in {elapsed:.1f} s, of which the source's high watermark "
            f"stood still {stalled:.1f} s"
        )
        return elapsed


def replicas_and_isr(cluster: KafkaCluster, topic: str) -> dict[int, tuple[list[int], list[int]]]:
    """{partition: (replicas, in-sync replicas)} from DescribeTopics."""
    admin = cluster.admin()  # kept until the answer is in: a dropped client fails it
    future = admin.describe_topics(TopicCollection([topic]), request_timeout=ADMIN_TIMEOUT_S)[topic]
    description = future.result(timeout=ADMIN_TIMEOUT_S + 5)
    return {
        p.id: ([n.id for n in p.replicas], [n.id for n in p.isr]) for p in description.partitions
    }


def wait_in_sync(cluster: KafkaCluster, topic: str, out: _Outcome) -> None:
    """Until every replica of every partition is in sync again (a restarted node caught up)."""

    def in_sync() -> bool:
        try:
            described = replicas_and_isr(cluster, topic)
        except (KafkaException, TimeoutError):
            return False
        return all(set(replicas) <= set(isr) for replicas, isr in described.values())

    if wait_for(in_sync, IN_SYNC_TIMEOUT_S, interval_s=0.5) is None:
        out.problem(f"{topic}: replicas not back in sync within {IN_SYNC_TIMEOUT_S} s")


def elect(cluster: KafkaCluster, kind: ElectionType, partitions: Sequence[TopicPartition]) -> None:
    """ElectLeaders for `partitions`, asked again until it is answered (ELECTION_NOT_NEEDED
    counts: the controller may have elected already). Right after a node is killed the
    request can go unanswered for a while: when the killed node was the active
    controller, the quorum elects another first (seen under load: 35 s and more)."""
    wanted = [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]
    deadline = time.monotonic() + ELECTION_TIMEOUT_S
    while True:
        admin = cluster.admin()  # kept until the answer is in: a dropped client fails it
        # No request_timeout: confluent-kafka 2.16 rejects any keyword here (SystemError).
        future = admin.elect_leaders(kind, wanted)
        try:
            answers = future.result(timeout=ADMIN_TIMEOUT_S + 5)
        except (KafkaException, TimeoutError) as exc:
            failed = [f"{kind.name} election: {exc!r}"]
        else:
            failed = [
                f"{kind.name} election of {where}: {error}"
                for where, error in answers.items()
                if error is not None and "ELECTION_NOT_NEEDED" not in str(error)
            ]
        if not failed:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("; ".join(failed))
        time.sleep(1)


def all_nodes_running(cluster: KafkaCluster) -> None:
    """Start again every node a scenario left stopped: the cluster is shared. Every stopped
    node is launched before any is waited for: a node registers only with a quorum of
    controllers, so with two of three down, one started alone would wait for the other."""
    stopped = [node for node in cluster.nodes if not node.running]
    for node in stopped:
        node.prepare()
        node.launch()
    failed: list[str] = []
    for node in stopped:
        try:
            node.wait_ready(node.start_timeout_s)
        except PeerError as exc:
            node.kill()
            failed.append(str(exc).splitlines()[0])
    if failed:
        raise PeerError("; ".join(failed))


@contextlib.contextmanager
def scenario_run(
    out: _Outcome,
    cluster: KafkaCluster,
    workdir: Path,
    *,
    replication_factor: int = 3,
    assignment: Sequence[Sequence[int]] | None = None,
    config: dict[str, str] | None = None,
) -> Iterator[_Run]:
    """A topic, the producer and replicad, started; the invariant checked at the end."""
    out.runs += 1
    size = out.size
    topic = f"lead-{out.name}-{uuid.uuid4().hex[:8]}"
    count = len(assignment) if assignment is not None else size.partitions
    cluster.create_replicated_topic(
        topic,
        {"min.insync.replicas": "2", **(config or {})},
        partitions=None if assignment is not None else count,
        replication_factor=replication_factor,
        assignment=assignment,
        segment_bytes=SEGMENT_BYTES,
    )
    partitions = [TopicPartition(topic, p) for p in range(count)]
    follower = Follower(workdir / f"{out.name}-{out.runs}", cluster.bootstrap, [topic])
    load = AckedLoad(cluster.bootstrap, topic, count).start()
    run = _Run(out, cluster, topic, partitions, follower, load)
    try:
        if not _started(out, follower, partitions):
            raise Abandoned
        yield run
        all_nodes_running(cluster)
        _finish(run)
    finally:
        follower.kill()
        load.stop()
        all_nodes_running(cluster)


def _finish(run: _Run) -> None:
    out, cluster, follower = run.out, run.cluster, run.follower
    run.load.stop()
    if run.load.failed:
        out.problem(f"{len(run.load.failed)} produce requests failed: {run.load.failed[:3]}")
    wait_in_sync(cluster, run.topic, out)
    target = wait_stable(lambda: run.source_ends() or {})
    caught_up = wait_for(
        lambda: covers(follower.ends(run.partitions), target) or not follower.running,
        out.size.recovery_timeout_s,
    )
    if caught_up is None:
        out.problem(f"replica did not catch up: {follower.ends(run.partitions)} vs {target}")
    follower.status()
    code = follower.stop() if follower.running else follower.exit_code()
    out.daemon.append("ran to the end, stopped cleanly" if code == 0 else f"exit {code}")
    if code != 0:
        out.problem(f"replicad exited with {code}: {follower.output()[-1500:]}")
    for line in follower.unexpected_lines()[:5]:
        out.problem(f"replicad log: {line[:500]}")
    out.counters = out.counters + follower.counters()
    current = cluster.leaders(run.topic)
    replica_ends = follower.ends(run.partitions)
    for tp in run.partitions:
        source_dir = cluster.node(current[tp.partition]).partition_dir(tp.topic, tp.partition)
        check = check_partition(
            tp, source_dir, follower.data_dir / f"{tp.topic}-{tp.partition}", caught_up=True
        )
        out.records_checked += check.records_checked
        out.lost += check.lost
        out.duplicated += check.duplicated
        if check.problem:
            out.problem(f"invariant {tp}: {check.problem}")
    if out.name != "cluster-unclean-election":
        _acknowledged_kept(run, replica_ends)
    verify = follower.verify()
    if verify.returncode != 0:
        out.problem(f"replicad verify failed: {(verify.stdout + verify.stderr)[-2000:]}")


def _acknowledged_kept(run: _Run, replica_ends: dict[TopicPartition, int]) -> None:
    """Every acknowledged offset below the replica's end, and as many records held."""
    for partition, offsets in run.load.acked.items():
        tp = TopicPartition(run.topic, partition)
        missing = [o for o in offsets if o >= replica_ends.get(tp, 0)]
        if missing:
            run.out.lost += len(missing)
            run.out.problem(f"{tp}: {len(missing)} acknowledged records beyond the replica's end")
        if len(set(offsets)) != len(offsets):
            run.out.problem(f"{tp}: the producer was acknowledged twice at one offset")


def _most_leading(cluster: KafkaCluster, topic: str, seed: int) -> int:
    """The node leading most of `topic`'s partitions; the seed breaks a tie."""
    counts: dict[int, int] = defaultdict(int)
    for node in cluster.leaders(topic).values():
        counts[node] += 1
    return max(_seeded_nodes(cluster, seed), key=lambda node: counts[node])


def _seeded_nodes(cluster: KafkaCluster, seed: int) -> list[int]:
    """The cluster's node ids in the order `seed` gives them."""
    nodes = list(cluster.node_ids)
    random.Random(seed).shuffle(nodes)
    return nodes


# -- the scenarios ------------------------------------------------------------------------


def leader_node_sigkill(
    cluster: KafkaCluster, workdir: Path, size: Size, seed: int = 0
) -> ScenarioResult:
    """SIGKILL of the node leading most partitions; replicad follows the new leaders, then
    the node's restart (it rejoins as a follower)."""
    out = _Outcome("cluster-leader-sigkill", "SIGKILL of the busiest leader, then restart", size)
    for _ in range(size.runs):
        with contextlib.suppress(Abandoned), scenario_run(out, cluster, workdir) as run:
            victim = _most_leading(cluster, run.topic, seed)
            cluster.node(victim).kill()
            out.fault("sigkill")
            run.follow(f"SIGKILL of node {victim}")
            cluster.node(victim).start()
            out.fault("restart")
            wait_in_sync(cluster, run.topic, out)
            run.follow(f"restart of node {victim}")
    return out.result()


def rolling_restart(
    cluster: KafkaCluster, workdir: Path, size: Size, seed: int = 0
) -> ScenarioResult:
    """Controlled shutdown and restart of each node in turn (a rolling restart), then a
    preferred-leader election that moves leadership back to the node that lost it."""
    out = _Outcome(
        "cluster-rolling-restart", "controlled shutdown of each node, preferred election", size
    )
    for _ in range(size.runs):
        with contextlib.suppress(Abandoned), scenario_run(out, cluster, workdir) as run:
            for node_id in _seeded_nodes(cluster, seed):
                cluster.node(node_id).stop()
                out.fault("controlled-shutdown")
                run.follow(f"controlled shutdown of node {node_id}")
                cluster.node(node_id).start()
                wait_in_sync(cluster, run.topic, out)
            before = cluster.leaders(run.topic)
            elect(cluster, ElectionType.PREFERRED, run.partitions)
            out.fault("preferred-election")
            after = cluster.leaders(run.topic)
            moved = sum(1 for p in before if before[p] != after[p])
            out.note(f"the preferred election moved {moved} of {len(before)} leaders")
            run.follow("the preferred-leader election")
    return out.result()


def reassignment(cluster: KafkaCluster, workdir: Path, size: Size, seed: int = 0) -> ScenarioResult:
    """A partition reassignment (Kafka's ReassignPartitionsCommand, AlterPartitionReassignments)
    that moves each partition's leader to a node that held no replica of it (the seed picks
    the nodes), then a preferred-leader election onto it. No node stops."""
    out = _Outcome("cluster-reassignment", "leader moved to a node with no replica", size)
    first, second, third = _seeded_nodes(cluster, seed)[:3]
    for _ in range(size.runs):
        assignment = [[first, second]] * size.partitions
        with (
            contextlib.suppress(Abandoned),
            scenario_run(out, cluster, workdir, replication_factor=2, assignment=assignment) as run,
        ):
            plan = workdir / f"{run.topic}-reassignment.json"
            plan.write_text(
                json.dumps(
                    {
                        "version": 1,
                        "partitions": [
                            {"topic": run.topic, "partition": p, "replicas": [third, second]}
                            for p in range(size.partitions)
                        ],
                    }
                )
            )
            run_kafka_class(
                REASSIGN,
                "--bootstrap-server",
                cluster.bootstrap,
                "--reassignment-json-file",
                str(plan),
                "--execute",
            )
            out.fault("reassignment")

            def moved() -> bool:
                try:
                    described = replicas_and_isr(cluster, run.topic)
                except (KafkaException, TimeoutError):
                    return False
                return all(
                    replicas == [third, second] and set(isr) == {third, second}
                    for replicas, isr in described.values()
                )

            if wait_for(moved, IN_SYNC_TIMEOUT_S, interval_s=0.5) is None:
                out.problem(f"the reassignment did not complete within {IN_SYNC_TIMEOUT_S} s")
            elect(cluster, ElectionType.PREFERRED, run.partitions)
            now = cluster.leaders(run.topic)
            if set(now.values()) != {third}:
                out.problem(f"leaders after the reassignment: {now}, expected node {third}")
            run.follow(f"the reassignment to node {third}")
    return out.result()


def unclean_election(
    cluster: KafkaCluster, workdir: Path, size: Size, seed: int = 0
) -> ScenarioResult:
    """Unclean leader election: RF 2, the in-sync follower stopped first, records acked by
    the leader alone and copied by replicad, the leader killed, the stale follower elected
    (ElectLeaders UNCLEAN). The new leader holds less than replicad: replicad must truncate
    to its log (DivergingEpoch from a real broker) and follow it."""
    out = _Outcome("cluster-unclean-election", "stale follower elected uncleanly", size)
    first, second = _seeded_nodes(cluster, seed)[:2]
    for _ in range(size.runs):
        assignment = [[first, second]] * size.partitions
        config = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
        with (
            contextlib.suppress(Abandoned),
            scenario_run(
                out, cluster, workdir, replication_factor=2, assignment=assignment, config=config
            ) as run,
        ):
            wait_in_sync(cluster, run.topic, out)
            cluster.node(second).stop()
            out.fault("follower-stopped")
            run.follow(f"node {second} stopped (records now acked by node {first} alone)")
            run.load.pause()
            held = wait_stable(lambda: run.source_ends() or {})
            wait_for(lambda held=held: covers(run.follower.ends(run.partitions), held), 60)
            ahead = run.follower.ends(run.partitions)
            run.follower.status()
            truncations_before = run.follower.counters().truncations
            cluster.node(first).kill()
            out.fault("leader-sigkill")
            cluster.node(second).start()
            elect(cluster, ElectionType.UNCLEAN, run.partitions)
            out.fault("unclean-election")
            # The new leader's own log end (nothing is produced while it is read).
            stale = end_offsets(cluster.node(second).log_dir, run.partitions)
            lost = sum(max(0, ahead[tp] - stale[tp]) for tp in run.partitions)
            out.note(
                f"the unclean election dropped {lost} records replicad had already copied "
                f"(replica ends {sorted(ahead.values())}, new leader {sorted(stale.values())})"
            )
            # The new leader lost the producer's state with its records: an idempotent
            # producer that goes on is refused (OUT_OF_ORDER_SEQUENCE_NUMBER), as Kafka
            # intends. A new producer (a new producer id) carries on.
            run.load.stop()
            run.load = AckedLoad(cluster.bootstrap, run.topic, len(run.partitions)).start()
            run.follow(f"the unclean election of node {second}")
            run.follower.status()
            truncated = run.follower.counters().truncations - truncations_before
            if lost and truncated <= 0:
                out.problem(
                    "the new leader held less than the replica, and replicad never truncated"
                )
            cluster.node(first).start()
            out.fault("old-leader-back")
    return out.result()


SCENARIOS: dict[str, Callable[[KafkaCluster, Path, Size, int], ScenarioResult]] = {
    "cluster-leader-sigkill": leader_node_sigkill,
    "cluster-rolling-restart": rolling_restart,
    "cluster-reassignment": reassignment,
    "cluster-unclean-election": unclean_election,
}
# The one the suite runs: a real leader move with no node stopped (about 20 s).
SUITE_SCENARIO = "cluster-reassignment"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tools.chaos.leadership",
        description="Leadership moves on a three-node Apache Kafka cluster of its own while "
        "replicad follows; exit 1 if any scenario found a problem.",
    )
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"any of {', '.join(SCENARIOS)} (all)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="ci")
    parser.add_argument("--workdir", type=Path, help="keep the cluster's and replicad's files")
    args = parser.parse_args(argv)
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}; there are {', '.join(SCENARIOS)}")
    names = args.scenarios or list(SCENARIOS)
    failed = []
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="replicad-leadership-"))
        )
        cluster = stack.enter_context(KafkaCluster(workdir / "kafka-cluster"))
        for name in names:
            print(f"== {name} (size {args.size}, seed {args.seed})", flush=True)
            result = SCENARIOS[name](cluster, workdir / name, SIZES[args.size], args.seed)
            print(result.summary(), flush=True)
            if not result.ok:
                failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
