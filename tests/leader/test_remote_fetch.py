"""serve answering offsets that only the bucket holds (KIP-405's remote fetch), with a real S3
server (versitygw), the real uploader, and real clients: kafka-python reads from offset 0
after local retention deleted the first segments; a consumer of the local tail is answered
while a read of the bucket is held in the fault proxy; ListOffsets EARLIEST answers the
bucket's start and EARLIEST_LOCAL the local one."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from replicad.archive.manifest import manifest_key
from replicad.archive.read_cache import ReadCache
from replicad.archive.remote_log import RemoteLog
from replicad.archive.store import BucketSettings, ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import monotonic_ms, wall_ms
from replicad.control.health import assess
from replicad.leader import remote_fetch as remote_fetch_module
from replicad.leader.handlers import EARLIEST_LOCAL_TIMESTAMP, list_offsets_response
from replicad.leader.reads import TransactionTracker
from replicad.leader.remote_fetch import (
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    RemoteFetch,
)
from replicad.log import nowait
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.requests import OffsetQuery, list_offsets_request
from replicad.records.batch import scan_batches
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from replicad.wire import EARLIEST_TIMESTAMP, READ_COMMITTED
from tests.leader.conftest import ServedInThread, control_batch, transactional_batch
from tests.page_cache import cached
from tools.logdata.batches import producer_batch
from tools.peers.kcat import run_kcat
from tools.peers.process import free_port
from tools.peers.s3 import S3Server, bucket_settings, client_environ
from tools.peers.s3_proxy import S3FaultProxy
from tools.replica import replicad_serve
from tools.wait import wait_until

TP = TopicPartition("history", 0)
RECORDS = 400
# Small segments, and a local retention that deletes every segment the bucket has.
CONFIG = LogConfig(
    segment_bytes=4096, index_interval_bytes=512, segment_index_bytes=4096, retention_bytes=1
)


def bucket(endpoint: str, name: str) -> BucketSettings:
    return bucket_settings(
        endpoint, name, "replicas", connect_timeout_s=5.0, read_timeout_s=60.0, max_attempts=1
    )


def value(i: int) -> bytes:
    return f"record-{i:05d}-".encode() + bytes(40)


@dataclass
class Archived:
    logs: LogManager
    local_start: int
    end: int


@pytest.fixture
def archived(
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    chunk_segments: int,
) -> Iterator[Archived]:
    """A partition of RECORDS one-record batches, its closed segments in the bucket and
    deleted locally by retention (in chunked manifests where a test asks `chunk_segments`)."""
    batches = [producer_batch(i, [value(i)]) for i in range(RECORDS)]
    with archive_of(batches, tmp_path, s3_server, s3_bucket) as done:
        assert done.local_start == done.logs.partitions()[TP].active_segment.base_offset > 0
        yield done


@contextlib.contextmanager
def archive_of(
    batches: list[bytes], tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> Iterator[Archived]:
    """A partition of `batches`, all its closed segments uploaded to the bucket, then
    deleted locally by retention; its logs closed when the block ends."""
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    try:
        logs.hold_for_archive()
        plog = logs.get_or_create(TP, topic_id=uuid.uuid4())
        data = b"".join(batches)
        plog.append(data, scan_batches(data).batches, now_ms=now)
        logs.checkpoint({TP: plog.log_end_offset})
        archiver = Archiver(ArchiverSettings(bucket(s3_server.endpoint, s3_bucket)))
        assert archiver.round(logs) == len(plog.segments) - 1
        logs.enforce_retention(now)
        yield Archived(logs, plog.log_start_offset, plog.log_end_offset)
    finally:
        logs.close()


def remote_fetch(endpoint: str, name: str, *, cache_bytes: int = 1 << 20) -> RemoteFetch:
    store = ObjectStore(bucket(endpoint, name))
    return RemoteFetch(RemoteLog(store, ReadCache(cache_bytes)), threads=2, now_ms=monotonic_ms)


@pytest.fixture
def served() -> Iterator[Callable[[LogManager, RemoteFetch], ServedInThread]]:
    started: list[ServedInThread] = []

    def start(logs: LogManager, remote: RemoteFetch) -> ServedInThread:
        started.append(ServedInThread(logs, remote=remote))
        return started[-1]

    yield start
    for s in started:
        s.close()


def consumer(bootstrap: str, **kwargs: object) -> KafkaConsumer:
    kwargs.setdefault("group_id", None)
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=2048,  # many fetches, some across segment ends
        request_timeout_ms=120_000,
        **kwargs,
    )


def read_until(c: KafkaConsumer, end: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    wait_until(
        lambda: (
            got.extend((r.offset, r.value) for rs in c.poll(200).values() for r in rs)
            or (got and got[-1][0] >= end - 1)
        ),
        timeout_s=120,
        what=f"records up to offset {end - 1}",
    )
    return got


def read_from_the_start(bootstrap: str, end: int) -> list[tuple[int, bytes]]:
    """TP's records up to `end` as a read_committed consumer reads them from its start."""
    c = consumer(bootstrap, isolation_level="read_committed")
    try:
        ktp = KTP(TP.topic, TP.partition)
        c.assign([ktp])
        c.seek_to_beginning(ktp)
        return read_until(c, end)
    finally:
        c.close()


