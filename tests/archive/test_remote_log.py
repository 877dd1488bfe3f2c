"""Reading archived records back from a real S3 server (versitygw): from the batch holding an
offset, whole batches within the allowance (the first whole when asked), never across a
segment, through the cache; None for what the archive does not hold."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.archive.read_cache import ReadCache
from replicad.archive.remote_log import RemoteLog
from replicad.archive.store import ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.checkpoint import kafka_uuid
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.s3 import S3Server, bucket_settings

TP = TopicPartition("events", 1)
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=512, segment_index_bytes=4096)


def batch(i: int) -> bytes:
    # Three records a batch: offsets inside a batch are asked for too.
    return producer_batch(3 * i, [f"{3 * i + k}".encode() * 20 for k in range(3)])


@pytest.fixture
def archive(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> Iterator[tuple[RemoteLog, LogManager]]:
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    plog = logs.get_or_create(TP, topic_id=uuid.uuid4())
    data = b"".join(batch(i) for i in range(60))
    plog.append(data, scan_batches(data).batches, now_ms=now)
    plog.high_watermark = plog.log_end_offset
    settings = bucket_settings(s3_server.endpoint, s3_bucket, "p")
    Archiver(ArchiverSettings(settings)).round(logs)
    try:
        yield RemoteLog(ObjectStore(settings), ReadCache(1 << 20)), logs
    finally:
        logs.close()


def test_a_read_starts_at_the_batch_holding_the_offset_and_stays_in_its_segment(
    archive: tuple[RemoteLog, LogManager],
) -> None:
    remote, logs = archive
    plog = logs.partitions()[TP]
    second = plog.segments[1]
    for offset in (0, 4, second.base_offset - 1, second.base_offset + 7):
        read = remote.read(TP, offset, 1 << 20, min_one=True, now_ms=0)
        assert read is not None
        local = plog.read(offset, 1 << 20).region
        assert local is not None
        # The whole rest of the segment, byte for byte as it is on disk.
        assert bytes(read.records) == local.read_bytes()
        batches = scan_batches(read.records).batches
        assert batches[0].base_offset <= offset <= batches[0].last_offset
        assert read.log_start_offset == 0


def test_the_allowance_takes_whole_batches_and_the_first_only_when_asked(
    archive: tuple[RemoteLog, LogManager],
) -> None:
    remote, _ = archive
    one = len(batch(0))
    read = remote.read(TP, 0, 2 * one + 10, min_one=False, now_ms=0)
    assert read is not None and len(read.records) == 2 * one
    assert remote.read(TP, 0, 10, min_one=False, now_ms=0).records == b""  # type: ignore[union-attr]
    first = remote.read(TP, 0, 10, min_one=True, now_ms=0)
    assert first is not None and len(first.records) == one
    cut = remote.read(TP, 0, 10, min_one=False, hard_limit=True, now_ms=0)
    assert cut is not None and bytes(cut.records) == batch(0)[:10]


def test_what_the_archive_does_not_hold_is_none_and_reads_come_from_the_cache(
    archive: tuple[RemoteLog, LogManager],
) -> None:
    remote, logs = archive
    plog = logs.partitions()[TP]
    assert remote.read(TP, plog.active_segment.base_offset, 1 << 20, min_one=True, now_ms=0) is None
    assert remote.read(TopicPartition("none", 0), 0, 100, min_one=True, now_ms=0) is None
    other_id = kafka_uuid(uuid.uuid4())
    assert remote.read(TP, 0, 100, min_one=True, topic_id=other_id, now_ms=0) is None
    assert remote.read(TP, 0, 100, min_one=True, now_ms=0) is not None
    gets = remote.store.requests["GET"]
    assert remote.read(TP, 0, 100, min_one=True, now_ms=1) is not None
    assert remote.store.requests["GET"] == gets  # manifest, index and chunk all cached
