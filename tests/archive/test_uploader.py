"""The uploader against a real S3 server (versitygw): rolled segments and their indexes go up
byte for byte, then the manifest; nothing twice; a crash's leftovers are written over under
the same keys; a bucket that is down is retried, counted and caught up; retention waits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from replicad.archive import manifest as manifest_module
from replicad.archive.check import verify_archived_partition
from replicad.archive.manifest import Manifest, decode_manifest, manifest_key, partition_prefix
from replicad.archive.store import ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.checkpoint import kafka_uuid
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream
from tools.peers.s3 import ACCESS_KEY, SECRET_KEY, S3Server, bucket_settings
from tools.peers.s3_proxy import S3FaultProxy
from tools.wait import until, wait_until

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024, segment_index_bytes=4096)
# Local retention that would delete every closed segment, but for the archive's hold.
RETAIN_ONE_BYTE = replace(CONFIG, retention_bytes=1)
TP = TopicPartition("orders", 2)
PREFIX = "replicas/east"


def settings(server: S3Server | S3FaultProxy, bucket: str, **kwargs: int) -> ArchiverSettings:
    return ArchiverSettings(
        bucket_settings(
            server.endpoint,
            bucket,
            PREFIX,
            connect_timeout_s=2.0,
            read_timeout_s=5.0,
            max_attempts=1,
        ),
        retry_backoff_ms=kwargs.get("retry_backoff_ms", 1),
        retry_backoff_max_ms=kwargs.get("retry_backoff_max_ms", 1),
        interval_ms=kwargs.get("interval_ms", 10),
    )


def filled(data_dir: Path, *, seed: int = 1, batches: int = 120) -> tuple[LogManager, uuid.UUID]:
    now = wall_ms()
    manager = LogManager.open(data_dir, CONFIG, now_ms=now)
    topic_id = uuid.uuid4()
    log = manager.get_or_create(TP, topic_id=topic_id)
    for raw in batch_stream(seed, batches):
        log.append(raw, scan_batches(raw).batches, now_ms=now)
    log.high_watermark = log.log_end_offset
    return manager, topic_id


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    """`filled(tmp_path)`'s log manager, closed after the test (also one that failed)."""
    manager, _ = filled(tmp_path)
    yield manager
    manager.close()


def store_of(server: S3Server, bucket: str) -> ObjectStore:
    return ObjectStore(settings(server, bucket).bucket)


def manifest_in(store: ObjectStore, tp: TopicPartition = TP) -> Manifest:
    """The manifest the bucket holds for `tp` under the store's prefix, with its chunks."""
    prefix = store.settings.prefix
    directory = partition_prefix(prefix, tp)
    return decode_manifest(
        store.get(manifest_key(prefix, tp)) or b"",
        source=f"{store.settings.bucket}/{manifest_key(prefix, tp)}",
        read=lambda name: store.get(directory + name),
    )


def test_rolled_segments_go_up_byte_for_byte_then_the_manifest(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    manager, topic_id = filled(tmp_path)
    log = manager.partitions()[TP]
    closed = log.segments[:-1]
    assert len(closed) >= 3
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) == len(closed)
    store = store_of(s3_server, s3_bucket)
    manifest = manifest_in(store)
    assert manifest.topic_id == kafka_uuid(topic_id)
    assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in closed]
    assert manifest.end_offset == log.active_segment.base_offset
    assert [(s.size, s.max_timestamp) for s in manifest.segments] == [
        (s.size, s.max_timestamp.timestamp) for s in closed
    ]
    assert manifest.epochs == tuple(log.epoch_entries())
    for segment in closed:
        for path in (segment.log_path, segment.index_path, segment.time_index_path):
            key = f"{PREFIX}/orders-2/{manifest.topic_id}/{path.name}"
            assert store.get(key) == path.read_bytes(), key
    # The active segment is not uploaded; retention may now delete what is archived.
    active = log.active_segment.log_path.name
    assert not any(key.endswith(active) for key in store.list_keys(f"{PREFIX}/"))
    assert log.archive_floor == manifest.end_offset
    # A second round finds nothing to do and sends nothing.
    puts = archiver.store.requests["PUT"] if archiver.store else None
    assert archiver.round(manager) == 0
    assert archiver.store is not None and archiver.store.requests["PUT"] == puts
    snap = archiver.snapshot()
    assert snap["uploaded_segments"] == len(closed)
    assert snap["pending_segments"] == 0 and snap["failures"] == 0
    assert snap["requests"]["PUT"] == 4 * len(closed)  # three files and a manifest each
    manager.close()