def test_a_consumer_reads_from_offset_0_after_the_local_copy_is_gone(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    remote = remote_fetch(s3_server.endpoint, s3_bucket)
    server = served(archived.logs, remote)
    c = consumer(server.bootstrap, auto_offset_reset="earliest")
    try:
        ktp = KTP(TP.topic, TP.partition)
        c.assign([ktp])
        # ListOffsets EARLIEST answers the bucket's log start, not the local one.
        assert c.beginning_offsets([ktp])[ktp] == 0
        c.seek_to_beginning(ktp)
        got = read_until(c, archived.end)
    finally:
        c.close()
    assert got == [(i, value(i)) for i in range(RECORDS)]
    metrics = server.metrics()
    assert metrics["remote_fetches_total"] > 0
    assert 0 < metrics["remote_cache_bytes"] <= 1 << 20
    assert metrics["remote_fetch_bytes_total"] > 0
    assert metrics.get("remote_fetch_errors_total", 0) == 0


def test_a_second_partition_below_the_local_start_waits_its_turn_not_reset(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, served: Callable[..., ServedInThread]
) -> None:
    """Two partitions below their local start, fetched together from committed offsets
    (no ListOffsets first, so no manifest read yet): the one not read from the bucket this
    time answers no records and no error, never OFFSET_OUT_OF_RANGE (the client would
    reset it to the end and skip what the bucket holds)."""
    other = TopicPartition(TP.topic, 1)
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    try:
        logs.hold_for_archive()
        topic_id = uuid.uuid4()
        for tp in (TP, other):
            plog = logs.get_or_create(tp, topic_id=topic_id)
            data = b"".join(producer_batch(i, [value(i)]) for i in range(RECORDS))
            plog.append(data, scan_batches(data).batches, now_ms=now)
        logs.checkpoint({tp: RECORDS for tp in (TP, other)})
        Archiver(ArchiverSettings(bucket(s3_server.endpoint, s3_bucket))).round(logs)
        logs.enforce_retention(now)
        assert all(p.log_start_offset > 0 for p in logs.partitions().values())
        server = served(logs, remote_fetch(s3_server.endpoint, s3_bucket))
        c = consumer(server.bootstrap, auto_offset_reset="latest")
        try:
            ktps = [KTP(tp.topic, tp.partition) for tp in (TP, other)]
            c.assign(ktps)
            for ktp in ktps:
                c.seek(ktp, 0)
            got: dict[int, list[int]] = {0: [], 1: []}

            def both_read() -> bool:
                for ktp, rs in c.poll(200).items():
                    got[ktp.partition].extend(r.offset for r in rs)
                return all(g and g[-1] >= RECORDS - 1 for g in got.values())

            wait_until(
                both_read,
                timeout_s=120,
                what="both partitions read to their end",
            )
        finally:
            c.close()
        assert got == {0: list(range(RECORDS)), 1: list(range(RECORDS))}
    finally:
        logs.close()


def test_the_local_tail_is_served_while_a_read_of_the_bucket_waits(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    with S3FaultProxy(s3_server.endpoint) as proxy:
        server = served(archived.logs, remote_fetch(proxy.endpoint, s3_bucket))
        ktp = KTP(TP.topic, TP.partition)
        proxy.hold()
        old_records: list[tuple[int, bytes]] = []

        def read_old() -> None:
            c = consumer(server.bootstrap)
            try:
                c.assign([ktp])
                c.seek(ktp, 0)
                old_records.extend(read_until(c, archived.end))
            finally:
                c.close()

        reader = threading.Thread(target=read_old, daemon=True)
        reader.start()
        try:
            wait_until(lambda: proxy.stats.held >= 1, timeout_s=60, what="a held bucket read")
            metrics = server.metrics()
            assert metrics["remote_fetches_in_flight"] == 1
            # The held read's answer is charged to the request pool before it is read.
            assert metrics["request_pool_used_bytes"] >= 2048
            # The tail, read by another consumer meanwhile: every local record.
            tail = consumer(server.bootstrap)
            try:
                tail.assign([ktp])
                tail.seek(ktp, archived.local_start)
                got = read_until(tail, archived.end)
            finally:
                tail.close()
            assert got == [(i, value(i)) for i in range(archived.local_start, RECORDS)]
            # The read of the bucket was still waiting all along, and nothing old came.
            assert proxy.stats.held >= 1 and not old_records
        finally:
            proxy.release()
        reader.join(120)
    assert old_records == [(i, value(i)) for i in range(RECORDS)]
    # Every answer was sent: the pool has everything back.
    assert server.metrics()["request_pool_used_bytes"] == 0


def test_a_manifest_that_is_not_one_answers_kafka_storage_error(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    """A manifest in the bucket that does not decode is the bucket's fault: the fetch is
    answered KAFKA_STORAGE_ERROR (counted; the client retries), its connection stays open."""
    remote = remote_fetch(s3_server.endpoint, s3_bucket)
    remote.remote.store.put_bytes(manifest_key("replicas", TP), b"not a manifest")
    server = served(archived.logs, remote)
    c = consumer(server.bootstrap)
    got: list[object] = []
    try:
        ktp = KTP(TP.topic, TP.partition)
        c.assign([ktp])
        c.seek(ktp, 0)
        wait_until(
            lambda: (
                got.extend(r for rs in c.poll(200).values() for r in rs) is None
                and server.metrics().get("remote_fetch_errors_total", 0) >= 2
            ),
            timeout_s=60,
            what="the bad manifest counted as a failed read",
        )
    finally:
        c.close()
    assert not got
    metrics = server.metrics()
    assert metrics.get("connection_failures_total", 0) == 0
    # Health says so while no read succeeds.
    assert metrics["remote_read_failing"] == 1
    assert "not a replicad archive manifest" in metrics["remote_last_error"]
    reasons = assess({"ready": True, "serve": metrics}).reasons
    assert [r.code for r in reasons] == ["serve_remote_failing"]


def test_list_offsets_answers_the_buckets_start_and_the_local_start(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    server = served(archived.logs, remote_fetch(s3_server.endpoint, s3_bucket))

    def offsets(timestamp: int, isolation: int = 0) -> int:
        request = list_offsets_request(8, {TP: OffsetQuery(timestamp)}, isolation_level=isolation)
        local = list_offsets_response(
            8, request, server.server.catalog, TransactionTracker(), now_ms=0
        )
        body = server.run(server.server.remote.list_offsets(request, local, server.server.catalog))
        (partition,) = body.topics[0].partitions
        return int(partition.offset)

    assert offsets(EARLIEST_TIMESTAMP) == 0
    assert offsets(EARLIEST_LOCAL_TIMESTAMP) == archived.local_start
    assert offsets(LATEST_TIERED_TIMESTAMP) == archived.local_start - 1
    assert offsets(EARLIEST_PENDING_UPLOAD_TIMESTAMP) == archived.local_start
    assert offsets(EARLIEST_TIMESTAMP, READ_COMMITTED) == 0
    # A partition this server does not have: no GET, nothing kept (the name is the client's).
    remote = server.server.remote
    gets = remote.remote.store.requests["GET"]
    unknown = TopicPartition("no-such-topic", 0)
    request = list_offsets_request(8, {unknown: OffsetQuery(EARLIEST_TIMESTAMP)})
    local = list_offsets_response(8, request, server.server.catalog, TransactionTracker(), now_ms=0)
    assert server.run(remote.list_offsets(request, local, server.server.catalog)) == local
    assert remote.remote.store.requests["GET"] == gets
    assert remote.remote.known_manifest(unknown) is None


def test_read_committed_from_the_bucket_skips_aborted_transactions(
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    served: Callable[..., ServedInThread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Aborted and committed transactions in archived segments, and one aborted only in the
    local log (its marker found past the archive's end): a read_committed consumer from 0
    gets every committed record and nothing else. Every transaction fold on serve's loop,
    the one for an answer from the bucket's included, runs where it may not wait on the
    disk (log/nowait.py); the bucket's answer's fold waited before (fails on the code
    before: a fold with waiting allowed)."""
    on_loop: list[bool] = []
    real_state = TransactionTracker.state
    loop_thread: list[int] = []

    def state(tracker: TransactionTracker, tp: TopicPartition, plog: Any) -> Any:
        if threading.get_ident() in loop_thread:
            on_loop.append(nowait.waiting_allowed())
        return real_state(tracker, tp, plog)

    monkeypatch.setattr(TransactionTracker, "state", state)
    batches, committed = [], []
    for i in range(400):
        if i in (100, 102):
            batches.append(transactional_batch(i, [value(i)], producer_id=7))
        elif i in (101, 200):
            batches.append(transactional_batch(i, [value(i)], producer_id=8 if i == 101 else 9))
            if i == 101:
                committed.append(i)
        elif i in (103, 104, 399):
            pid, kind = {103: (8, ControlType.COMMIT), 104: (7, ControlType.ABORT),
                         399: (9, ControlType.ABORT)}[i]  # fmt: skip
            batches.append(control_batch(i, producer_id=pid, control_type=kind))
        else:
            batches.append(producer_batch(i, [value(i)]))
            committed.append(i)
    with archive_of(batches, tmp_path, s3_server, s3_bucket) as done:
        assert 200 < done.local_start <= 399  # the last transaction ends locally
        cached(done.logs.partitions()[TP].active_segment.log_path)  # skips on tmpfs
        server = served(done.logs, remote_fetch(s3_server.endpoint, s3_bucket))
        loop_thread.append(server.server._loop_thread)
        got = read_from_the_start(server.bootstrap, committed[-1] + 1)
        assert got == [(i, value(i)) for i in committed]
        assert server.metrics()["remote_fetches_total"] > 0
    assert on_loop and not any(on_loop), on_loop


@pytest.mark.parametrize("chunk_segments", [3], indirect=True)
def test_replicad_serve_with_archive_answers_kcat_from_offset_0(
    archived: Archived, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Through a manifest whose oldest segments are sealed in chunk objects (of 3 segments
    here, 256 in the product): `replicad serve` reads them, then the segments they name."""
    key = manifest_key("replicas", TP)
    body = json.loads(s3_server.client().get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    assert len(body["chunks"]) >= 2
    data_dir = archived.logs.data_dir
    archived.logs.close()  # serve takes the data directory's lock
    port = free_port()
    flags = ("--archive", f"s3://{s3_bucket}/replicas", "--s3-endpoint", s3_server.endpoint)
    env = {**os.environ, **client_environ()}
    with replicad_serve(data_dir, port, log_path=tmp_path / "serve.log", flags=flags, env=env):
        out = run_kcat(
            "-C", "-b", f"127.0.0.1:{port}", "-t", TP.topic, "-p", "0", "-o", "beginning",
            "-e", "-q", "-f", "%o %s\n", timeout_s=120,
        ).stdout  # fmt: skip
    rows = [line.split(b" ", 1) for line in out.splitlines()]
    assert [(int(o), v) for o, v in rows] == [(i, value(i)) for i in range(RECORDS)]


# -- ListOffsets by time, OffsetForLeaderEpoch, the archive's topic id --------------------

T0 = 1_700_000_000_000
PEAK_AT = 250  # an archived record with the partition's largest timestamp


def stamp(i: int) -> int:
    return T0 + 10**9 if i == PEAK_AT else T0 + i * 1000


def epoch_of(i: int) -> int:
    return 0 if i < 100 else 1 if i < 200 else 2


@pytest.fixture
def epochs_archived(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> Iterator[Archived]:
    """RECORDS records, one a batch, in leader epochs 0 (0-99), 1 (100-199) and 2, one
    timestamp a second but record PEAK_AT's; archived, then deleted locally but the last
    segment (the local epoch history then starts in epoch 2)."""
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    logs.hold_for_archive()
    plog = logs.get_or_create(TP, topic_id=uuid.uuid4())
    data = b"".join(
        producer_batch(i, [value(i)], leader_epoch=epoch_of(i), timestamp_ms=stamp(i))
        for i in range(RECORDS)
    )
    plog.append(data, scan_batches(data).batches, now_ms=now)
    logs.checkpoint({TP: plog.log_end_offset})
    Archiver(ArchiverSettings(bucket(s3_server.endpoint, s3_bucket))).round(logs)
    logs.enforce_retention(now)
    assert plog.log_start_offset > PEAK_AT
    assert [e.epoch for e in plog.epoch_entries()] == [2]
    try:
        yield Archived(logs, plog.log_start_offset, plog.log_end_offset)
    finally:
        logs.close()


def test_list_offsets_by_time_answers_archived_records(
    epochs_archived: Archived,
    s3_server: S3Server,
    s3_bucket: str,
    served: Callable[..., ServedInThread],
) -> None:
    """kafka-python's offsets_for_times and confluent-kafka's MAX_TIMESTAMP find records
    only the bucket holds (the local log alone answers its first record, or its own
    largest timestamp)."""
    from confluent_kafka import TopicPartition as CTP
    from confluent_kafka.admin import AdminClient, OffsetSpec

    server = served(epochs_archived.logs, remote_fetch(s3_server.endpoint, s3_bucket))
    c = consumer(server.bootstrap)
    ktp = KTP(TP.topic, TP.partition)
    try:
        found = c.offsets_for_times({ktp: stamp(50) - 1})[ktp]
        assert (found.offset, found.timestamp) == (50, stamp(50))
        # The first record reaching a local record's time is the archived PEAK_AT.
        local = epochs_archived.local_start + 1
        assert c.offsets_for_times({ktp: stamp(local)})[ktp].offset == PEAK_AT
        assert c.offsets_for_times({ktp: stamp(PEAK_AT) + 1})[ktp] is None
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    futures = admin.list_offsets({CTP(TP.topic, TP.partition): OffsetSpec.max_timestamp()})
    (answer,) = [f.result(60) for f in futures.values()]
    assert (answer.offset, answer.timestamp) == (PEAK_AT, stamp(PEAK_AT))
    assert answer.leader_epoch == epoch_of(PEAK_AT)


def test_offset_for_leader_epoch_answers_epochs_only_the_archive_knows(
    epochs_archived: Archived,
    s3_server: S3Server,
    s3_bucket: str,
    served: Callable[..., ServedInThread],
) -> None:
    """A confluent-kafka consumer assigned offset 250 in epoch 1, which lies past the end
    of epoch 1 (offset 200, which only the archive's epochs know), validates it (KIP-320:
    OffsetForLeaderEpoch), finds the divergence and goes on from 200."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP

    server = served(epochs_archived.logs, remote_fetch(s3_server.endpoint, s3_bucket))
    c = Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    got: list[int] = []
    try:
        c.assign([CTP(TP.topic, TP.partition, 250, leader_epoch=1)])

        def polled() -> bool:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.offset())
            return bool(got)

        wait_until(polled, timeout_s=120, what="a record after the validation")
    finally:
        c.close()
    assert any(k.startswith("OFFSET_FOR_LEADER_EPOCH") for k in server.server.requests)
    assert got[0] == 200


def test_list_offsets_ignores_an_archive_of_another_topic_id(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    """A manifest of another topic id (the topic deleted and created again) answers
    nothing: EARLIEST is the local log start, as Fetch does not read that archive."""
    import dataclasses

    from replicad.archive.manifest import decode_manifest

    remote = remote_fetch(s3_server.endpoint, s3_bucket)
    key = manifest_key("replicas", TP)
    old = decode_manifest(remote.remote.store.get(key) or b"", source=key)
    other = dataclasses.replace(old, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    remote.remote.store.put_bytes(key, other.encode())
    server = served(archived.logs, remote)
    c = consumer(server.bootstrap)
    try:
        ktp = KTP(TP.topic, TP.partition)
        assert c.beginning_offsets([ktp])[ktp] == archived.local_start
    finally:
        c.close()


def test_read_committed_finds_a_marker_further_than_one_search_goes(
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    served: Callable[..., ServedInThread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transaction whose COMMIT is further away than one fetch's marker search (made
    small here): the search resumes at each fetch, and the consumer gets the committed
    record and everything after it (it used to answer nothing, forever)."""
    monkeypatch.setattr(remote_fetch_module, "MARKER_SEARCH_BYTES", 4096)
    batches = []
    for i in range(RECORDS):
        if i == 20:
            batches.append(transactional_batch(i, [value(i)], producer_id=7))
        elif i == 300:
            batches.append(control_batch(i, producer_id=7, control_type=ControlType.COMMIT))
        else:
            batches.append(producer_batch(i, [value(i)]))
    expected = [i for i in range(RECORDS) if i != 300]
    with archive_of(batches, tmp_path, s3_server, s3_bucket) as done:
        remote = remote_fetch(s3_server.endpoint, s3_bucket)
        server = served(done.logs, remote)
        got = read_from_the_start(server.bootstrap, expected[-1] + 1)
        assert got == [(i, value(i)) for i in expected]
        # The marker, once found, is kept: it is not searched for again.
        assert list(remote._ends.values()) == [(300, False)]
