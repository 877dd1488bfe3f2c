"""serve answering offsets that only the bucket holds (KIP-405's remote fetch), with a real S3
server (versitygw), the real uploader, and real clients: kafka-python reads from offset 0
after local retention deleted the first segments; a consumer of the local tail is answered
while a read of the bucket is held in the fault proxy; ListOffsets EARLIEST answers the
bucket's start and EARLIEST_LOCAL the local one."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

from replicad.archive.manifest import manifest_key
from replicad.archive.read_cache import ReadCache
from replicad.archive.remote_log import RemoteLog
from replicad.archive.store import BucketSettings, ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import monotonic_ms, wall_ms
from replicad.leader.handlers import EARLIEST_LOCAL_TIMESTAMP, list_offsets_response
from replicad.leader.reads import TransactionTracker
from replicad.leader.remote_fetch import LATEST_TIERED_TIMESTAMP, RemoteFetch
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.requests import OffsetQuery, list_offsets_request
from replicad.records.batch import scan_batches
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from replicad.wire import EARLIEST_TIMESTAMP, READ_COMMITTED
from tests.leader.conftest import ServedInThread, control_batch, transactional_batch
from tools.logdata.batches import producer_batch
from tools.peers.kcat import run_kcat
from tools.peers.process import free_port
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server, client_environ
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
    return BucketSettings(
        name,
        "replicas",
        endpoint=endpoint,
        region=REGION,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        connect_timeout_s=5.0,
        read_timeout_s=60.0,
        max_attempts=1,
    )


def value(i: int) -> bytes:
    return f"record-{i:05d}-".encode() + bytes(40)


@dataclass
class Archived:
    logs: LogManager
    local_start: int
    end: int


@pytest.fixture
def archived(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> Iterator[Archived]:
    """A partition of RECORDS one-record batches, its closed segments in the bucket and
    deleted locally by retention."""
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    logs.hold_for_archive()
    plog = logs.get_or_create(TP, topic_id=uuid.uuid4())
    data = b"".join(producer_batch(i, [value(i)]) for i in range(RECORDS))
    plog.append(data, scan_batches(data).batches, now_ms=now)
    logs.checkpoint({TP: plog.log_end_offset})
    archiver = Archiver(ArchiverSettings(bucket(s3_server.endpoint, s3_bucket)))
    assert archiver.round(logs) == len(plog.segments) - 1
    logs.enforce_retention(now)
    assert plog.log_start_offset == plog.active_segment.base_offset > 0
    try:
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
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
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
            assert server.metrics()["remote_fetches_in_flight"] == 1
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
    assert server.metrics().get("connection_failures_total", 0) == 0


def test_list_offsets_answers_the_buckets_start_and_the_local_start(
    archived: Archived, s3_server: S3Server, s3_bucket: str, served: Callable[..., ServedInThread]
) -> None:
    server = served(archived.logs, remote_fetch(s3_server.endpoint, s3_bucket))

    def offsets(timestamp: int, isolation: int = 0) -> int:
        request = list_offsets_request(8, {TP: OffsetQuery(timestamp)}, isolation_level=isolation)
        local = list_offsets_response(
            8, request, server.server.catalog, TransactionTracker(), now_ms=0
        )
        body = server.run(server.server.remote.list_offsets(request, local))
        (partition,) = body.topics[0].partitions
        return int(partition.offset)

    assert offsets(EARLIEST_TIMESTAMP) == 0
    assert offsets(EARLIEST_LOCAL_TIMESTAMP) == archived.local_start
    assert offsets(LATEST_TIERED_TIMESTAMP) == archived.local_start - 1
    assert offsets(EARLIEST_TIMESTAMP, READ_COMMITTED) == 0
    # A partition this server does not have: no GET, nothing kept (the name is the client's).
    remote = server.server.remote
    gets = remote.remote.store.requests["GET"]
    unknown = TopicPartition("no-such-topic", 0)
    request = list_offsets_request(8, {unknown: OffsetQuery(EARLIEST_TIMESTAMP)})
    local = list_offsets_response(8, request, server.server.catalog, TransactionTracker(), now_ms=0)
    assert server.run(remote.list_offsets(request, local)) == local
    assert remote.remote.store.requests["GET"] == gets
    assert remote.remote.known_manifest(unknown) is None


def test_read_committed_from_the_bucket_skips_aborted_transactions(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, served: Callable[..., ServedInThread]
) -> None:
    """Aborted and committed transactions in archived segments, and one aborted only in the
    local log (its marker found past the archive's end): a read_committed consumer from 0
    gets every committed record and nothing else."""
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
    now = wall_ms()
    logs = LogManager.open(tmp_path / "data", CONFIG, now_ms=now)
    try:
        logs.hold_for_archive()
        plog = logs.get_or_create(TP, topic_id=uuid.uuid4())
        data = b"".join(batches)
        plog.append(data, scan_batches(data).batches, now_ms=now)
        logs.checkpoint({TP: plog.log_end_offset})
        Archiver(ArchiverSettings(bucket(s3_server.endpoint, s3_bucket))).round(logs)
        logs.enforce_retention(now)
        assert 200 < plog.log_start_offset <= 399  # the last transaction ends locally
        server = served(logs, remote_fetch(s3_server.endpoint, s3_bucket))
        c = consumer(server.bootstrap, isolation_level="read_committed")
        try:
            ktp = KTP(TP.topic, TP.partition)
            c.assign([ktp])
            c.seek_to_beginning(ktp)
            got = read_until(c, committed[-1] + 1)
        finally:
            c.close()
        assert got == [(i, value(i)) for i in committed]
        assert server.metrics()["remote_fetches_total"] > 0
    finally:
        logs.close()


def test_replicad_serve_with_archive_answers_kcat_from_offset_0(
    archived: Archived, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
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
