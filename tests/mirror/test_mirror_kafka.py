"""`replicad run` with a `mirror:` section, from a real Apache Kafka source (the session's
single broker) into a real Apache Kafka destination (the session's three-node cluster).

What a consumer reads from the destination must be what one reads from the source:
read_committed on both sides, the same records (keys, values, headers, timestamps) in the
same order per partition; for topics without transactions the same offsets too; and the
destination's batches keep the source's codecs (read from the destination's own segment
files).

The SIGKILL test kills `replicad run` at 5 seeded moments in the suite; more is
`REPLICAD_MIRROR_KILLS=20 pytest tests/mirror/test_mirror_kafka.py -k sigkill` (the same
seed: the suite's 5 moments first).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from replicad.log.layout import RECOVERY_POINT_CHECKPOINT
from replicad.types import TopicPartition
from tools.peers.produce import (
    CODECS,
    READ_COMMITTED,
    CheckedProducer,
    ConsumedRecord,
    consume_all,
    produce_mixed,
)
from tools.peers.segments import broker_batches
from tools.replica import ReplicadProcess, replicad_run
from tools.wait import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 3
# SIGKILLs of replicad run, at seeded random points while it mirrors. In a 20-kill run
# every reconcile logged found batches the destination already held (57 of 57, 2 to 26
# each, 2026-11-26), so 5 kills show the rule as well; each costs a daemon start.
KILLS = int(os.environ.get("REPLICAD_MIRROR_KILLS", "5"))
KILL_SEED = 20261125


def mirror_config(destination: str, data_dir: Path, **mirror: Any) -> dict[str, Any]:
    return {
        "data_dir": str(data_dir),
        "mirror": {
            "bootstrap_servers": destination.split(","),
            "progress_interval_ms": 200,
            **mirror,
        },
    }


def start(
    source: Any, destination: Any, topics: list[str], work: Path, **config: Any
) -> ReplicadProcess:
    data_dir = work / "data"
    return replicad_run(
        source.bootstrap,
        topics,
        data_dir,
        config={**mirror_config(destination.bootstrap, data_dir), **config},
        control_socket=work / "control.sock",
        start=True,
    )


def mirror_rows(proc: ReplicadProcess) -> dict[TopicPartition, dict[str, Any]]:
    status = proc.status() or {}
    return {
        TopicPartition(p["topic"], p["partition"]): p
        for p in (status.get("mirror") or {}).get("partitions", ())
    }


def wait_mirrored(
    proc: ReplicadProcess, ends: dict[TopicPartition, int], timeout_s: float = 90
) -> None:
    """Until every partition is mirrored up to the source's log end `ends`."""

    def done() -> bool:
        rows = mirror_rows(proc)
        for tp, end in ends.items():
            row = rows.get(tp)
            if row is None:
                return False
            assert row["state"] != "halted", f"{tp}: {row['error']}"
            if row["mirrored_offset"] < end:
                return False
        return True

    proc.wait_for(done, timeout_s=timeout_s, what=f"mirrored to {ends}")


