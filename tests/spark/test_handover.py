"""Offsets out of a Spark checkpoint (handover.py), and a Spark job failed over from Spark's
Kafka source on a real broker to the replica a real `replicad run` keeps: the union of both
sinks holds every record exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replicad.spark.handover import CheckpointError, offsets_from_checkpoint
from replicad.types import TopicPartition
from tests.spark.test_stream import REPLICA_CONFIG, available_now, every_offset, wait_replicated
from tools.peers.produce import produce_numbered
from tools.replica import replicad_cli, replicad_run


def write_checkpoint(root: Path, offsets: dict[int, str], commits: list[int]) -> Path:
    """A checkpoint laid out as Spark writes one (offsets/N, commits/N, their .crc files)."""
    for batch, source in offsets.items():
        (root / "offsets").mkdir(parents=True, exist_ok=True)
        metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
        (root / "offsets" / str(batch)).write_text(f"v1\n{metadata}\n{source}")
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    for batch in commits:
        (root / "commits").mkdir(parents=True, exist_ok=True)
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


def test_the_last_committed_batch_is_handed_over(tmp_path):
    checkpoint = write_checkpoint(
        tmp_path / "c",
        {0: '{"t":{"0":10,"1":5}}', 1: '{"t":{"0":20,"1":9}}', 2: '{"t":{"0":30,"1":9}}'},
        commits=[0, 1],
    )
    assert offsets_from_checkpoint(checkpoint) == {"t": {"0": 20, "1": 9}}
    # The file sink already holds batch 2 (the query stopped before committing it).
    sink = tmp_path / "out"
    (sink / "_spark_metadata").mkdir(parents=True)
    (sink / "_spark_metadata" / "2").write_text("v1\n")
    assert offsets_from_checkpoint(checkpoint, sink=sink) == {"t": {"0": 30, "1": 9}}


def test_what_cannot_be_handed_over_is_said(tmp_path):
    with pytest.raises(CheckpointError, match="not a Spark streaming checkpoint"):
        offsets_from_checkpoint(tmp_path)
    planned = write_checkpoint(tmp_path / "p", {0: '{"t":{"0":1}}'}, commits=[])
    with pytest.raises(CheckpointError, match="no micro-batch was committed"):
        offsets_from_checkpoint(planned)
    other = write_checkpoint(tmp_path / "o", {0: '{"logOffset":3}'}, commits=[0])
    with pytest.raises(CheckpointError, match="not a Kafka source"):
        offsets_from_checkpoint(other)
    with pytest.raises(CheckpointError, match="no source number 1"):
        offsets_from_checkpoint(other, source=1)
    result = replicad_cli("pipeline", "offsets-from-checkpoint", str(planned))
    assert result.returncode == 1
    assert result.stderr.strip().endswith("(exit 1)") and len(result.stderr.splitlines()) == 1


def test_a_job_on_spark_kafka_source_fails_over_to_the_replica_exactly_once(
    spark, kafka_broker, unique_topic, tmp_path
):
    from tools.bench.spark_kafka import available_now as kafka_available_now
    from tools.bench.spark_kafka import kafka_stream

    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    produce_numbered(kafka_broker.bootstrap, topic, 2, 100)
    data_dir = tmp_path / "data"
    first_out, first_checkpoint = tmp_path / "source-out", tmp_path / "source-checkpoint"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        # The job on the source cluster, through Spark's Kafka source.
        source_df = kafka_stream(spark, kafka_broker.bootstrap, topic)
        assert kafka_available_now(source_df, str(first_out), str(first_checkpoint)) == 200
        # The source goes on without that job (then it is "lost"); the job moves to the replica.
        produce_numbered(kafka_broker.bootstrap, topic, 2, 60, b"w")
        want = {TopicPartition(topic, p): 160 for p in range(2)}
        wait_replicated(proc, data_dir, want)
    handed = replicad_cli(
        "pipeline", "offsets-from-checkpoint", str(first_checkpoint), "--sink", str(first_out)
    )
    assert handed.returncode == 0, handed.stderr
    starting = handed.stdout.strip()
    assert json.loads(starting) == {topic: {"0": 100, "1": 100}}
    available_now(spark, data_dir, tmp_path, startingOffsets=starting)
    columns = ("topic", "partition", "offset", "value")
    before = spark.read.parquet(str(first_out)).select(*columns)
    after = spark.read.parquet(str(tmp_path / "out")).select(*columns)
    assert before.count() == 200 and after.count() == 120
    union = before.unionByName(after).collect()
    offsets = [(r.topic, r.partition, r.offset) for r in union]
    assert len(offsets) == len(set(offsets)) == 320
    assert set(offsets) == every_offset(want)
    values = {(r.partition, r.offset): bytes(r.value) for r in union}
    assert values[(0, 99)] == b"v99" and values[(1, 100)] == b"w0"
