"""The `replicad` format over an archive bucket (replicad/archive) on a real S3 server
(versitygw): the session's real replica uploaded by the archive's uploader, then read by
Spark from `s3://bucket/prefix` alone -- the same rows a Kafka consumer read, at the same
offsets, planned from the manifests and read by ranged GETs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest

from replicad.archive.store import BucketSettings
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.spark.files import Purpose, read_trace
from tests.spark.test_source import consumer_rows, rows_by_partition
from tests.spark.test_stream import available_now, sink_offsets
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY


@dataclass(frozen=True)
class Archived:
    url: str
    endpoint: str
    segments: dict[str, list[int]]  # "topic-partition" -> archived base offsets


@pytest.fixture(scope="module")
def archived(replicated, s3_server, tmp_path_factory) -> Archived:
    """The session's replica, copied (the original stays as the other tests read it), every
    record rolled into a closed segment, and uploaded."""
    data_dir = tmp_path_factory.mktemp("archived") / "data"
    shutil.copytree(replicated.data_dir, data_dir)
    manager = LogManager.open(data_dir, LogConfig(segment_bytes=64 * 1024), now_ms=wall_ms())
    for log in manager.partitions().values():
        log.high_watermark = log.log_end_offset  # the consumer read up to the log end
        log.roll_if_idle(now_ms=wall_ms() + 10**10)
    bucket = s3_server.create_bucket("archived-replica")
    settings = ArchiverSettings(
        BucketSettings(
            bucket,
            "replicas/one",
            endpoint=s3_server.endpoint,
            region=REGION,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )
    )
    archiver = Archiver(settings)
    archiver.round(manager)
    assert archiver.snapshot()["failures"] == 0
    segments = {
        f"{tp.topic}-{tp.partition}": [s.base_offset for s in log.segments[:-1]]
        for tp, log in manager.partitions().items()
    }
    manager.close()
    return Archived(f"s3://{bucket}/replicas/one", s3_server.endpoint, segments)


def load(spark, archived: Archived, **options: str):
    reader = spark.read.format("replicad").option("s3Endpoint", archived.endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(archived.url)


def test_the_bucket_reads_what_a_kafka_consumer_read(spark, replicated, archived):
    # read_committed: aborted records dropped, which needs the markers that follow a
    # split, found through a listing of the partition's objects (reader.py's lookahead).
    expected = replicated.committed
    got = rows_by_partition(load(spark, archived, isolation="read_committed"))
    want = {
        (topic, partition): consumer_rows(records)
        for topic, partitions in expected.items()
        for partition, records in partitions.items()
    }
    assert sorted(got) == sorted(want)
    for key in want:
        assert len(got[key]) == len(want[key]) > 0, key
        assert got[key] == want[key], key


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
    # One manifest per selected partition, and the one index the bounds fall in.
    assert sorted(planned) == sorted(["manifest.json", f"{bases[1]:020d}.index"])


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