def test_nothing_above_the_high_watermark_goes_up(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    log = manager.partitions()[TP]
    log.high_watermark = log.segments[1].base_offset  # only the first segment is committed
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) == 1
    assert archiver.snapshot()["pending_segments"] == 0
    log.high_watermark = log.log_end_offset
    assert archiver.round(manager) == len(log.segments) - 2


def test_a_quiet_partition_is_rolled_after_segment_ms_and_uploaded(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    log = manager.partitions()[TP]
    segments, end = len(log.segments), log.log_end_offset
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) == segments - 1  # the active segment is young: kept
    later = log.active_segment.created_ms + CONFIG.segment_ms + 1
    assert archiver.round(manager, now_ms=later) == 1
    assert log.archive_floor == end and log.active_segment.is_empty


def test_a_restart_after_a_crash_mid_upload_writes_each_object_once(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    log = manager.partitions()[TP]
    first = Archiver(settings(s3_server, s3_bucket))
    log.high_watermark = log.segments[2].base_offset
    assert first.round(manager) == 2
    # What a crash during the third segment's upload leaves: its .log and .index up, no
    # .timeindex, and no manifest naming it.
    store = store_of(s3_server, s3_bucket)
    third = log.segments[2]
    manifest = manifest_in(store)
    segment_dir = f"{PREFIX}/orders-2/{manifest.topic_id}"
    store.put_file(f"{segment_dir}/{third.log_path.name}", third.log_path)
    store.put_file(f"{segment_dir}/{third.index_path.name}", third.index_path)
    log.high_watermark = log.log_end_offset
    restarted = Archiver(settings(s3_server, s3_bucket))  # reads the manifest again
    assert restarted.round(manager) == len(log.segments) - 3
    closed = log.segments[:-1]
    names = sorted(p.name for s in closed for p in (s.log_path, s.index_path, s.time_index_path))
    assert store.list_keys(f"{segment_dir}/") == [f"{segment_dir}/{n}" for n in names]
    manifest = manifest_in(store)
    assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in closed]


# The uploader of the SIGKILL test, in a process of its own: rounds until killed.
_CHILD = """
import sys
from pathlib import Path
from replicad.archive.store import BucketSettings
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager

data_dir, endpoint, bucket, prefix, key, secret = sys.argv[1:7]
manager = LogManager.open(Path(data_dir), LogConfig(segment_bytes=16 * 1024), now_ms=wall_ms())
settings = BucketSettings(bucket, prefix, endpoint=endpoint, region="us-east-1",
                          access_key_id=key, secret_access_key=secret, max_attempts=1)
archiver = Archiver(ArchiverSettings(settings, retry_backoff_ms=1, retry_backoff_max_ms=1))
while True:
    archiver.round(manager)
"""


