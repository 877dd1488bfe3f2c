"""`replicad verify s3://...` and `replicad dump-log s3://...` against a real S3 server
(versitygw): an archive the uploader wrote is clean; a flipped byte, a missing object and a
manifest that lies about a size are each named; dump-log prints a partition's batches and
one object's; objects no manifest names are counted, not failed."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.archive.manifest import (
    chunk_name,
    manifest_key,
    partition_prefix,
    segment_key,
)
from replicad.archive.store import BucketSettings, ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.cli import main
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tests.archive.test_uploader import manifest_in
from tools.logdata.batches import batch_stream
from tools.peers.s3 import S3Server, client_environ

PREFIX = "east"
TPS = (TopicPartition("orders", 0), TopicPartition("orders", 1))
CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=4096)


@pytest.fixture
def archived(
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk_segments: int,
) -> Iterator[ObjectStore]:
    for name, value in client_environ().items():
        monkeypatch.setenv(name, value)
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    for seed, tp in enumerate(TPS, start=1):
        plog = logs.get_or_create(tp, topic_id=uuid.uuid4())
        for raw in batch_stream(seed, 80):
            plog.append(raw, scan_batches(raw).batches, now_ms=now)
        plog.high_watermark = plog.log_end_offset
    settings = BucketSettings(s3_bucket, PREFIX, endpoint=s3_server.endpoint)
    assert Archiver(ArchiverSettings(settings)).round(logs) >= 4
    logs.close()
    yield ObjectStore(settings)


def cli(store: ObjectStore, *argv: str) -> int:
    return main([*argv, "--s3-endpoint", str(store.settings.endpoint)])


def test_an_uploaded_archive_verifies_clean_and_its_batches_dump(
    archived: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{archived.settings.bucket}/{PREFIX}"
    assert cli(archived, "verify", url) == 0
    out = capsys.readouterr().out
    assert "orders-0: ok (" in out and "orders-1: ok (" in out
    assert out.rstrip().endswith("2 partitions, all ok")
    assert cli(archived, "dump-log", f"{url}/orders-1") == 0
    dumped = capsys.readouterr().out
    manifest = manifest_in(archived, TPS[1])
    assert dumped.count("Dumping s3://") == len(manifest.segments)
    assert "baseOffset: 0 " in dumped and "isvalid: false" not in dumped
    key = segment_key(PREFIX, TPS[1], manifest.topic_id, manifest.segments[1].base_offset, ".log")
    assert cli(archived, "dump-log", f"s3://{archived.settings.bucket}/{key}") == 0
    one = capsys.readouterr().out
    assert one.count("Dumping s3://") == 1
    assert f"baseOffset: {manifest.segments[1].base_offset} " in one


@pytest.mark.parametrize("chunk_segments", [2], indirect=True)
def test_a_chunked_archive_verifies_and_dumps_whole_and_a_missing_chunk_is_named(
    archived: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Manifests whose oldest segments are sealed in chunk objects (of 2 segments here, 256
    in the product): verify and dump-log read every segment the chunks name; a chunk
    object gone is a problem named, not a shorter archive."""
    url = f"s3://{archived.settings.bucket}/{PREFIX}"
    manifests = [manifest_in(archived, tp) for tp in TPS]
    assert all(m.chunks for m in manifests)
    assert cli(archived, "verify", url) == 0
    out = capsys.readouterr().out
    for tp, manifest in zip(TPS, manifests, strict=True):
        end = manifest.segments[-1].next_offset - 1
        assert f"{tp.topic}-{tp.partition}: ok ({len(manifest.segments)} segments, " in out
        assert f"offsets 0..{end}, 0 gaps)" in out
    assert cli(archived, "dump-log", f"{url}/orders-0") == 0
    dumped = capsys.readouterr().out
    assert dumped.count("Dumping s3://") == len(manifests[0].segments)
    assert "baseOffset: 0 " in dumped and "isvalid: false" not in dumped
    chunk = chunk_name(manifests[1].topic_id, manifests[1].chunks[0].base_offset)
    archived._client.delete_object(
        Bucket=archived.settings.bucket, Key=partition_prefix(PREFIX, TPS[1]) + chunk
    )
    assert cli(archived, "verify", url) == 1
    out = capsys.readouterr().out
    assert "orders-0: ok (" in out
    line1 = next(line for line in out.splitlines() if line.startswith("orders-1"))
    assert "FAILED" in line1 and f"names chunk {chunk}, which is missing" in line1


