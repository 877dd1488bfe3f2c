"""A restart of `replicad run` while part of the source cluster is down: the partitions
whose leader is gone keep serving every record they had, and keep their checkpointed high
watermarks (the case a copy exists for: its source is in trouble).

Real peers: a three-node Apache Kafka cluster (one node stopped across the restart) and
librdkafka reading the replica from the daemon's own `serve:` listener."""

from __future__ import annotations

from pathlib import Path

from replicad.log.layout import REPLICATION_OFFSET_CHECKPOINT
from tools.peers.produce import (
    READ_UNCOMMITTED,
    CheckedProducer,
    consume_all,
    produce_numbered,
)
from tools.replica import ReplicadProcess, replicad_run, topic_ends

PARTITIONS = 6
RECORDS = 200
CHECKPOINT_MS = 200


def checkpointed_high_watermarks(data_dir: Path, topic: str) -> dict[int, int]:
    lines = (data_dir / REPLICATION_OFFSET_CHECKPOINT).read_text().splitlines()[2:]
    found = {}
    for line in lines:
        name, partition, offset = line.rsplit(" ", 2)
        if name == topic:
            found[int(partition)] = int(offset)
    return found


def served_counts(listen: str, topic: str) -> dict[int, int]:
    records = consume_all(listen, topic, partitions=PARTITIONS, isolation=READ_UNCOMMITTED)
    return {p: len(rs) for p, rs in records.items()}


def test_restart_with_part_of_the_source_down_keeps_serving_every_record(
    kafka_cluster, unique_topic, tmp_path, free_port
):
    topic = unique_topic()
    kafka_cluster.create_topic(topic, PARTITIONS)
    produce_numbered(kafka_cluster.bootstrap, topic, PARTITIONS, RECORDS, key=b"k")
    leaders = kafka_cluster.leaders(topic)
    victim = leaders[2]
    offline = sorted(p for p, node in leaders.items() if node == victim)
    assert 0 < len(offline) < PARTITIONS  # some partitions stay up, some go down

    data_dir = tmp_path / "data"
    listen = f"127.0.0.1:{free_port}"
    config = tmp_path / "replicad.yaml"
    config.write_text(f"checkpoint_interval_ms: {CHECKPOINT_MS}\nserve:\n  listen: {listen}\n")

    def replicad(name: str) -> ReplicadProcess:
        return replicad_run(
            kafka_cluster.bootstrap,
            topic,
            data_dir,
            config=config,
            control_socket=tmp_path / "replicad.sock",
            log_path=tmp_path / f"{name}.log",
        )

    everything = dict.fromkeys(range(PARTITIONS), RECORDS)

    with replicad("first") as first:
        first.wait_for(
            lambda: topic_ends(data_dir, topic) == everything,
            timeout_s=60,
            what="the whole topic replicated",
        )
        first.wait_for(
            lambda: served_counts(listen, topic) == everything,
            timeout_s=60,
            what="serve to give every record",
        )
    assert checkpointed_high_watermarks(data_dir, topic) == everything

    online = [p for p in range(PARTITIONS) if p not in offline]
    more = CheckedProducer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0})
    added = dict.fromkeys(range(PARTITIONS), 0)
    with kafka_cluster.stopped(victim), replicad("second") as second:
        checkpoint = data_dir / REPLICATION_OFFSET_CHECKPOINT
        written = checkpoint.stat().st_mtime_ns
        rewrites = []

        def checkpointed_again() -> bool:
            # The periodic checkpoint is what rewound the offline partitions: wait for
            # several of them after the restart. A checkpoint writes the file only when a
            # high watermark moved, so each rewrite is answered with a record in every
            # online partition, for the next checkpoint to have one to write.
            nonlocal written
            now = checkpoint.stat().st_mtime_ns
            if now != written:
                written = now
                rewrites.append(now)
                for p in online:
                    more.produce(topic, value=b"more", key=b"k", partition=p)
                    added[p] += 1
                more.flush(30)
            return len(rewrites) >= 3

        second.wait_for(checkpointed_again, timeout_s=60, interval_s=0.05, what="checkpoints")
        now_everything = {p: RECORDS + added[p] for p in range(PARTITIONS)}
        second.wait_for(
            lambda: topic_ends(data_dir, topic) == now_everything,
            timeout_s=60,
            what="the online partitions' new records replicated",
        )
        served = served_counts(listen, topic)
        high_watermarks = checkpointed_high_watermarks(data_dir, topic)

    assert served == now_everything, f"offline partitions {offline}"
    assert {p: high_watermarks[p] for p in offline} == dict.fromkeys(offline, RECORDS)
    assert all(RECORDS <= high_watermarks[p] <= now_everything[p] for p in online)