def source_ends(broker: Any, topic: str, partitions: int = PARTITIONS) -> dict[TopicPartition, int]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ends"})
    try:
        return {
            TopicPartition(topic, p): consumer.get_watermark_offsets(KTP(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def without_offsets(records: list[ConsumedRecord]) -> list[tuple[Any, ...]]:
    return [(r.key, r.value, r.headers, r.timestamp) for r in records]


def test_mirror_keeps_records_codecs_and_offsets(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path, free_port: int
) -> None:
    plain, mixed = unique_topic("plain"), unique_topic("txn")
    for topic in (plain, mixed):
        kafka_broker.create_topic(topic, PARTITIONS)
    produce_mixed(
        kafka_broker.bootstrap,
        plain,
        partitions=PARTITIONS,
        records=1500,
        seed=3,
        transactional=False,
    )
    produce_mixed(kafka_broker.bootstrap, mixed, partitions=PARTITIONS, records=1500, seed=4)
    ends = {**source_ends(kafka_broker, plain), **source_ends(kafka_broker, mixed)}
    metrics = {"control": {"metrics_listen": f"127.0.0.1:{free_port}"}}
    with start(kafka_broker, kafka_cluster, [plain, mixed], tmp_path, **metrics) as proc:
        wait_mirrored(proc, ends)
        rows = mirror_rows(proc)
        # Prometheus: the mirrored records of each partition, and no lag left.
        samples = scrape(f"http://127.0.0.1:{free_port}/metrics")
        for tp in ends:
            labels = (("partition", str(tp.partition)), ("topic", tp.topic))
            assert (
                samples[("replicad_mirror_records_total", labels)]
                == rows[tp]["records_mirrored"]
                > 0
            )
            assert samples[("replicad_mirror_partition_lag", labels)] == 0
    for topic in (plain, mixed):
        want = consume_all(kafka_broker.bootstrap, topic, isolation=READ_COMMITTED)
        got = consume_all(kafka_cluster.bootstrap, topic, isolation=READ_COMMITTED)
        assert sorted(got) == list(range(PARTITIONS))
        for p in range(PARTITIONS):
            assert without_offsets(got[p]) == without_offsets(want[p]), f"{topic}-{p}"
            assert len(got[p]) > 0
            kept = rows[TopicPartition(topic, p)]["offsets_kept"]
            if topic == plain:
                # No markers, nothing aborted: every record keeps its offset.
                assert [r.offset for r in got[p]] == [r.offset for r in want[p]]
                assert kept is True
            else:
                # Markers and aborted records are not mirrored: offsets move, status says so.
                assert kept is False
    # The destination stores the source's codecs, in the source's order: small batches
    # are coalesced by default, but a run never mixes codecs (consecutive batches of one
    # codec may have become one).
    for p in range(PARTITIONS):
        leader = kafka_cluster.leaders(plain)[p]
        dest = broker_batches(kafka_cluster.node(leader).log_dir, plain, p)
        src = broker_batches(kafka_broker.log_dir, plain, p)
        assert collapsed([b.codec for b in dest]) == collapsed([b.codec for b in src])
        assert {b.codec for b in src} == set(CODECS)


def collapsed(codecs: list[Any]) -> list[Any]:
    """`codecs` with each run of one codec as one."""
    return [c for i, c in enumerate(codecs) if i == 0 or codecs[i - 1] != c]


class SourceWriter:
    """Plain records into a source topic from a thread (an idempotent librdkafka producer,
    lz4, small batches), until stopped: the source keeps changing while the mirror is
    killed or its destination is down."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from tools.peers.admin import librdkafka_log

        self.topic = topic
        self.producer = CheckedProducer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 5,
                "logger": librdkafka_log,
            }
        )
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="source-writer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(20):
                i = self.sent
                self.producer.produce(
                    self.topic,
                    key=None if i % 11 == 0 else b"key-%d" % (i % 97),
                    value=b"value-%d-" % i + b"x" * (i % 300),
                    partition=i % PARTITIONS,
                    headers=[("n", b"%d" % i)] if i % 3 == 0 else None,
                )
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.02)  # timing-ok: a steady source, written to while the mirror runs

    def __enter__(self) -> SourceWriter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.flush(30)  # PeerError unless every record was delivered


def health_codes(proc: ReplicadProcess) -> set[str]:
    status = proc.status(timeout_s=10) or {}
    return {r["code"] for r in (status.get("health") or {}).get("reasons", ())}


def logged(proc: ReplicadProcess, event: str) -> list[dict[str, Any]]:
    """Every JSON log line of `event`, of every run that wrote to this log."""
    found = []
    for line in proc.output().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


def assert_same(
    source: Any, destination: Any, topic: str, *, offsets: bool, prefix: str = ""
) -> None:
    want = consume_all(source.bootstrap, topic, isolation=READ_COMMITTED)

    def read_destination() -> dict[int, list[ConsumedRecord]] | None:
        # A consumer's end of partition is the high watermark of the leader it asked at
        # that moment; a leader that has just taken over (the cluster is shared with the
        # leadership scenarios) can report an older one for a moment, so an end short of
        # the source's is read again. A record really missing still fails below.
        got = consume_all(destination.bootstrap, prefix + topic, isolation=READ_COMMITTED)
        return got if all(len(got[p]) >= len(want[p]) for p in range(PARTITIONS)) else None

    try:
        got = wait_until(read_destination, timeout_s=60, interval_s=1, what="destination ends")
    except TimeoutError:
        got = consume_all(destination.bootstrap, prefix + topic, isolation=READ_COMMITTED)
    for p in range(PARTITIONS):
        assert len(got[p]) == len(want[p]), f"{topic}-{p}: {len(got[p])} != {len(want[p])}"
        if offsets:
            assert got[p] == want[p], f"{topic}-{p}"
        else:
            assert without_offsets(got[p]) == without_offsets(want[p]), f"{topic}-{p}"


def test_sigkill_at_seeded_points_loses_and_duplicates_nothing(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    plain, mixed = unique_topic("kill"), unique_topic("kill-txn")
    for topic in (plain, mixed):
        kafka_broker.create_topic(topic, PARTITIONS)
    produce_mixed(kafka_broker.bootstrap, mixed, partitions=PARTITIONS, records=1200, seed=5)
    rng = random.Random(KILL_SEED)
    with SourceWriter(kafka_broker.bootstrap, plain):
        for run in range(KILLS):
            proc = start(kafka_broker, kafka_cluster, [plain, mixed], tmp_path)
            try:
                proc.wait_for(
                    lambda p=proc, n=run: len(logged(p, "mirroring")) > n,
                    timeout_s=60,
                    interval_s=0.05,
                    what="mirroring",
                )
                # Under way: this run has produced (on a loaded machine the first sends can
                # come seconds after the log line, and a kill before them finds no work).
                proc.wait_for(
                    lambda p=proc: (
                        ((p.status() or {}).get("mirror") or {}).get("produce_requests", 0) > 0
                    ),
                    timeout_s=60,
                    interval_s=0.05,
                    what="the first Produce of this run",
                )
                time.sleep(rng.uniform(0.0, 0.5))  # timing-ok: the kill's moment, seeded
            finally:
                proc.kill()
    # The kills hit a mirror with work in hand: restarts found batches the destination
    # had taken after the last saved progress (without reconcile, each would be a duplicate).
    found = [
        e["batches_already_there"] for e in logged(proc, "mirror reconciled with the destination")
    ]
    assert sum(found) > 0
    ends = {**source_ends(kafka_broker, plain), **source_ends(kafka_broker, mixed)}
    with start(kafka_broker, kafka_cluster, [plain, mixed], tmp_path) as proc:
        # What the writer added during the kills (small batches; a loaded machine makes
        # each run longer) is caught up here: a deadline only a hang reaches.
        wait_mirrored(proc, ends, timeout_s=300)
    assert_same(kafka_broker, kafka_cluster, plain, offsets=True)
    assert_same(kafka_broker, kafka_cluster, mixed, offsets=False)


@contextmanager
def lag_watch(proc: ReplicadProcess, tp: TopicPartition) -> Iterator[list[int]]:
    """The partition's destination lag, sampled from `replicad status` on a thread."""
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            row = mirror_rows(proc).get(tp)
            if row is not None and row["lag"] is not None:
                seen.append(row["lag"])
            done.wait(0.3)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(10)


def test_destination_outage_is_absorbed_by_the_local_log(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    topic = unique_topic("outage")
    kafka_broker.create_topic(topic, PARTITIONS)
    tp = TopicPartition(topic, 0)
    # Copies named as MirrorMaker 2's default policy names them.
    prefix = "east."
    config = mirror_config(kafka_cluster.bootstrap, tmp_path / "data", topic_prefix=prefix)
    with start(kafka_broker, kafka_cluster, [topic], tmp_path, mirror=config["mirror"]) as proc:
        with SourceWriter(kafka_broker.bootstrap, topic), lag_watch(proc, tp) as lags:
            proc.wait_for(
                lambda: mirror_rows(proc).get(tp, {}).get("mirrored_offset", 0) > 100,
                what="mirroring under way",
            )
            assert mirror_rows(proc)[tp]["destination_topic"] == prefix + topic
            node = kafka_cluster.leaders(prefix + topic)[0]
            with kafka_cluster.stopped(node):
                # The source goes on into the local log; the destination lag grows, and
                # status says why.
                proc.wait_for(
                    lambda: (mirror_rows(proc)[tp]["lag"] or 0) > 300,
                    timeout_s=60,
                    what="lag rising while the destination is down",
                )
                proc.wait_for(
                    lambda: "destination_unreachable" in health_codes(proc),
                    timeout_s=30,
                    what="status to name the destination",
                )
                table = subprocess.run(
                    [sys.executable, "-m", "replicad.cli", "status", "--socket",
                     str(proc.control_socket)],
                    capture_output=True, text=True, timeout=60,
                ).stdout  # fmt: skip
                assert "mirror destination unreachable" in table
                assert f"{tp.topic}-0" in table.split("MIRROR to")[1]
            peak = max(lags)
        wait_mirrored(proc, source_ends(kafka_broker, topic), timeout_s=120)
        assert mirror_rows(proc)[tp]["lag"] == 0 < peak
        assert (proc.status() or {})["mirror"]["problem"] is None
    assert_same(kafka_broker, kafka_cluster, topic, offsets=True, prefix=prefix)


def set_topic_config(broker: Any, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    change = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[change])
    admin = broker.admin()  # held: futures fail once their client is gone
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_destination_refusing_every_batch_is_named_then_caught_up(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    """The destination answers every batch with an error (NOT_ENOUGH_REPLICAS): status and
    health name the partitions and the error -- "refusing", not only a growing lag. Once
    the source's config is set back (and synced), the mirror completes, offsets kept.

    Kafka caps a partition's min.insync.replicas at its replica count (a copy of one
    replica under min.insync.replicas 2 takes every batch), so the source topic's 3 is
    copied to a copy of three replicas, and one destination node is stopped."""
    topic = unique_topic("refused")
    kafka_broker.create_topic(topic, PARTITIONS)
    for p in range(PARTITIONS):
        produce_plain(kafka_broker.bootstrap, topic, p, 30)
    set_topic_config(kafka_broker, topic, "min.insync.replicas", "3")  # the source: 1 replica
    data_dir = tmp_path / "data"
    config = mirror_config(
        kafka_cluster.bootstrap, data_dir, replication_factor=3, topic_sync_interval_ms=300
    )
    with start(kafka_broker, kafka_cluster, [topic], tmp_path, mirror=config["mirror"]) as proc:
        wait_mirrored(proc, source_ends(kafka_broker, topic))

        def named() -> bool:
            status = proc.status(timeout_s=10) or {}
            mirror = status.get("mirror") or {}
            rows = [p for p in mirror.get("partitions", ()) if p["topic"] == topic]
            reasons = (status.get("health") or {}).get("reasons", ())
            return (
                len(rows) == PARTITIONS
                and all("not_enough_replicas" in (p["error"] or "") for p in rows)
                and any(
                    r["code"] == "destination_refusing" and "not_enough_replicas" in r["text"]
                    for r in reasons
                )
            )

        with kafka_cluster.stopped(kafka_cluster.node_ids[-1]):
            for p in range(PARTITIONS):
                produce_plain(kafka_broker.bootstrap, topic, p, 20)
            proc.wait_for(named, timeout_s=120, what="status and health to name the refusal")
            assert all(row["mirrored_offset"] == 30 for row in mirror_rows(proc).values())
            set_topic_config(kafka_broker, topic, "min.insync.replicas", "1")
            wait_mirrored(proc, source_ends(kafka_broker, topic), timeout_s=120)
            assert (proc.status() or {})["mirror"]["problem"] is None
            assert all(row["error"] is None for row in mirror_rows(proc).values())
            assert "destination_refusing" not in health_codes(proc)
    assert_same(kafka_broker, kafka_cluster, topic, offsets=True)


@pytest.mark.parametrize("waits", [True, False])
def test_local_retention_waits_for_the_mirror(
    kafka_broker: Any, unique_topic: Any, tmp_path: Path, free_port: int, waits: bool
) -> None:
    """A destination that never answered: retention keeps every segment not mirrored yet
    (the default), or deletes on schedule when told not to wait. Status names the
    destination as unreachable either way."""
    topic = unique_topic("retention")
    kafka_broker.create_topic(topic, 1)
    produce_mixed(
        kafka_broker.bootstrap, topic, partitions=1, records=600, seed=8, transactional=False,
        max_batch_bytes=4096,
    )  # fmt: skip
    data_dir = tmp_path / "data"
    config = mirror_config(f"127.0.0.1:{free_port}", data_dir, retention_waits=waits)
    config.update(
        checkpoint_interval_ms=100,
        log={"segment_bytes": 16384, "retention_bytes": 16384},
    )
    with replicad_run(
        kafka_broker.bootstrap,
        [topic],
        data_dir,
        config=config,
        control_socket=tmp_path / "control.sock",
    ) as proc:
        proc.wait_caught_up(source_ends(kafka_broker, topic, partitions=1), timeout_s=60)
        proc.wait_for(
            lambda: "destination_unreachable" in health_codes(proc),
            what="status to name the destination",
        )
        if waits:
            # The checkpoint that names the log end flushed it and planned its retention
            # (with the hold); an idle log's later checkpoints write nothing (06aa802).
            checkpoint = data_dir / RECOVERY_POINT_CHECKPOINT
            log_end = source_ends(kafka_broker, topic, partitions=1)[TopicPartition(topic, 0)]
            end = f"{topic} 0 {log_end}"

            def checkpointed() -> bool:
                with contextlib.suppress(FileNotFoundError):
                    return end in checkpoint.read_text().splitlines()
                return False

            wait_until(checkpointed, interval_s=0.01, what="the log end checkpointed")
            status = proc.status() or {}
            assert [p["log_start_offset"] for p in status["partitions"]] == [0]
        else:
            proc.wait_for(
                lambda: (proc.status() or {})["partitions"][0]["log_start_offset"] > 0,
                what="retention to delete segments",
            )


def produce_plain(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "compression.type": "zstd"})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=partition)
    producer.flush(30)  # PeerError unless every record was delivered


def test_topics_partitions_and_configs_new_at_the_source_are_mirrored(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        ResourceType,
    )

    first, second = unique_topic("first"), unique_topic("second")
    kafka_broker.create_topic(first, PARTITIONS)
    for p in range(PARTITIONS):
        produce_plain(kafka_broker.bootstrap, first, p, 50)
    data_dir = tmp_path / "data"
    config = mirror_config(kafka_cluster.bootstrap, data_dir, topic_sync_interval_ms=300)
    config["source"] = {
        "bootstrap_servers": kafka_broker.bootstrap.split(","),
        "metadata_max_age_ms": 500,
    }
    # Both topics (the second made later) match; no other test's do.
    base = first.rsplit("-first-", 1)[0]
    config["topics"] = {"regex": re.escape(base) + "-(first|second)-[0-9]+"}
    with replicad_run(
        kafka_broker.bootstrap, None, data_dir, config=config, control_socket=tmp_path / "c.sock"
    ) as proc:
        wait_mirrored(proc, source_ends(kafka_broker, first))
        # A partition added to a mirrored topic, and a topic new at the source.
        admin = kafka_broker.admin()  # held: futures fail once their client is gone
        futures = admin.create_partitions([NewPartitions(first, PARTITIONS + 1)])
        for future in futures.values():
            future.result(30)
        kafka_broker.create_topic(second, 2)
        produce_plain(kafka_broker.bootstrap, first, PARTITIONS, 40)
        produce_plain(kafka_broker.bootstrap, second, 1, 30)
        ends = {
            TopicPartition(first, PARTITIONS): 40,
            TopicPartition(second, 0): 0,
            TopicPartition(second, 1): 30,
        }
        wait_mirrored(proc, ends)
        # A topic config changed at the source is set at the destination.
        change = ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ResourceType.TOPIC, first, incremental_configs=[change])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
        dest_admin = kafka_cluster.admin()

        def synced() -> bool:
            found = dest_admin.describe_configs([ConfigResource(ResourceType.TOPIC, first)])
            configs = next(iter(found.values())).result(30)
            return configs["retention.ms"].value == "7200000"

        proc.wait_for(synced, timeout_s=30, what="the config change at the destination")
    for topic, count in ((first, PARTITIONS + 1), (second, 2)):
        want = consume_all(kafka_broker.bootstrap, topic, partitions=count)
        got = consume_all(kafka_cluster.bootstrap, topic, partitions=count)
        assert got == want and sum(len(r) for r in got.values()) > 0, topic
        assert len(kafka_cluster.leaders(topic)) == count


def produce_tiny(bootstrap: str, topic: str, records: int = 600, value_bytes: int = 40) -> None:
    """One record a batch (linger.ms 0), lz4: keys, headers and timestamps of their own,
    values of random bytes (a run of them compresses no better than its batches)."""
    rng = random.Random(32)
    # Timestamps of now: a fixed date in 2023 is past both brokers' default retention.ms
    # (7 days), so whichever retention check ran between the mirror's write and the
    # test's read deleted a partition's records (the "0 of 200" seen in session 8's CI;
    # the destination broker logged "log retention time 604800000ms breach").
    base_ms = time.time_ns() // 1_000_000

    producer = CheckedProducer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "lz4",
            "linger.ms": 0,
            "batch.num.messages": 1,
        }
    )
    for i in range(records):
        producer.produce(
            topic,
            key=b"k%d" % i if i % 4 else None,
            value=b"tiny-%d-" % i + rng.randbytes(value_bytes + i % 50),
            partition=i % PARTITIONS,
            headers=[("i", b"%d" % i)] if i % 5 == 0 else None,
            timestamp=base_ms + i * 7,
        )
        producer.flush(30)  # one record a batch; PeerError unless it was delivered


