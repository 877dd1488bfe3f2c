"""The `replicad` format over an archive bucket (replicad/archive) on a real S3 server
(versitygw): the session's real replica uploaded by the archive's uploader, then read by
Spark from `s3://bucket/prefix` alone -- the same rows a Kafka consumer read, at the same
offsets, planned from the manifests and read by ranged GETs.

The uploader here seals chunks of CHUNKED segments (256 in the product): every manifest
these tests read names chunk objects for its oldest segments, which the planner reads as
it reads those of an archive of more than 256 segments. An archive without chunks is read
by tests/spark/test_archive_run.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest

from replicad.archive import manifest as manifest_module
from replicad.archive.manifest import manifest_key
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.spark.files import Purpose, read_trace
from replicad.spark.pipeline import export, main
from replicad.types import TopicPartition
from tests.spark.test_source import assert_consumer_rows, rows_by_partition
from tests.spark.test_stream import available_now, sink_offsets
from tools.peers.s3 import bucket_settings

CHUNKED = 2  # segments a chunk seals here


@dataclass(frozen=True)
class Archived:
    url: str
    endpoint: str
    segments: dict[str, list[int]]  # "topic-partition" -> archived base offsets
    chunks: dict[str, int]  # "topic-partition" -> chunk objects its manifest names


@pytest.fixture(scope="module")
def archived(replicated, s3_server, tmp_path_factory) -> Archived:
    """The session's replica, copied (the original stays as the other tests read it), every
    record rolled into a closed segment, and uploaded in chunks of CHUNKED segments."""
    data_dir = tmp_path_factory.mktemp("archived") / "data"
    shutil.copytree(replicated.data_dir, data_dir)
    manager = LogManager.open(data_dir, LogConfig(segment_bytes=64 * 1024), now_ms=wall_ms())
    for log in manager.partitions().values():
        log.high_watermark = log.log_end_offset  # the consumer read up to the log end
        log.roll_if_idle(now_ms=wall_ms() + 10**10)
    bucket = s3_server.create_bucket("archived-replica")
    settings = ArchiverSettings(bucket_settings(s3_server.endpoint, bucket, "replicas/one"))
    archiver = Archiver(settings)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manifest_module, "CHUNK_SEGMENTS", CHUNKED)
        archiver.round(manager)
    assert archiver.snapshot()["failures"] == 0
    segments = {
        f"{tp.topic}-{tp.partition}": [s.base_offset for s in log.segments[:-1]]
        for tp, log in manager.partitions().items()
    }
    manager.close()
    client = s3_server.client()
    chunks = {}
    for name in (n for n, bases in segments.items() if bases):
        topic, partition = name.rsplit("-", 1)
        key = manifest_key("replicas/one", TopicPartition(topic, int(partition)))
        body = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        chunks[name] = len(body["chunks"])
    return Archived(f"s3://{bucket}/replicas/one", s3_server.endpoint, segments, chunks)


def load(spark, archived: Archived, **options: str):
    reader = spark.read.format("replicad").option("s3Endpoint", archived.endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(archived.url)


def test_the_bucket_reads_what_a_kafka_consumer_read(spark, replicated, archived):
    """Through manifests whose oldest segments are in chunk objects: every record at the
    source's offsets."""
    # Every partition of more than CHUNKED segments has its oldest in chunks.
    assert archived.chunks == {
        name: (len(bases) - 1) // CHUNKED for name, bases in archived.segments.items() if bases
    }
    assert sum(archived.chunks.values()) >= 2
    # read_committed: aborted records dropped, which needs the markers that follow a
    # split, found through a listing of the partition's objects (reader.py's lookahead).
    got = rows_by_partition(load(spark, archived, isolation="read_committed"))
    assert_consumer_rows(got, replicated.committed)


def test_a_narrow_range_reads_only_its_objects_by_range(spark, replicated, archived, tmp_path):
    topic = replicated.plain
    bases = archived.segments[f"{topic}-0"]
    assert len(bases) >= 3
    trace = tmp_path / "trace"
    start, end = bases[1] + 1, bases[2] - 1  # inside the second segment
    df = load(
        spark,
        archived,
        topics=topic,
        partitions="0",
        startingOffsets=str(start),
        endingOffsets=str(end),
        traceFileOpens=str(trace),
    )
    assert [r.offset for r in df.select("offset").collect()] == list(range(start, end))
    opened = read_trace(str(trace))
    reads = {o.path for o in opened if o.purpose is Purpose.READ}
    assert reads == {f"{archived.url}/{topic}-0/{_topic_id(opened)}/{bases[1]:020d}.log"}
    planned = [o.path.rsplit("/", 1)[-1] for o in opened if o.purpose is Purpose.INDEX]
    # One manifest per selected partition, its chunks, and the one index the bounds fall in.
    chunks = [f"manifest-{bases[i]:020d}.json" for i in range(0, len(bases) - 1, CHUNKED)]
    chunks = chunks[: archived.chunks[f"{topic}-0"]]
    assert chunks
    assert sorted(planned) == sorted(["manifest.json", *chunks, f"{bases[1]:020d}.index"])


def _topic_id(opened) -> str:
    segment = next(o.path for o in opened if o.purpose is Purpose.READ)
    return segment.rsplit("/", 2)[-2]


def test_a_stream_over_the_bucket_reads_every_archived_record_once(
    spark, replicated, archived, tmp_path
):
    """spark.readStream from the bucket URL alone, AvailableNow in micro-batches of at most
    maxOffsetsPerTrigger: the sink holds what a batch read of the bucket holds, each once."""
    batch = {
        (r.topic, r.partition, r.offset)
        for r in load(spark, archived).select("topic", "partition", "offset").collect()
    }
    progress = available_now(
        spark, archived.url, tmp_path, s3Endpoint=archived.endpoint, maxOffsetsPerTrigger="2000"
    )
    count, offsets = sink_offsets(spark, tmp_path / "out")
    assert offsets == batch and count == len(batch) > 0
    assert len(progress) >= 2


def test_pipeline_export_and_verify_take_the_bucket_url(
    spark, replicated, archived, tmp_path, capsys
):
    """`replicad pipeline export|verify s3://...`: the export holds what a Kafka consumer
    read of the topic, at its offsets; verify finds every partition whole from offset 0."""
    topic = replicated.plain
    out = tmp_path / "export"
    options = {"s3Endpoint": archived.endpoint, "topics": topic}
    assert export(archived.url, "parquet", str(out), options=options, spark=spark) == 0
    back = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    want = {
        (partition, r.offset, r.value)
        for partition, records in replicated.committed[topic].items()
        for r in records
    }
    got = {(r.partition, r.offset, None if r.value is None else bytes(r.value)) for r in back}
    assert got == want
    assert len(back) == len(want) > 0
    capsys.readouterr()
    assert main(["verify", archived.url, "--s3-endpoint", archived.endpoint]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, summary in replicated.summaries.items():
        for p in summary.partitions:
            row = next(r for r in map(str.split, lines) if r[:2] == [name, str(p.partition)])
            assert row[6:] == [f"0..{p.log_end_offset - 1}", "0", "ok"], row
    assert lines[-1] == f"{sum(replicated.partitions.values())} partitions, all ok"