def test_sigkill_mid_upload_then_a_restart_leaves_each_object_once(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    manager, _ = filled(tmp_path)
    closed = [s.base_offset for s in manager.partitions()[TP].segments[:-1]]
    manager.checkpoint()
    manager.close()
    store = store_of(s3_server, s3_bucket)
    with S3FaultProxy(s3_server.endpoint) as proxy:
        proxy.set_delay_ms(50)  # every request slow: the kill lands inside an upload
        argv = [tmp_path, proxy.endpoint, s3_bucket, PREFIX, ACCESS_KEY, SECRET_KEY]
        child = subprocess.Popen([sys.executable, "-c", _CHILD, *map(str, argv)])
        try:

            def archived() -> int:
                data = store.get(manifest_key(PREFIX, TP))
                return len(decode_manifest(data, source="m").segments) if data else 0

            wait_until(lambda: archived() >= 2, what="two segments archived by the child")
            child.kill()
        finally:
            child.kill()
            child.wait()
    reopened = LogManager.open(tmp_path, CONFIG, now_ms=wall_ms())
    Archiver(settings(s3_server, s3_bucket)).round(reopened)
    manifest = manifest_in(store)
    assert [s.base_offset for s in manifest.segments] == closed
    segment_dir = f"{PREFIX}/orders-2/{manifest.topic_id}"
    names = sorted(
        f"{base:020d}{suffix}" for base in closed for suffix in (".index", ".log", ".timeindex")
    )
    assert store.list_keys(f"{PREFIX}/") == sorted(
        [f"{segment_dir}/{n}" for n in names] + [manifest_key(PREFIX, TP)]
    )
    for segment in reopened.partitions()[TP].segments[:-1]:
        key = f"{segment_dir}/{segment.log_path.name}"
        assert store.get(key) == segment.log_path.read_bytes(), key
    reopened.close()


def test_a_topic_created_again_is_not_mixed_into_the_old_archive(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    old, _ = filled(tmp_path / "old")
    assert Archiver(settings(s3_server, s3_bucket)).round(old) > 0
    old.close()
    new, _ = filled(tmp_path / "new", seed=2)  # same name, another topic id
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(new) == 0
    snap = archiver.snapshot()
    assert snap["retrying_partitions"] == ["orders-2"]
    assert "was deleted and created again" in snap["last_error"]
    assert new.partitions()[TP].archive_floor is None  # the hold was never raised
    new.close()


def test_a_manifest_that_does_not_decode_is_that_partitions_retried_failure(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    """A manifest in the bucket this replicad cannot read (another version's, damaged
    before objects carried a CRC32C, edited by hand) fails its own partition, counted,
    shown and retried, with the retention hold unraised; the round goes on with the other
    partitions. (It raised LogError out of the round: the uploader's task ended for good,
    no line said so, and local retention waited for it forever.)"""
    other = TopicPartition("orders", 3)
    log = manager.get_or_create(other, topic_id=uuid.uuid4())
    now = wall_ms()
    for raw in batch_stream(2, 60):
        log.append(raw, scan_batches(raw).batches, now_ms=now)
    log.high_watermark = log.log_end_offset
    store = store_of(s3_server, s3_bucket)
    store.put_bytes(manifest_key(PREFIX, TP), b'{"not": "a manifest"')
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) == len(log.segments) - 1 > 0
    snap = archiver.snapshot()
    assert snap["failures"] == 1 and snap["retrying_partitions"] == ["orders-2"]
    assert "not a replicad archive manifest" in snap["last_error"]
    assert manager.partitions()[TP].archive_floor is None  # nothing deleted locally for it
    directory = partition_prefix(PREFIX, other)
    uploaded = decode_manifest(
        store.get(manifest_key(PREFIX, other)) or b"",
        source="m",
        read=lambda name: store.get(directory + name),
    )
    assert [s.base_offset for s in uploaded.segments] == [s.base_offset for s in log.segments[:-1]]


def test_local_retention_between_uploads_does_not_move_the_archives_log_start(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    manager, _ = filled(tmp_path, batches=60)
    manager.hold_for_archive()
    log = manager.partitions()[TP]
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) > 0
    # Local retention deletes what the archive holds, moving the local log start...
    log.config = RETAIN_ONE_BYTE
    log.enforce_retention(now_ms=0)
    assert log.log_start_offset > 0
    # ...then more is appended and rolled, and goes up.
    now = wall_ms()
    for raw in batch_stream(2, 60, first_offset=log.log_end_offset):
        log.append(raw, scan_batches(raw).batches, now_ms=now)
    log.high_watermark = log.log_end_offset
    assert archiver.round(manager) > 0
    store = store_of(s3_server, s3_bucket)
    manifest = manifest_in(store)
    assert manifest.segments[0].base_offset == 0
    assert manifest.log_start_offset == 0  # the bucket still has every record from 0
    manager.close()


def test_a_bucket_that_is_down_is_retried_counted_and_caught_up(
    tmp_path: Path,
) -> None:
    server = S3Server(tmp_path / "s3")
    with server:
        bucket = server.create_bucket("down")
        manager, _ = filled(tmp_path / "data")
        manager.hold_for_archive()
        log = manager.partitions()[TP]
        archiver = Archiver(settings(server, bucket, retry_backoff_ms=1, retry_backoff_max_ms=1))
        server.stop()
        assert archiver.round(manager) == 0
        snap = archiver.snapshot()
        assert snap["failures"] == 1 and snap["retrying_partitions"] == ["orders-2"]
        assert snap["last_error"].startswith(f"s3://{bucket}/")
        # Retention deletes nothing the archive does not have.
        before = len(log.segments)
        log.config = RETAIN_ONE_BYTE
        log.enforce_retention(now_ms=0)
        assert len(log.segments) == before
        server.start()  # the same port, the same data
        # The backoff (1 ms) may not have passed at the first round after the restart.
        wait_until(lambda: archiver.round(manager) > 0, what="the upload after the restart")
        assert archiver.snapshot()["uploaded_segments"] == before - 1
        assert archiver.snapshot()["retrying_partitions"] == []
        assert archiver.snapshot()["last_error"] is not None  # the last one seen stays shown
        log.enforce_retention(now_ms=0)
        assert len(log.segments) == 1  # everything archived could go
        manager.close()


def test_slow_down_answers_and_resets_are_retried_and_counted(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    log = manager.partitions()[TP]
    expected = len(log.segments) - 1
    with S3FaultProxy(s3_server.endpoint) as proxy:
        archiver = Archiver(settings(proxy, s3_bucket))
        proxy.fail_next(2)  # the manifest's first GET, then the first PUT
        proxy.reset_next(1)
        wait_until(
            lambda: (
                archiver.round(manager) >= 0
                and archiver.snapshot()["uploaded_segments"] == expected
            ),
            what="every segment uploaded through the faults",
        )
    assert proxy.stats.failed == 2 and proxy.stats.reset == 1
    snap = archiver.snapshot()
    # A fault fails the round it hits (boto3 may itself retry a reset connection once).
    assert 1 <= snap["failures"] <= 3
    assert "SlowDown" in (snap["last_error"] or "")
    assert snap["retrying_partitions"] == []
    store = store_of(s3_server, s3_bucket)
    manifest = manifest_in(store)
    assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in log.segments[:-1]]


def test_a_request_the_bucket_never_answers_times_out_and_is_retried(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    """The bucket takes a request and answers nothing (held in the fault proxy): the
    uploader's read timeout ends the round, the failure is counted and shown, and once the
    bucket answers again every segment goes up."""
    expected = len(manager.partitions()[TP].segments) - 1
    with S3FaultProxy(s3_server.endpoint) as proxy:
        base = settings(proxy, s3_bucket)
        archiver = Archiver(replace(base, bucket=replace(base.bucket, read_timeout_s=0.5)))
        proxy.hold()
        try:
            assert archiver.round(manager) == 0
            snap = archiver.snapshot()
            assert snap["failures"] == 1 and snap["retrying_partitions"] == ["orders-2"]
            assert "timeout" in (snap["last_error"] or "").lower(), snap["last_error"]
            assert proxy.stats.held >= 1
        finally:
            proxy.release()
        wait_until(
            lambda: (
                archiver.round(manager) >= 0
                and archiver.snapshot()["uploaded_segments"] == expected
            ),
            what="every segment uploaded once the bucket answers",
        )
    assert archiver.snapshot()["retrying_partitions"] == []
    manifest = manifest_in(store_of(s3_server, s3_bucket))
    assert [s.base_offset for s in manifest.segments] == [
        s.base_offset for s in manager.partitions()[TP].segments[:-1]
    ]


def test_partitions_upload_at_once_each_in_order(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    """Three partitions, two upload threads: two partitions' requests are in flight at once
    (held in the fault proxy until both are), and each partition's archive ends complete
    and in order."""
    now = wall_ms()
    others = [TopicPartition("orders", 3), TopicPartition("orders", 4)]
    for seed, tp in enumerate(others, start=2):
        log = manager.get_or_create(tp, topic_id=uuid.uuid4())
        for raw in batch_stream(seed, 60):
            log.append(raw, scan_batches(raw).batches, now_ms=now)
        log.high_watermark = log.log_end_offset
    logs = manager.partitions()
    expected = sum(len(logs[tp].segments) - 1 for tp in (TP, *others))
    with S3FaultProxy(s3_server.endpoint) as proxy:
        base = settings(proxy, s3_bucket)
        slow = replace(base.bucket, read_timeout_s=600.0)  # a hang's deadline, not a wait
        archiver = Archiver(replace(base, bucket=slow, upload_threads=2))
        proxy.hold()
        uploaded: list[int] = []
        rounds = threading.Thread(target=lambda: uploaded.append(archiver.round(manager)))
        rounds.start()
        try:
            wait_until(lambda: proxy.stats.held == 2, what="two partitions' requests at once")
        finally:
            proxy.release()
            rounds.join()
    assert uploaded == [expected]
    snap = archiver.snapshot()
    assert snap["failures"] == 0 and snap["uploaded_segments"] == expected
    store = store_of(s3_server, s3_bucket)
    for tp in (TP, *others):
        head = store.get(manifest_key(PREFIX, tp)) or b""
        directory = partition_prefix(PREFIX, tp)
        manifest = decode_manifest(
            head, source=str(tp), read=lambda name, d=directory: store.get(d + name)
        )
        closed = logs[tp].segments[:-1]
        assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in closed]
        report = verify_archived_partition(store, tp, head)  # each object there, batches checked
        assert not report.problems, report.problems


def test_the_shell_uploads_off_the_event_loop_until_stopped(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    archiver = Archiver(settings(s3_server, s3_bucket, interval_ms=5))
    expected = len(manager.partitions()[TP].segments) - 1

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(archiver.run(lambda: manager, stop))
        await until(
            lambda: archiver.snapshot()["uploaded_segments"] == expected,
            what="every rolled segment uploaded",
        )
        stop.set()
        await task

    asyncio.run(main())
    assert archiver.snapshot()["uploaded_segments"] == expected


@pytest.fixture(autouse=True)
def _no_aws_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings carry the credentials; a developer's own AWS files play no part."""
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


def test_remote_retention_deletes_the_oldest_after_the_manifest_and_a_crash_leftover_next(
    s3_server: S3Server, s3_bucket: str, manager: LogManager
) -> None:
    log = manager.partitions()[TP]
    closed = log.segments[:-1]
    keep_bytes = closed[-1].size + closed[-2].size  # the two newest stay
    archiver = Archiver(replace(settings(s3_server, s3_bucket), retention_bytes=keep_bytes))
    archiver.round(manager)
    store = store_of(s3_server, s3_bucket)
    manifest = manifest_in(store)
    assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in closed[-2:]]
    assert manifest.log_start_offset == closed[-2].base_offset
    assert manifest.end_offset == log.active_segment.base_offset  # uploads go on from here
    directory = f"{PREFIX}/orders-2/{manifest.topic_id}/"
    left = {key.rsplit("/", 1)[1].split(".")[0] for key in store.list_keys(directory)}
    assert left == {s.log_path.stem for s in closed[-2:]}
    assert archiver.snapshot()["deleted_segments"] == len(closed) - 2
    # A crash after a manifest naming fewer segments, before its objects were deleted: the
    # next process's first round deletes them, and nothing else.
    lost = manifest_in(store).without_first(1)
    store.put_bytes(manifest_key(PREFIX, TP), lost.encode())
    again = Archiver(settings(s3_server, s3_bucket))  # retention off: no sweep
    again.round(manager)
    assert len(store.list_keys(directory)) == 6
    restarted = Archiver(replace(settings(s3_server, s3_bucket), retention_ms=10**12))
    restarted.round(manager)
    assert [k.rsplit("/", 1)[1] for k in store.list_keys(directory)] == [
        closed[-1].log_path.stem + suffix for suffix in (".index", ".log", ".timeindex")
    ]


def test_a_long_archive_writes_a_bounded_manifest_its_chunks_once(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With chunks of 3 segments (256 by default): every segment costs its three files and
    one manifest of bounded size, plus one chunk PUT every 3 segments; a restarted uploader
    reads the chunked manifest back and sends nothing; verify finds every object named;
    remote retention deletes a chunk once none of its segments is kept."""
    monkeypatch.setattr(manifest_module, "CHUNK_SEGMENTS", 3)
    manager, _ = filled(tmp_path, batches=300)
    log = manager.partitions()[TP]
    closed = log.segments[:-1]
    assert len(closed) >= 10
    archiver = Archiver(settings(s3_server, s3_bucket))
    assert archiver.round(manager) == len(closed)
    store = store_of(s3_server, s3_bucket)
    manifest = manifest_in(store)
    assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in closed]
    chunks = (len(closed) - 1) // 3
    assert len(manifest.chunks) == chunks and len(manifest.own_segments) <= 3
    assert archiver.snapshot()["requests"]["PUT"] == 4 * len(closed) + chunks
    # The manifest in the bucket lists at most 3 segments of its own.
    head = store.get(manifest_key(PREFIX, TP)) or b""
    assert head.count(b"],[") < 3 + chunks + len(manifest.epochs)
    restarted = Archiver(settings(s3_server, s3_bucket))
    assert restarted.round(manager) == 0
    assert restarted.store is not None and restarted.store.requests["PUT"] == 0
    report = verify_archived_partition(store, TP, head)
    assert not report.problems and "no manifest names" not in report.name
    # Remote retention keeping the two newest segments: the chunks wholly expired are gone.
    keep_bytes = closed[-1].size + closed[-2].size
    expiring = Archiver(replace(settings(s3_server, s3_bucket), retention_bytes=keep_bytes))
    expiring.round(manager)
    kept = manifest_in(store)
    assert [s.base_offset for s in kept.segments] == [s.base_offset for s in closed[-2:]]
    directory = f"{PREFIX}/orders-2/{kept.topic_id}/"
    left = [k.rsplit("/", 1)[1] for k in store.list_keys(directory) if "manifest-" in k]
    assert left == [f"manifest-{c.base_offset:020d}.json" for c in kept.chunks]
    assert len(left) <= 1
    manager.close()
