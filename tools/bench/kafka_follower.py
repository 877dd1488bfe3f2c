"""replicad against Apache Kafka's own follower: a new replica catching up, same cluster.

One cluster of N KRaft nodes (default 3, tools/peers/kafka_cluster.py). A topic of P
partitions is created with every replica on node 1 and filled with `--gib` of the records
tools/bench/replicate.py uses (1 KiB, lz4, about 2:1). Then, taking turns, `--repeat` times:

- **Kafka's follower**: the partitions are reassigned to nodes [1, 2]
  (AlterPartitionReassignments through kafka-python's admin client); node 2 creates empty
  replicas and its replica fetcher threads catch them up from node 1. Done when node 2's
  segments hold as many bytes as node 1's (the follower copies the leader's batches as they
  are) and every partition's ISR holds node 2. Then the partitions are reassigned back to
  [1] and node 2 deletes its copy. Once with Kafka's default `num.replica.fetchers` (1),
  once with 2 (its docs: more fetcher threads "increase the degree of I/O parallelism in
  the follower broker"; this machine has 2 cores), set as a dynamic broker config.
- **replicad**: `replicad run` from the same cluster (so from node 1) into a new data
  directory, as installed; done when its segments hold the same bytes.

For each: wall seconds start to end and between 10% and 90% of the bytes, MB/s, and the CPU
seconds of the follower (node 2's JVM; replicad's process) and of the leader serving it
(node 1's JVM) over the same window. Node 2's JVM also runs a controller: its idle CPU
per second, measured before the first run, is printed beside it, not subtracted.

    .venv/bin/python -m tools.bench.kafka_follower [--gib 2] [--partitions 8] [--repeat 2]
        [--replica-fetch-mib N]

`--replica-fetch-mib N` starts the cluster with Kafka's follower fetch sizes raised (they are
read-only broker configs: set at start, for every Kafka row of the run):
`replica.fetch.max.bytes` N MiB a partition (default 1), `replica.fetch.response.max.bytes`
N MiB times the partitions (default 10 MiB) and `replica.socket.receive.buffer.bytes` 1 MiB
(default 64 KiB). Printed beside each Kafka row.

Issue 32's target: replicad >= 1.5x Kafka's follower at 2 fetchers, at <= 1/2 its CPU.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka import KafkaAdminClient

from tools.bench.kafka_settings import kafka_settings as broker_settings
from tools.bench.measure import STEADY_FROM, STEADY_TO, cpu_seconds, run_measured
from tools.bench.replicate import GB, MB, RECORD, child_env, log_bytes, produce
from tools.peers.kafka_cluster import KafkaCluster
from tools.replica import replicad_argv, run_args

LEADER, FOLLOWER = 1, 2
TOPIC = "catch-up"
POLL_S = 0.05
CATCH_UP_TIMEOUT_S = 1800.0
IDLE_PROBE_S = 5.0
# Issue 32.
TARGET_SPEED = 1.5
TARGET_CPU_SHARE = 0.5
KAFKA_DEFAULT_FETCHERS = 1
KAFKA_TUNED_FETCHERS = 2


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    settings: str
    wall_s: float
    steady_s: float | None
    follower_cpu_s: float
    leader_cpu_s: float

    def mb_per_s(self, stored: int) -> float:
        return stored / MB / self.wall_s

    def steady_mb_per_s(self, stored: int) -> float | None:
        if not self.steady_s:
            return None
        return stored * (STEADY_TO - STEADY_FROM) / 100 / MB / self.steady_s


def _cpu(pid: int) -> float:
    value = cpu_seconds(pid)
    if value is None:
        raise RuntimeError(f"process {pid} is gone")
    return value


def topic_bytes(directory: Path, partitions: int) -> int:
    """Bytes of the topic's `.log` segments in one node's log dir (exact directory names:
    a replica Kafka is deleting is renamed away and no longer counts)."""
    total = 0
    for p in range(partitions):
        for f in (directory / f"{TOPIC}-{p}").glob("*.log"):
            try:
                total += f.stat().st_size
            except FileNotFoundError:
                continue
    return total


def reassign(admin: KafkaAdminClient, partitions: int, replicas: list[int]) -> None:
    """AlterPartitionReassignments through kafka-python's admin client: no JVM of a
    command-line tool starting inside the measured time."""
    from kafka import TopicPartition as KafkaTopicPartition

    answers = admin.alter_partition_reassignments(
        {KafkaTopicPartition(TOPIC, p): replicas for p in range(partitions)}
    )
    refused = {str(tp): err for tp, err in answers.items() if err is not None}
    if refused or len(answers) != partitions:
        raise RuntimeError(f"reassignment to {replicas} refused or incomplete: {answers}")


def in_sync(admin: AdminClient, node: int) -> bool:
    meta = admin.list_topics(topic=TOPIC, timeout=30).topics[TOPIC]
    return all(node in part.isrs for part in meta.partitions.values())


def wait(condition: Callable[[], bool], what: str, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def set_fetchers(cluster: KafkaCluster, fetchers: int) -> None:
    """`num.replica.fetchers` as a dynamic broker config of every node (Kafka applies it to
    the running fetcher managers; no restart). Per broker, one a call: librdkafka refuses
    the empty name of the cluster-wide default and more than one broker in a request."""
    resources = [
        ConfigResource(
            ResourceType.BROKER,
            str(node_id),
            incremental_configs=[
                ConfigEntry(
                    "num.replica.fetchers",
                    str(fetchers),
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        for node_id in cluster.node_ids
    ]
    # One client for every call, referenced until its futures resolve: a client collected
    # meanwhile fails them ("handle destroyed").
    admin = cluster.admin()
    for resource in resources:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=60)


def fetch_config(fetch_mib: int | None, partitions: int) -> dict[str, str]:
    """The follower-side fetch sizes of `--replica-fetch-mib` (empty: Kafka's defaults)."""
    if fetch_mib is None:
        return {}
    return {
        "replica.fetch.max.bytes": str(fetch_mib * 2**20),
        "replica.fetch.response.max.bytes": str(fetch_mib * 2**20 * partitions),
        "replica.socket.receive.buffer.bytes": str(2**20),
    }


def kafka_settings(fetchers: int, fetch: dict[str, str]) -> str:
    text = f"num.replica.fetchers={fetchers}" + (
        " (default)" if fetchers == KAFKA_DEFAULT_FETCHERS else ""
    )
    if fetch:
        text += ", " + ", ".join(f"{k}={v}" for k, v in fetch.items())
    return text


def run_kafka_follower(
    cluster: KafkaCluster,
    reassigner: KafkaAdminClient,
    partitions: int,
    stored: int,
    fetchers: int,
    fetch: dict[str, str],
) -> Run:
    set_fetchers(cluster, fetchers)
    follower_dir = cluster.node(FOLLOWER).log_dir
    follower_pid, leader_pid = cluster.node(FOLLOWER).pid, cluster.node(LEADER).pid
    assert follower_pid is not None and leader_pid is not None
    admin = cluster.admin()
    follower_cpu, leader_cpu = _cpu(follower_pid), _cpu(leader_pid)
    started = time.monotonic()
    reassign(reassigner, partitions, [LEADER, FOLLOWER])
    marks: dict[int, float] = {}
    while True:
        done = topic_bytes(follower_dir, partitions)
        now = time.monotonic()
        for percent in (STEADY_FROM, STEADY_TO):
            if percent not in marks and done * 100 >= stored * percent:
                marks[percent] = now
        if done >= stored and in_sync(admin, FOLLOWER):
            break
        if now - started > CATCH_UP_TIMEOUT_S:
            raise RuntimeError(f"Kafka's follower did not catch up in {CATCH_UP_TIMEOUT_S} s")
        time.sleep(POLL_S)
    wall = time.monotonic() - started
    run = Run(
        kafka_name(fetchers),
        kafka_settings(fetchers, fetch),
        wall,
        _steady(marks),
        _cpu(follower_pid) - follower_cpu,
        _cpu(leader_pid) - leader_cpu,
    )
    # Back to one replica: node 2 deletes its copy (renamed away first, then removed).
    reassign(reassigner, partitions, [LEADER])
    wait(lambda: topic_bytes(follower_dir, partitions) == 0, "node 2 dropping its replica")
    return run


def run_replicad(cluster: KafkaCluster, work: Path, stored: int, index: int) -> Run:
    data_dir = work / f"replica-{index}"
    argv = replicad_argv(
        *run_args(cluster.bootstrap, TOPIC, data_dir, control_socket=work / "c.sock"),
        as_installed=True,
    )
    leader_pid = cluster.node(LEADER).pid
    assert leader_pid is not None
    leader_cpu = _cpu(leader_pid)
    measured = run_measured(
        argv,
        until=lambda: log_bytes(data_dir) >= stored,
        progress=lambda: log_bytes(data_dir) / stored,
        env=child_env(work),
        cwd=work,
    )
    leader_used = _cpu(leader_pid) - leader_cpu
    for f in data_dir.glob("*/*"):
        f.unlink()
    return Run(
        "replicad",
        "as installed (config defaults)",
        measured.wall_s,
        measured.steady_s,
        measured.cpu_s,
        leader_used,
    )


def kafka_name(fetchers: int) -> str:
    return f"Kafka follower, {fetchers} fetcher{'s' if fetchers > 1 else ''}"


def _steady(marks: dict[int, float]) -> float | None:
    if STEADY_FROM in marks and STEADY_TO in marks:
        window = marks[STEADY_TO] - marks[STEADY_FROM]
        return window if window > 0 else None
    return None


def idle_cpu_per_s(pid: int, seconds: float = IDLE_PROBE_S) -> float:
    before = _cpu(pid)
    time.sleep(seconds)
    return (_cpu(pid) - before) / seconds


def table(runs: list[Run], stored: int) -> str:
    lines = [
        "| follower | settings | seconds | MB/s | steady MB/s | follower CPU s | leader CPU s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        steady = run.steady_mb_per_s(stored)
        lines.append(
            f"| {run.name} | {run.settings} | {run.wall_s:.1f} | {run.mb_per_s(stored):.1f} | "
            f"{'n/a' if steady is None else f'{steady:.1f}'} | {run.follower_cpu_s:.1f} | "
            f"{run.leader_cpu_s:.1f} |"
        )
    return "\n".join(lines)


def best(runs: list[Run], name: str) -> Run | None:
    mine = [r for r in runs if r.name == name]
    return min(mine, key=lambda r: r.wall_s) if mine else None


def summary(runs: list[Run]) -> str:
    ours = best(runs, "replicad")
    lines = []
    for fetchers in (KAFKA_DEFAULT_FETCHERS, KAFKA_TUNED_FETCHERS):
        name = kafka_name(fetchers)
        theirs = best(runs, name)
        if ours is None or theirs is None:
            continue
        speed = theirs.wall_s / ours.wall_s
        cpu = ours.follower_cpu_s / theirs.follower_cpu_s
        line = f"- against {name} (best pass each): {speed:.2f}x its speed at {cpu:.2f} of its CPU"
        if fetchers == KAFKA_TUNED_FETCHERS:
            met = speed >= TARGET_SPEED and cpu <= TARGET_CPU_SHARE
            line += (
                f" (issue 32's target >= {TARGET_SPEED}x at <= {TARGET_CPU_SHARE} of its CPU: "
                f"{'met' if met else 'not met'})"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--replica-fetch-mib",
        type=int,
        default=None,
        help="raise Kafka's follower fetch sizes (MiB a partition) for every Kafka row",
    )
    args = parser.parse_args(argv)
    fetch = fetch_config(args.replica_fetch_mib, args.partitions)
    records = int(args.gib * 1024**3 / RECORD)
    with tempfile.TemporaryDirectory(prefix="replicad-bench-kf-") as tmp:
        work = Path(tmp)
        with KafkaCluster(
            work / "cluster", nodes=args.nodes, heap="1g", broker_config=fetch
        ) as cluster:
            cluster.create_replicated_topic(TOPIC, assignment=[[LEADER]] * args.partitions)
            t0 = time.monotonic()
            produce(cluster.bootstrap, TOPIC, args.partitions, records)
            stored = topic_bytes(cluster.node(LEADER).log_dir, args.partitions)
            print(
                f"  produced {records:,} records ({stored / GB:.2f} GB stored) in "
                f"{time.monotonic() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            follower_pid = cluster.node(FOLLOWER).pid
            assert follower_pid is not None
            idle = idle_cpu_per_s(follower_pid)
            runs: list[Run] = []
            reassigner = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            for i in range(args.repeat):
                for fetchers in (None, KAFKA_DEFAULT_FETCHERS, KAFKA_TUNED_FETCHERS):
                    if fetchers is None:
                        run = run_replicad(cluster, work, stored, i)
                    else:
                        run = run_kafka_follower(
                            cluster, reassigner, args.partitions, stored, fetchers, fetch
                        )
                    runs.append(run)
                    print(
                        f"  pass {i + 1}: {run.name}: {run.wall_s:.1f}s, "
                        f"{run.follower_cpu_s:.1f} CPU s",
                        file=sys.stderr,
                        flush=True,
                    )
            reassigner.close()
    print(
        f"{platform.node()}: {args.nodes}-node cluster, topic of {args.partitions} partitions "
        f"on node {LEADER}, {records:,} records of {RECORD} B (lz4), {stored / GB:.2f} GB "
        f"stored; {args.repeat} passes each, taking turns\n"
    )
    print(table(runs, stored))
    print()
    print(
        f"- node {FOLLOWER}'s JVM (the Kafka follower) used {idle:.2f} CPU s per second idle "
        "(its controller and housekeeping), counted in its CPU column"
    )
    print(summary(runs))
    print(f"- {broker_settings(nodes=args.nodes, bench=fetch)}, a 1 GiB heap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
