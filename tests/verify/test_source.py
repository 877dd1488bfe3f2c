"""`replicad verify --against-source` (replicad/verify/source.py) on a real Kafka replica.

One replica of a transactional, mixed-codec topic is made once (the session broker); each
test verifies it, or a copy of it with one byte flipped, through the command line as an
operator runs it. Retention is DeleteRecords at the source, on a topic of its own.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.verify.source import next_fetch_at
from tools.peers.produce import produce_mixed, produce_numbered
from tools.peers.wire import fetch_once
from tools.replica import batches_from, replicad_cli, replicad_run, segment_bytes
from tools.wait import wait_until

PARTITIONS = 2
RECORDS = 3_000


def _replicate(broker, topic: str, ends: dict[int, int], data_dir: Path) -> None:
    with replicad_run(broker.bootstrap, [topic], data_dir) as proc:
        proc.wait_caught_up({TopicPartition(topic, p): end for p, end in ends.items()})


def _verify(data_dir: Path, bootstrap: str, *extra: str):
    return replicad_cli(
        "verify", str(data_dir), "--against-source", "--bootstrap-servers", bootstrap, *extra
    )


@pytest.fixture(scope="module")
def replica(kafka_broker, tmp_path_factory):
    """(topic, data dir) of a caught-up replica; tests that change it work on a copy."""
    topic = f"verify-mixed-{id(tmp_path_factory):x}"
    kafka_broker.create_topic(topic, PARTITIONS)
    summary = produce_mixed(
        kafka_broker.bootstrap, topic, partitions=PARTITIONS, records=RECORDS, seed=34
    )
    data_dir = tmp_path_factory.mktemp("verify") / "data"
    _replicate(kafka_broker, topic, summary.log_end_offsets, data_dir)
    return topic, data_dir, summary.log_end_offsets


def test_an_identical_replica_is_verified_to_its_end(kafka_broker, replica):
    _, data_dir, ends = replica
    done = _verify(data_dir, kafka_broker.bootstrap, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == 0
    by_partition = {p["partition"]: p for p in report["partitions"]}
    assert set(by_partition) == set(range(PARTITIONS))
    for partition, end in ends.items():
        entry = by_partition[partition]
        assert entry["clean"], entry
        assert entry["verified_to"] == end
        assert entry["replica"] == {"start": 0, "end": end}
        assert entry["batches_compared"] > 0
        assert entry["mismatches"] == [] and entry["gone_at_source"] == []


def test_one_flipped_byte_is_named_with_its_partition_and_offset(kafka_broker, replica, tmp_path):
    topic, data_dir, _ = replica
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    segment = sorted((copy / f"{topic}-1").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    batches = scan_batches(memoryview(bytes(data))).batches
    victim = batches[len(batches) // 2]
    # A byte of the records, past the header: the batch still scans, only its bytes differ.
    at = victim.position + victim.size - 3
    data[at] ^= 0x01
    segment.write_bytes(bytes(data))

    done = _verify(copy, kafka_broker.bootstrap)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{topic}-1: MISMATCH" in done.stdout
    assert f"offset {victim.base_offset}" in done.stdout
    assert "fails its CRC" in done.stdout
    assert f"{topic}-0: ok" in done.stdout

    report = json.loads(_verify(copy, kafka_broker.bootstrap, "--json").stdout)
    (bad,) = [p for p in report["partitions"] if not p["clean"]]
    assert bad["partition"] == 1
    assert [(m["offset"], m["kind"]) for m in bad["mismatches"]] == [
        (victim.base_offset, "different_bytes")
    ]


def test_a_sample_is_seeded_and_compares_that_many_batches(kafka_broker, replica):
    _, data_dir, _ = replica
    runs = [
        json.loads(
            _verify(
                data_dir, kafka_broker.bootstrap, "--sample", "4", "--seed", "11", "--json"
            ).stdout
        )
        for _ in range(2)
    ]
    assert runs[0]["sample_seed"] == 11
    for entry in runs[0]["partitions"]:
        assert entry["clean"] and len(entry["sample"]) == 4 and entry["batches_compared"] == 4
    assert [p["sample"] for p in runs[0]["partitions"]] == [
        p["sample"] for p in runs[1]["partitions"]
    ]


def test_what_retention_removed_at_the_source_is_reported_not_failed(
    kafka_broker, unique_topic, tmp_path
):
    kafka_broker.create_topic(unique_topic, 1)
    produce_numbered(kafka_broker.bootstrap, unique_topic, 1, 500)
    data_dir = tmp_path / "data"
    _replicate(kafka_broker, unique_topic, {0: 500}, data_dir)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    (future,) = admin.delete_records([KafkaTopicPartition(unique_topic, 0, 200)]).values()
    assert future.result(timeout=60).low_watermark == 200

    done = _verify(data_dir, kafka_broker.bootstrap, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads(done.stdout)["partitions"]
    assert entry["mismatches"] == []
    # Kafka still serves the batch that holds the new log start, whole: what is gone ends
    # at the log start, and everything from it on is compared.
    assert entry["gone_at_source"] == [{"start": 0, "end": 200}]
    assert entry["verified_to"] == 500 and entry["batches_compared"] > 0
    text = _verify(data_dir, kafka_broker.bootstrap).stdout
    assert "no longer at the source (retention): 0..199" in text


def _verify_in_process(data_dir: Path, bootstrap: str, **options):
    """(results, the verifier's source side: its request and byte counts)."""
    from replicad.protocol.client import ClientSettings
    from replicad.verify.source import SourceVerifier, VerifyOptions

    verifier = SourceVerifier(data_dir, [bootstrap], ClientSettings(), VerifyOptions(**options))
    return asyncio.run(verifier.run()), verifier.source


MANY = 24


def test_the_partitions_of_one_leader_are_asked_in_one_fetch(kafka_broker, unique_topic, tmp_path):
    """The command walks up to --partitions-per-fetch partitions at once, one Fetch naming
    those of one leader (the session's broker leads all): fewer requests than partitions,
    each partition verified to its end; one at a time, a request each."""
    kafka_broker.create_topic(unique_topic, MANY)
    produce_numbered(kafka_broker.bootstrap, unique_topic, MANY, 3)
    data_dir = tmp_path / "data"
    _replicate(kafka_broker, unique_topic, dict.fromkeys(range(MANY), 3), data_dir)
    together, source = _verify_in_process(data_dir, kafka_broker.bootstrap)
    alone, one_by_one = _verify_in_process(data_dir, kafka_broker.bootstrap, partitions_per_fetch=1)
    for results in (together, alone):
        assert [r.tp.partition for r in results] == list(range(MANY))
        assert all(r.clean and r.verified_to == 3 for r in results), results
    assert source.requests < MANY <= one_by_one.requests
    assert source.fetched_bytes == one_by_one.fetched_bytes


def test_partitions_a_full_answer_left_empty_are_asked_again_first(kafka_broker, replica):
    """A fetch_max_bytes under what the partitions hold: KIP-74 gives the first partition
    its batches and the answer is full, the next ones come back empty below their high
    watermark; they go first in the next request, and every partition ends verified."""
    _, data_dir, ends = replica
    results, source = _verify_in_process(data_dir, kafka_broker.bootstrap, fetch_max_bytes=4096)
    assert {r.tp.partition: r.verified_to for r in results} == ends
    assert all(r.clean for r in results), results
    assert source.fetches > source.requests  # more than one partition asked a request


def test_the_pace_gives_each_answers_bytes_their_share_of_the_rate():
    assert next_fetch_at(0.0, 5.0, 10_000, None) == 5.0
    # 30,000 bytes at 10,000 a second: the next fetch 3 s after this one was sent.
    assert next_fetch_at(0.0, 5.0, 30_000, 10_000) == 8.0
    # Sent before the last share ended (no wait asked): the shares add up.
    assert next_fetch_at(8.0, 7.0, 10_000, 10_000) == 9.0
    # Idle for long: no credit saved up, the share starts when the fetch was sent.
    assert next_fetch_at(9.0, 100.0, 10_000, 10_000) == 101.0


def test_without_a_source_the_command_says_what_it_needs(tmp_path):
    done = replicad_cli("verify", str(tmp_path), "--against-source")
    assert done.returncode == 64
    assert "--bootstrap-servers or -c CONFIG" in done.stderr


COMPACTED = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "segment.ms": "500",
}
KEYS = 10