def test_a_flipped_byte_a_missing_object_and_a_wrong_size_are_named(
    archived: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{archived.settings.bucket}/{PREFIX}"
    zero, one = manifest_in(archived, TPS[0]), manifest_in(archived, TPS[1])
    flipped = segment_key(PREFIX, TPS[0], zero.topic_id, zero.segments[1].base_offset, ".log")
    data = bytearray(archived.get(flipped) or b"")
    data[len(data) // 2] ^= 0xFF
    archived.put_bytes(flipped, bytes(data))
    missing = segment_key(PREFIX, TPS[1], one.topic_id, one.segments[0].base_offset, ".index")
    archived._client.delete_object(Bucket=archived.settings.bucket, Key=missing)
    # A crash's leftover: an object no manifest names yet.
    leftover = segment_key(PREFIX, TPS[1], one.topic_id, 10**9, ".log")
    archived.put_bytes(leftover, b"")
    # A manifest that says a segment is a byte longer than its object.
    second = one.segments[1]
    lying = dataclasses.replace(
        one, segments=(one.segments[0], dataclasses.replace(second, size=second.size + 1),
                       *one.segments[2:]),
    )  # fmt: skip
    archived.put_bytes(manifest_key(PREFIX, TPS[1]), lying.encode())
    assert cli(archived, "verify", url) == 1
    out = capsys.readouterr().out
    line0 = next(line for line in out.splitlines() if line.startswith("orders-0"))
    assert "FAILED" in line0 and flipped.rsplit("/", 1)[1] in line0 and "CRC" in line0.upper()
    line1 = next(line for line in out.splitlines() if line.startswith("orders-1"))
    assert f"{missing}: named by the manifest, missing" in line1
    assert "[1 objects no manifest names]" in line1
    assert f"{second.size} bytes, the manifest says {second.size + 1}" in line1
    assert out.rstrip().endswith("problems found")


def _damage_at_rest(s3_server: S3Server, bucket: str, key: str) -> None:
    """One byte of the object flipped in the bucket's own copy (versitygw's posix backend
    keeps each object as a file), its stored CRC32C left as it was: bit rot, not a PUT."""
    with open(s3_server.data / bucket / key, "r+b") as f:
        f.seek(0, 2)
        middle = f.tell() // 2
        f.seek(middle)
        byte = f.read(1)[0]
        f.seek(middle)
        f.write(bytes([byte ^ 0xFF]))


def test_an_object_damaged_in_the_bucket_is_named_on_its_partitions_line_and_the_rest_checked(
    archived: ObjectStore, s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bucket's stored CRC32C finds the damage when the object is read back: that is a
    problem of the partition it belongs to (one line a partition, exit 1), not the end of
    the check -- every other segment and partition is still checked. A manifest damaged so
    is its partition's line too."""
    bucket = archived.settings.bucket
    url = f"s3://{bucket}/{PREFIX}"
    zero = manifest_in(archived, TPS[0])
    damaged = segment_key(PREFIX, TPS[0], zero.topic_id, zero.segments[0].base_offset, ".log")
    _damage_at_rest(s3_server, bucket, damaged)
    assert cli(archived, "verify", url) == 1
    out = capsys.readouterr().out
    line0 = next(line for line in out.splitlines() if line.startswith("orders-0"))
    assert "FAILED" in line0 and f"{damaged}: the bytes read do not match the CRC32C" in line0
    # The segments after the damaged one were read: from the next one to the last one.
    span = f"offsets {zero.segments[1].base_offset}..{zero.segments[-1].next_offset - 1},"
    assert span in line0
    assert "orders-1: ok (" in out
    assert out.rstrip().endswith("2 partitions, problems found")
    # dump-log says so too, and still dumps every segment (the damaged one as read).
    assert cli(archived, "dump-log", f"{url}/orders-0") == 1
    dumped = capsys.readouterr().out
    assert f"PROBLEM s3://{bucket}/{damaged}: the bytes read do not match" in dumped
    assert dumped.count("Dumping s3://") == len(zero.segments)
    _damage_at_rest(s3_server, bucket, manifest_key(PREFIX, TPS[1]))
    assert cli(archived, "verify", url) == 1
    out = capsys.readouterr().out
    line1 = next(line for line in out.splitlines() if line.startswith("orders-1"))
    assert "FAILED" in line1 and "manifest.json: the bytes read do not match" in line1
    assert out.rstrip().endswith("2 partitions, problems found")


def test_a_bucket_that_cannot_be_read_is_an_error_not_a_clean_check(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in client_environ().items():
        monkeypatch.setenv(name, value)
    code = main(["verify", "s3://no-such-bucket/x", "--s3-endpoint", s3_server.endpoint])
    assert code == 1
    assert "no-such-bucket" in capsys.readouterr().err
