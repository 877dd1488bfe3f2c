"""A source with tiered storage on a 3-node Kafka cluster (issue 34): topics whose first
segments exist only in remote storage, replicated by `replicad run` from offset 0 while the
leader of a partition is SIGKILLed and started again, then proved byte for byte.

    nice -n 19 .venv/bin/python -m tools.chaos.tiered_cluster [--partitions 3] [--seed 0]
        [--records 3000] [--keep DIR]

1. Three Kafka nodes (KRaft, combined roles), tiered storage on (tools/peers/tiered.py:
   Kafka's LocalTieredStorage, one directory all three share, as Kafka's own tests run it;
   the remote log metadata topic at replication factor 3).
2. A topic of `--partitions` partitions, replication factor 3, min.insync.replicas 2, 8 KiB
   segments, remote storage on and local retention of one byte / one second: records are
   produced (acks=all) until every partition's EARLIEST_LOCAL (-4) is past 0 -- its first
   segments are in remote storage only.
3. `replicad run` replicates the topic from offset 0 (the leaders serve the remote segments
   to its fetches). Meanwhile, by seed, the leader of one partition is SIGKILLed, more records
   are produced to the survivors, and the node is started again.
4. Once replicad has caught up with every partition's end: `replicad verify
   --against-source` must be clean from offset 0 with nothing gone at the source, and every
   batch LocalTieredStorage holds must be in the replica with the same bytes at the same
   offset.
Exit 0 when all of it holds, 1 with what did not. Not in CI (three JVMs take minutes to start
on a loaded machine); the single-node version is tests/follower/test_tiered_kafka.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from replicad.protocol.apis import ApiKey
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.requests import OffsetQuery, list_offsets_request
from replicad.types import TopicPartition
from tools.peers.kafka_cluster import KafkaCluster
from tools.peers.tiered import (
    TIERED_TOPIC_CONFIG,
    batches_by_offset,
    batches_of,
    remote_segment_files,
    tiered_broker_config,
)
from tools.replica import replicad_cli, replicad_run, segment_bytes
from tools.wait import wait_until

EARLIEST_LOCAL_TIMESTAMP = -4
SEGMENT_BYTES = 8 * 1024
ROUND_RECORDS = 200
NODES = 3


def earliest_local(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Each partition's EARLIEST_LOCAL (-4), asked of its leader."""

    async def ask() -> dict[TopicPartition, int]:
        client = KafkaClient(bootstrap.split(","), ClientSettings())
        try:
            cluster = await client.metadata(sorted({tp.topic for tp in tps}))
            found = {}
            for tp in tps:
                leader = cluster.leader_of(tp)
                if leader is None:
                    found[tp] = -1
                    continue
                conn = await client.connection(leader.leader_id)
                assert conn.versions is not None
                version = conn.versions.require(ApiKey.LIST_OFFSETS)
                body = await conn.request(
                    list_offsets_request(version, {tp: OffsetQuery(EARLIEST_LOCAL_TIMESTAMP)})
                )
                answer = body.topics[0].partitions[0]
                found[tp] = int(answer.offset) if int(answer.error_code) == 0 else -1
            return found
        finally:
            await client.close()

    return asyncio.run(ask())


def produce(bootstrap: str, topic: str, partitions: int, first: int, count: int) -> int:
    """`count` records spread over the partitions (acks=all); the next record number."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 4096, "acks": "all"}
    )
    for i in range(first, first + count):
        producer.produce(topic, value=b"%08d" % i + b"t" * 200, partition=i % partitions)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records not acknowledged")
    return first + count


def run(work: Path, *, partitions: int, seed: int, records: int) -> list[str]:
    """The scenario of the module doc; the problems found (none: it held)."""
    rng = random.Random(seed)
    storage = work / "remote"
    storage.mkdir(parents=True)
    config = {
        **tiered_broker_config(storage),
        "rlmm.config.remote.log.metadata.topic.replication.factor": str(NODES),
    }
    problems: list[str] = []
    started = time.monotonic()
    with KafkaCluster(work / "kafka", nodes=NODES, broker_config=config) as cluster:
        print(f"{NODES} nodes up in {time.monotonic() - started:.0f} s", flush=True)
        topic = f"tiered-{uuid.uuid4().hex[:8]}"
        cluster.create_replicated_topic(
            topic,
            {**TIERED_TOPIC_CONFIG, "min.insync.replicas": "2"},
            partitions=partitions,
            replication_factor=NODES,
            segment_bytes=SEGMENT_BYTES,
        )
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        produced = produce(cluster.bootstrap, topic, partitions, 0, records)

        def remote_only() -> bool:
            nonlocal produced
            if min(earliest_local(cluster.bootstrap, tps).values()) > 0:
                return True
            produced = produce(cluster.bootstrap, topic, partitions, produced, ROUND_RECORDS)
            return False

        wait_until(remote_only, timeout_s=600, interval_s=1.0, what="first segments remote only")
        print(f"remote only from {earliest_local(cluster.bootstrap, tps)}", flush=True)
        data_dir = work / "replica"
        with replicad_run(cluster.bootstrap, [topic], data_dir) as proc:
            proc.wait_ready()
            victim_tp = rng.choice(tps)
            victim = cluster.node(cluster.leaders(topic)[victim_tp.partition])
            print(f"SIGKILL node {victim.node_id} (leader of {victim_tp})", flush=True)
            victim.kill()
            produced = produce(cluster.bootstrap, topic, partitions, produced, 4 * ROUND_RECORDS)
            victim.start()
            print(f"node {victim.node_id} started again", flush=True)
            produced = produce(cluster.bootstrap, topic, partitions, produced, ROUND_RECORDS)
            ends = cluster.end_offsets([topic])
            proc.wait_caught_up(ends, timeout_s=600)
        done = replicad_cli(
            "verify",
            str(data_dir),
            "--against-source",
            "--bootstrap-servers",
            cluster.bootstrap,
            "--json",
        )
        report = json.loads(done.stdout) if done.stdout.strip() else {"partitions": []}
        if done.returncode != 0:
            problems.append(f"verify --against-source exited {done.returncode}")
        for entry in report["partitions"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            if not entry["clean"] or entry["gone_at_source"] or entry["verified_to"] != ends[tp]:
                problems.append(f"verify of {tp}: {entry}")
        remote_batches = 0
        for tp in tps:
            remote = batches_by_offset(remote_segment_files(storage, topic, tp.partition))
            if not remote or min(remote) != 0:
                problems.append(f"{tp}: remote storage does not start at offset 0")
            replica_bytes = segment_bytes(data_dir / f"{topic}-{tp.partition}")
            replica = batches_of(replica_bytes)
            for base, batch in remote.items():
                if replica.get(base) != batch:
                    problems.append(f"{tp}: the remote batch at {base} differs in the replica")
                    break
            remote_batches += len(remote)
        print(
            f"{sum(ends.values()):,} records in {partitions} partitions, {remote_batches:,} "
            f"batches compared with remote storage, verify: "
            f"{'clean' if done.returncode == 0 else 'NOT clean'}; "
            f"{time.monotonic() - started:.0f} s in all",
            flush=True,
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        problems = run(args.keep, partitions=args.partitions, seed=args.seed, records=args.records)
    else:
        with tempfile.TemporaryDirectory(prefix="replicad-tiered-") as tmp:
            problems = run(
                Path(tmp), partitions=args.partitions, seed=args.seed, records=args.records
            )
    for problem in problems:
        print(f"PROBLEM {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