def test_batches_the_sources_cleaner_rewrote_after_the_copy_are_said_not_failed(
    kafka_broker, unique_topic, tmp_path
):
    """Kafka's cleaner keeps a magic 2 batch's offsets when it drops records from it (and
    drops a batch it empties): the copy made before is reported as rewritten at the source,
    never as a mismatch."""
    topic = unique_topic()
    kafka_broker.create_topic(topic, 1, COMPACTED, segment_bytes=16 * 1024)
    # Batches well below the 16 KiB segments (a larger one is refused: RECORD_LIST_TOO_LARGE).
    producer = Producer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 2, "batch.size": 2048}
    )
    failed = []
    for i in range(2_000):
        key = b"key-%d" % (i % KEYS)
        producer.produce(
            topic,
            key=key,
            value=key + b"=%d" % i,
            partition=0,
            on_delivery=lambda error, _: failed.append(error) if error else None,
        )
    assert producer.flush(60) == 0 and failed == []
    data_dir = tmp_path / "data"
    _replicate(kafka_broker, topic, {0: 2_000}, data_dir)
    copied = segment_bytes(data_dir / f"{topic}-0")
    leader_dir = kafka_broker.partition_dir(topic, 0)
    # The cleaner only cleans closed segments: one more record rolls the last (segment.ms).
    producer.produce(topic, key=b"key-0", value=b"last", partition=0)
    assert producer.flush(60) == 0

    def cleaned() -> bool:
        return batches_from(segment_bytes(leader_dir), 0, 2_000) != batches_from(copied)

    wait_until(cleaned, timeout_s=240, interval_s=1, what="Kafka's cleaner to rewrite the copy")
    done = _verify(data_dir, kafka_broker.bootstrap, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads(done.stdout)["partitions"]
    assert entry["mismatches"] == [] and entry["clean"]
    assert entry["rewritten_at_source"], entry
    assert entry["verified_to"] == 2_000


def test_a_tansu_replica_is_verified_without_fetch_sessions(tansu_broker, unique_topic, tmp_path):
    """Tansu answers without fetch sessions, and its ListOffsets "latest" under-reports:
    verify asks sessionless and bounds the walk by Fetch's high watermark."""
    topic = unique_topic()
    tansu_broker.create_topic(topic, 1)
    produce_mixed(tansu_broker.bootstrap, topic, partitions=1, records=1_000, seed=34)
    end = fetch_once(tansu_broker.bootstrap, topic, 0, 0).high_watermark
    data_dir = tmp_path / "data"
    _replicate(tansu_broker, topic, {0: end}, data_dir)
    done = _verify(data_dir, tansu_broker.bootstrap, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads(done.stdout)["partitions"]
    assert entry["clean"] and entry["verified_to"] == end and entry["batches_compared"] > 0


def test_the_source_and_its_settings_come_from_the_daemons_config(kafka_broker, replica, tmp_path):
    _, data_dir, ends = replica
    config = tmp_path / "replicad.yaml"
    config.write_text(
        f"source:\n  bootstrap_servers: [{kafka_broker.bootstrap!r}]\n"
        f"topics:\n  include: [x]\ndata_dir: {str(data_dir)!r}\n"
    )
    done = replicad_cli("verify", str(data_dir), "--against-source", "-c", str(config), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [p["verified_to"] for p in report["partitions"]] == [ends[0], ends[1]]


def test_an_unreachable_source_is_not_compared_not_a_mismatch(replica, free_port):
    _, data_dir, _ = replica
    done = _verify(data_dir, f"127.0.0.1:{free_port}")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "nothing compared" in done.stderr