def test_runs_of_one_record_batches_are_coalesced_record_for_record(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    """By default (mirror.coalesce_bytes 256 KiB) a source producer with linger.ms 0 (one
    record a batch) is mirrored in fewer, larger batches, every record the same (offsets
    included); status's bytes_produced counts the batches as the destination took them
    (the coalesced ones, not the stored ones they were made of)."""
    topic = unique_topic("tiny")
    kafka_broker.create_topic(topic, PARTITIONS)
    produce_tiny(kafka_broker.bootstrap, topic)
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_mirrored(proc, source_ends(kafka_broker, topic))
        bytes_produced = (proc.status() or {})["mirror"]["bytes_produced"]
    assert_same(kafka_broker, kafka_cluster, topic, offsets=True)
    dest_bytes = 0
    for p in range(PARTITIONS):
        src = broker_batches(kafka_broker.log_dir, topic, p)
        leader = kafka_cluster.leaders(topic)[p]
        dest = broker_batches(kafka_cluster.node(leader).log_dir, topic, p)
        assert len(src) == 200 and len(dest) < len(src) / 4, (len(src), len(dest))
        # A run keeps its codec (librdkafka stores a record lz4 does not shrink as none).
        assert {b.codec for b in dest} <= {b.codec for b in src}
        dest_bytes += sum(len(b.raw) for b in dest)
    assert bytes_produced == dest_bytes


TOO_LARGE_EVENT = "destination refused a coalesced batch as too large; sent again in smaller runs"


def test_a_run_over_the_destination_topics_max_message_bytes_goes_again_as_stored(
    kafka_broker: Any, kafka_cluster: Any, unique_topic: Any, tmp_path: Path
) -> None:
    """A topic whose max.message.bytes (copied to the destination topic) is below the
    coalescing limit refuses the first runs (MESSAGE_TOO_LARGE): their batches go again in
    smaller runs, nothing is lost, duplicated or halted, and the destination's batches stay
    within the limit."""
    limit = 4096
    topic = unique_topic("tiny-limit")
    kafka_broker.create_topic(topic, PARTITIONS, {"max.message.bytes": str(limit)})
    # Batches of about 650 bytes: any run of seven is over the limit, however the local
    # log's batches reach the mirror.
    produce_tiny(kafka_broker.bootstrap, topic, records=300, value_bytes=560)
    with start(kafka_broker, kafka_cluster, [topic], tmp_path) as proc:
        wait_mirrored(proc, source_ends(kafka_broker, topic))
        refused = logged(proc, TOO_LARGE_EVENT)
    assert refused, "no run was refused: the test did not reach the fallback"
    assert_same(kafka_broker, kafka_cluster, topic, offsets=True)
    for p in range(PARTITIONS):
        src = broker_batches(kafka_broker.log_dir, topic, p)
        leader = kafka_cluster.leaders(topic)[p]
        dest = broker_batches(kafka_cluster.node(leader).log_dir, topic, p)
        assert len(dest) < len(src) / 2, (len(src), len(dest))  # still coalesced
        assert max(len(b.raw) for b in dest) <= limit
