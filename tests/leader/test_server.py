"""The asyncio shell: connections, dispatch, long-polls woken by partition_changed,
sendfile, refusals that never drop a connection, and the session cache under a flood."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import random
import socket
import ssl
import struct
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsV0
from kio.schema.errors import ErrorCode

from replicad.errors import KafkaConnectionError
from replicad.leader import direct_send
from replicad.leader.frames import ResponseFrame
from replicad.leader.reads import FoldWouldWait
from replicad.leader.security import ServerSecurity
from replicad.leader.server import SMALL_REGION_BYTES, LeaderServer
from replicad.leader.settings import ServeSettings, serve_security_from_options
from replicad.log import nowait
from replicad.log.index import TimestampOffset
from replicad.log.manager import LogManager
from replicad.log.nowait import all_cached
from replicad.log.partition import PartitionLog
from replicad.log.segment import FileRegion, LogSegment
from replicad.protocol.codec import decode_response, request_type
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.requests import (
    OffsetQuery,
    list_offsets_request,
    make_entity,
    metadata_request,
)
from replicad.protocol.security import ConnectionSecurity
from replicad.records.batch import BatchHeader, scan_batches
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from tests.page_cache import cached, dropped
from tools.logdata.batches import producer_batch
from tools.peers.pki import make_test_pki
from tools.wait import DEADLINE_S, until

# The records' timestamp (producer_batch's default).
TS = 1_700_000_000_000

T0 = TopicPartition("t", 0)
TID = uuid.UUID(int=0xCAFE)
FOLLOWER = 7
SIZE = struct.Struct(">i")


@pytest.fixture
async def server(logs, fill) -> AsyncIterator[LeaderServer]:
    fill(logs, T0, [producer_batch(i, [f"v{i}".encode() * 50]) for i in range(3)], topic_id=TID)
    srv = LeaderServer(
        logs,
        ServeSettings(max_session_slots=2),
        allowed_followers=frozenset({FOLLOWER}),
        rng=random.Random(4),
    )
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


async def connect(srv: LeaderServer) -> BrokerConnection:
    conn = BrokerConnection(
        BrokerAddress(0, "127.0.0.1", srv.port),
        client_id="test",
        connect_timeout_s=DEADLINE_S,
        request_timeout_s=DEADLINE_S,
    )
    await conn.connect()
    return conn


# Longer than any test waits: a long-poll answered before it was woken, not by its timeout.
WAIT_LONG_MS = 600_000


async def waiting_fetches(server: LeaderServer, count: int) -> None:
    await until(
        lambda: server.metrics()["waiting_fetches"] == count,
        what=f"{count} fetch(es) waiting in the server",
    )


def fetch(
    *,
    offset: int = 0,
    replica_id: int = -1,
    session_id: int = 0,
    epoch: int = -1,
    partitions: tuple[RequestedPartition, ...] | None = None,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    version: int = 17,
) -> Any:
    parts = (
        partitions
        if partitions is not None
        else (RequestedPartition.of(T0, offset, 1 << 20, topic_id=TID),)
    )
    return fetch_request(
        version,
        FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=session_id,
            session_epoch=epoch,
            partitions=parts,
            replica_id=replica_id,
        ),
    )


def records_of(body: Any) -> bytes:
    return b"".join(p.records or b"" for t in body.responses for p in t.partitions)


def append(logs: LogManager, srv: LeaderServer, offset: int, value: bytes) -> None:
    plog = logs.partitions()[T0]
    data = producer_batch(offset, [value])
    plog.append(data, scan_batches(data).batches, now_ms=0)
    logs.checkpoint({T0: plog.log_end_offset})
    srv.partition_changed(T0)


# -- the ordinary path ----------------------------------------------------------------------


async def test_a_replicad_connection_negotiates_and_reads_the_segment_bytes(server, logs) -> None:
    conn = await connect(server)
    try:
        assert conn.versions is not None and conn.versions.versions[1] == 17
        meta = await conn.request(metadata_request(12, None))
        assert [(t.name, t.topic_id) for t in meta.topics] == [("t", TID)]
        assert (meta.brokers[0].host, meta.brokers[0].port) == ("127.0.0.1", server.port)
        body = await conn.request(fetch())
        on_disk = logs.partitions()[T0].active_segment.log_path.read_bytes()
        assert records_of(body) == on_disk
    finally:
        await conn.close()
    # A small segment is read and written with the response, not sent by sendfile.
    assert server.metrics()["copied_region_bytes_total"] == len(on_disk)


async def test_api_versions_newer_than_ours_is_answered_in_v0_with_the_list(server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        header = struct.pack(">hhi", 18, 99, 5) + b"\x00\x00\x00"
        writer.write(SIZE.pack(len(header)) + header)
        (size,) = SIZE.unpack(await reader.readexactly(4))
        body = decode_response(await reader.readexactly(size), ApiVersionsV0).body
        assert body.error_code == ErrorCode.unsupported_version
        assert 1 in {int(k.api_key) for k in body.api_keys}
    finally:
        writer.close()


# -- long-polls -----------------------------------------------------------------------------


async def test_a_waiting_fetch_answers_as_soon_as_the_partition_changes(server, logs) -> None:
    conn = await connect(server)
    try:
        pending = asyncio.create_task(conn.request(fetch(offset=3, max_wait_ms=WAIT_LONG_MS)))
        await waiting_fetches(server, 1)
        assert not pending.done()
        append(logs, server, 3, b"new")
        body = await pending
        [batch] = scan_batches(records_of(body)).batches
        assert batch.base_offset == 3
    finally:
        await conn.close()


async def test_a_waiting_fetch_times_out_empty(server) -> None:
    conn = await connect(server)
    try:
        # Nothing comes: answered at max_wait_ms by the server's own clock (that it waits
        # while nothing comes is the other long-poll tests' `not pending.done()`).
        body = await conn.request(fetch(offset=3, max_wait_ms=300))
        assert body.error_code == ErrorCode.none
        assert records_of(body) == b""
        assert server.metrics()["waiting_fetches"] == 0
    finally:
        await conn.close()


async def test_an_idle_incremental_fetch_is_woken_through_its_session(server, logs) -> None:
    conn = await connect(server)
    try:
        full = await conn.request(fetch(offset=3, epoch=0))
        assert full.session_id != 0
        pending = asyncio.create_task(
            conn.request(
                fetch(session_id=full.session_id, epoch=1, partitions=(), max_wait_ms=WAIT_LONG_MS)
            )
        )
        await waiting_fetches(server, 1)
        assert not pending.done()
        append(logs, server, 3, b"later")
        body = await pending
        assert body.error_code == ErrorCode.none
        assert [b.base_offset for b in scan_batches(records_of(body)).batches] == [3]
    finally:
        await conn.close()


async def test_a_change_reported_from_another_thread_reaches_the_loop(server, logs) -> None:
    conn = await connect(server)
    try:
        pending = asyncio.create_task(conn.request(fetch(offset=3, max_wait_ms=WAIT_LONG_MS)))
        await waiting_fetches(server, 1)
        thread = threading.Thread(target=append, args=(logs, server, 3, b"threaded"))
        thread.start()
        body = await pending
        thread.join()
        assert records_of(body)
    finally:
        await conn.close()


# -- ListOffsets reads the disk off the loop -----------------------------------------------


async def test_a_list_offsets_by_time_searches_the_disk_off_the_loop(server, monkeypatch) -> None:
    """A search by timestamp reads the time index and batches: on a worker thread, so a
    slow disk holds that request only, and another client connects (its ApiVersions) while
    it is held. Fails on the old code: the search ran on the loop's thread, and the other
    client's ApiVersions waited until the held search gave up (`released` false)."""
    real = PartitionLog.offset_for_timestamp
    release = threading.Event()
    searched_on: list[int] = []
    released: list[bool] = []

    def held(plog: PartitionLog, timestamp: int) -> Any:
        searched_on.append(threading.get_ident())
        released.append(release.wait(DEADLINE_S / 4))  # a disk that does not answer
        return real(plog, timestamp)

    monkeypatch.setattr(PartitionLog, "offset_for_timestamp", held)
    slow = await connect(server)
    other = None
    try:
        request = list_offsets_request(9, {T0: OffsetQuery(TS)})
        asking = asyncio.create_task(slow.request(request))
        await until(lambda: searched_on, what="the search by timestamp started")
        other = await connect(server)  # its ApiVersions answered while the search is held
        assert other.versions is not None
        release.set()
        body = await asking
    finally:
        release.set()
        await slow.close()
        if other is not None:
            await other.close()
    assert released == [True]
    assert searched_on[0] != server._loop_thread
    [[answer]] = [t.partitions for t in body.topics]
    assert (answer.error_code, answer.timestamp, answer.offset) == (ErrorCode.none, TS, 0)


async def test_a_fetch_of_bytes_not_in_the_page_cache_finds_them_off_the_loop(
    server, logs, monkeypatch
) -> None:
    """A Fetch whose batch header is not in the page cache is read on a worker thread (the
    loop's try, log/nowait.py, gives up at once), so a slow disk holds that Fetch only, and
    another client connects (its ApiVersions) while it is held. Failed on the code before
    dda9bfb: the header was read on the loop's thread, and the other client's ApiVersions
    waited until the held read gave up (`released` false)."""
    real = LogSegment.first_batch
    release = threading.Event()
    read_on: list[int] = []
    released: list[bool] = []

    def held(segment: LogSegment, offset: int) -> BatchHeader | None:
        read_on.append(threading.get_ident())
        if threading.get_ident() != server._loop_thread:
            released.append(release.wait(DEADLINE_S / 4))  # a disk that does not answer
        return real(segment, offset)

    dropped(logs.partitions()[T0].active_segment.log_path)
    monkeypatch.setattr(LogSegment, "first_batch", held)
    slow = await connect(server)
    other = None
    try:
        asking = asyncio.create_task(slow.request(fetch(offset=1)))
        await until(lambda: len(read_on) > 1, what="the fetch's read left the loop")
        other = await connect(server)  # its ApiVersions answered while the read is held
        assert other.versions is not None
        release.set()
        body = await asking
    finally:
        release.set()
        await slow.close()
        if other is not None:
            await other.close()
    assert released == [True]
    assert [t == server._loop_thread for t in read_on] == [True, False]
    assert server.metrics()["fetch_reads_off_loop_total"] == 1
    batches = scan_batches(records_of(body), verify_crc=False).batches
    assert [b.base_offset for b in batches] == [1, 2]


async def test_a_fetch_of_bytes_in_the_page_cache_reads_them_on_the_loop(
    server, logs, monkeypatch
) -> None:
    """A Fetch whose batch headers and records are all in the page cache reads them on the
    loop (RWF_NOWAIT): no hop to a worker thread, not even for the send. Fails on the code
    before (5473483): the header was found on a worker thread (`read_on` another thread)."""
    import replicad.leader.server as server_module

    real = LogSegment.first_batch
    read_on: list[int] = []
    assembled: list[int] = []

    def watched(segment: LogSegment, offset: int) -> BatchHeader | None:
        read_on.append(threading.get_ident())
        return real(segment, offset)

    real_assemble = server_module.assemble

    def watched_assemble(parts: Any) -> Any:
        assembled.append(len(parts))
        return real_assemble(parts)

    on_disk = logs.partitions()[T0].active_segment.log_path
    cached(on_disk)
    monkeypatch.setattr(LogSegment, "first_batch", watched)
    monkeypatch.setattr(server_module, "assemble", watched_assemble)
    conn = await connect(server)
    try:
        body = await conn.request(fetch(offset=1))
    finally:
        await conn.close()
    assert read_on == [server._loop_thread]
    assert assembled == []
    assert server.metrics().get("fetch_reads_off_loop_total", 0) == 0
    batches = scan_batches(records_of(body), verify_crc=False).batches
    assert [b.base_offset for b in batches] == [1, 2]


async def test_a_read_committed_fetch_folds_on_the_loop_what_a_worker_read_ahead(
    logs, fill, txn, monkeypatch
) -> None:
    """A READ_COMMITTED partition's transaction fold (its first: the whole log) does not
    wait on the disk on the loop: where its bytes are not cached it stops, a worker thread
    reads them ahead, and the fold goes on on the loop. The answer is the fold's, as
    before. Fails on the code before (the fold read the disk on the loop: no read ahead)."""
    tp = TopicPartition("x", 0)
    plog = fill(
        logs,
        tp,
        [
            producer_batch(0, [b"plain"]),
            txn.data(1, [b"aborted"], producer_id=11),
            txn.marker(2, producer_id=11, control_type=ControlType.ABORT),
            txn.data(3, [b"open"], producer_id=12),
        ],
    )
    cached(plog.active_segment.log_path)  # skipped where no read can tell (tmpfs)
    dropped(plog.active_segment.log_path)
    read_ahead_on: list[int] = []
    real = FoldWouldWait.read_ahead

    def watched(waiting: FoldWouldWait) -> int:
        read_ahead_on.append(threading.get_ident())
        return real(waiting)

    monkeypatch.setattr(FoldWouldWait, "read_ahead", watched)
    srv = LeaderServer(logs, ServeSettings(), rng=random.Random(4))
    await srv.start()
    try:
        conn = await connect(srv)
        try:
            request = FetchRequest(
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=1 << 20,
                isolation_level=1,
                session_id=0,
                session_epoch=-1,
                partitions=(RequestedPartition.of(tp, 0, 1 << 20),),
            )
            body = await conn.request(fetch_request(12, request))
        finally:
            await conn.close()
        metrics = srv.metrics()
    finally:
        await srv.close()
    [[answer]] = [t.partitions for t in body.responses]
    assert (answer.error_code, answer.last_stable_offset) == (ErrorCode.none, 3)
    assert [(a.producer_id, a.first_offset) for a in answer.aborted_transactions] == [(11, 1)]
    batches = scan_batches(answer.records, verify_crc=False).batches
    assert [b.base_offset for b in batches] == [0, 1, 2]
    assert read_ahead_on and srv._loop_thread not in read_ahead_on
    assert metrics["fold_reads_off_loop_total"] == len(read_ahead_on)


async def test_a_read_committed_fold_where_no_read_can_tell_is_not_read_ahead(
    logs, fill, txn, monkeypatch
) -> None:
    """On a file system that refuses RWF_NOWAIT (tmpfs: memory), or a platform without it,
    the fold cannot learn whether it would wait: it folds as before this rule, on the
    loop, and no worker reads its bytes ahead first (they would be read twice). Fails on
    1f1f0e2 (one read ahead, then the same stop, then the fold)."""
    tp = TopicPartition("x", 0)
    fill(
        logs,
        tp,
        [
            txn.data(0, [b"aborted"], producer_id=11),
            txn.marker(1, producer_id=11, control_type=ControlType.ABORT),
        ],
    )
    monkeypatch.setattr(nowait, "RWF_NOWAIT", 0)
    read_ahead: list[int] = []
    monkeypatch.setattr(FoldWouldWait, "read_ahead", lambda waiting: read_ahead.append(1) or 0)
    srv = LeaderServer(logs, ServeSettings(), rng=random.Random(4))
    await srv.start()
    try:
        conn = await connect(srv)
        try:
            request = FetchRequest(
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=1 << 20,
                isolation_level=1,
                session_id=0,
                session_epoch=-1,
                partitions=(RequestedPartition.of(tp, 0, 1 << 20),),
            )
            body = await conn.request(fetch_request(12, request))
        finally:
            await conn.close()
        metrics = srv.metrics()
    finally:
        await srv.close()
    [[answer]] = [t.partitions for t in body.responses]
    assert (answer.error_code, answer.last_stable_offset) == (ErrorCode.none, 2)
    assert [(a.producer_id, a.first_offset) for a in answer.aborted_transactions] == [(11, 0)]
    assert read_ahead == []
    assert metrics.get("fold_reads_off_loop_total", 0) == 0
    assert metrics["fetch_reads_off_loop_total"] == 1  # the records: a worker, as ever


async def test_a_fetch_with_nothing_to_read_reads_no_batch(server, monkeypatch) -> None:
    """A consumer at the high watermark is answered from the offsets alone: no header read,
    on any thread (an idle long-poll's reads cost no hop to a worker thread)."""
    read_on: list[int] = []
    real = LogSegment.first_batch

    def watched(segment: LogSegment, offset: int) -> BatchHeader | None:
        read_on.append(threading.get_ident())
        return real(segment, offset)

    monkeypatch.setattr(LogSegment, "first_batch", watched)
    conn = await connect(server)
    try:
        body = await conn.request(fetch(offset=3))
    finally:
        await conn.close()
    [[answer]] = [t.partitions for t in body.responses]
    assert (answer.error_code, answer.high_watermark, answer.records or b"") == (
        ErrorCode.none,
        3,
        b"",
    )
    assert read_on == []


async def test_a_small_fetch_answered_at_once_reads_its_bytes_in_the_same_hop(
    server, logs, monkeypatch
) -> None:
    """A Fetch whose records are at most SMALL_REGION_BYTES and that is answered at once gets
    them read with its batch headers, on the same worker thread: its send reads nothing
    more (no `assemble`, no second hop). One answered at its deadline, short of min_bytes,
    read none in its rounds (they might not have been sent): its send reads them (on this
    plaintext connection direct_send.py copies a region this small into its write)."""
    import replicad.leader.server as server_module

    assembled: list[int] = []
    real = server_module.assemble

    def watched(parts: Any) -> Any:
        assembled.append(len(parts))
        return real(parts)

    monkeypatch.setattr(server_module, "assemble", watched)
    on_disk = logs.partitions()[T0].active_segment.log_path.read_bytes()
    conn = await connect(server)
    try:
        small = await conn.request(fetch())
        assert (records_of(small), assembled) == (on_disk, [])
        short = await conn.request(fetch(min_bytes=1 << 20, max_wait_ms=50))
    finally:
        await conn.close()
    assert (records_of(short), assembled) == (on_disk, [])
    assert server.metrics()["copied_region_bytes_total"] == 2 * len(on_disk)
    assert server.metrics().get("direct_sends_total", 0) == int(direct_send.available())


def legacy_list_offsets_frame(correlation_id: int, timestamp: int, max_offsets: int) -> bytes:
    """ListOffsets v0 (kio has no layout for it), partition t-0: size prefix included."""
    client = b"test"
    header = struct.pack(">hhih", 2, 0, correlation_id, len(client)) + client
    body = struct.pack(">iih", -1, 1, 1) + b"t" + struct.pack(">iiqi", 1, 0, timestamp, max_offsets)
    return SIZE.pack(len(header) + len(body)) + header + body


async def test_list_offsets_v0_reads_the_segments_timestamps_off_the_loop(
    server, monkeypatch
) -> None:
    """v0 answers a timestamp with the segments older than it: their largest timestamps may
    be read from disk (an inactive segment's tail), so on a worker thread. Fails on the old
    code (read on the loop's thread); LATEST needs no disk and is answered on the loop."""
    real = LogSegment.max_timestamp
    read_on: list[int] = []

    def watched(segment: LogSegment) -> TimestampOffset:
        read_on.append(threading.get_ident())
        return real.__get__(segment)

    monkeypatch.setattr(LogSegment, "max_timestamp", property(watched))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(legacy_list_offsets_frame(1, TS + 1, 5))
        (size,) = SIZE.unpack(await reader.readexactly(4))
        answer = await reader.readexactly(size)
    finally:
        writer.close()
    # correlation id, one topic "t", one partition 0, no error, one offset: the segment at 0.
    assert answer == struct.pack(">iih", 1, 1, 1) + b"t" + struct.pack(">iihiq", 1, 0, 0, 1, 0)
    assert len(read_on) == 1 and read_on[0] != server._loop_thread


# -- followers and sessions -----------------------------------------------------------------


async def test_a_follower_id_not_allowed_is_refused_and_an_allowed_one_is_privileged(
    server,
) -> None:
    conn = await connect(server)
    try:
        refused = await conn.request(fetch(replica_id=5, epoch=0))
        [[p]] = [t.partitions for t in refused.responses]
        assert (p.error_code, refused.session_id, p.records) == (
            ErrorCode.not_leader_or_follower,
            0,
            b"",
        )
        allowed = await conn.request(fetch(replica_id=FOLLOWER, epoch=0))
        session = server.cache.session(allowed.session_id)
        assert session is not None and session.privileged
        assert server.metrics()["refused_followers_total"] == 1
    finally:
        await conn.close()


async def test_a_flood_of_consumers_cannot_evict_a_followers_session(server, logs, fill) -> None:
    for p in range(1, 6):  # bigger sessions than the follower's one-partition session
        fill(logs, TopicPartition("t", p), [producer_batch(0, [b"x"])], topic_id=TID)
    follower = await connect(server)
    try:
        created = await follower.request(fetch(replica_id=FOLLOWER, epoch=0))
        session_id = created.session_id
        assert session_id != 0
        everything = tuple(
            RequestedPartition.of(TopicPartition("t", p), 0, 1000, topic_id=TID) for p in range(6)
        )
        for _ in range(30):
            consumer = await connect(server)
            try:
                await consumer.request(fetch(epoch=0, partitions=everything))
            finally:
                await consumer.close()
        assert server.cache.session(session_id) is not None
        assert server.metrics()["sessions"] == 2  # the tiny cache: the follower and one consumer
        again = await follower.request(
            fetch(replica_id=FOLLOWER, session_id=session_id, epoch=1, partitions=())
        )
        assert (again.error_code, again.session_id) == (ErrorCode.none, session_id)
    finally:
        await follower.close()


# -- what is not served is answered, not dropped ----------------------------------------------


def produce_request(*, acks: int, records: bytes | None) -> Any:
    """A Produce v9 to topic "t" asking for `acks`: `records` for its partition 0, or no
    partition at all (None)."""
    cls = request_type(0, 9)
    module = sys.modules[cls.__module__]
    partitions = (
        ()
        if records is None
        else (make_entity(module.PartitionProduceData, index=0, records=records),)
    )
    return make_entity(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(make_entity(module.TopicProduceData, name="t", partition_data=partitions),),
    )


async def test_unserved_apis_get_their_own_errors_and_the_connection_stays_up(server) -> None:
    conn = await connect(server)
    try:
        # Groups are served (leader/groups.py); a transaction coordinator is not.
        find = make_entity(request_type(10, 4), key_type=1, coordinator_keys=("txn",))
        body = await conn.request(find)
        assert [c.error_code for c in body.coordinators] == [ErrorCode.coordinator_not_available]
        configs = make_entity(
            request_type(32, 4), resources=(), include_synonyms=False, include_documentation=False
        )
        assert (await conn.request(configs)).results == ()
        refused = await conn.request(produce_request(acks=1, records=b"x"))
        [[p]] = [t.partition_responses for t in refused.responses]
        assert (
            p.error_code == ErrorCode.topic_authorization_failed and "read-only" in p.error_message
        )
        meta = await conn.request(metadata_request(12, ["t"]))  # still the same connection
        assert meta.topics[0].error_code == ErrorCode.none
    finally:
        await conn.close()


async def test_produce_without_acks_closes_the_connection_as_kafka_does(server) -> None:
    conn = await connect(server)
    try:
        with pytest.raises(KafkaConnectionError):
            await conn.request(produce_request(acks=0, records=None), timeout_s=DEADLINE_S)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    "frame",
    [
        SIZE.pack(2**31 - 1),  # a frame no request is
        SIZE.pack(12) + struct.pack(">hhi", 1, 12, 3) + b"\xff\xff\xff\xff",  # Fetch cut off
        SIZE.pack(8) + struct.pack(">hhi", 1, 2, 3),  # Fetch v2, no body at all
        SIZE.pack(8) + struct.pack(">hhi", 31000, 0, 3),  # an API nobody has
    ],
    ids=["oversized", "bad-body", "no-body", "unknown-api"],
)
async def test_bytes_no_codec_can_answer_close_that_connection_only(server, frame) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame)
    assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # closed, nothing sent
    writer.close()
    conn = await connect(server)  # the server still serves others
    try:
        assert (await conn.request(metadata_request(12, None))).topics
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def sink_connection() -> AsyncIterator[tuple[asyncio.StreamWriter, asyncio.Future[bytes]]]:
    """A connection whose far end collects every byte written until it is closed: the
    writer, and the bytes once the writer closed."""
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.read())
        writer.close()

    sink_server = await asyncio.start_server(sink, "127.0.0.1", 0)
    try:
        port = sink_server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        yield writer, received
    finally:
        sink_server.close()


async def test_a_region_that_shrank_before_it_was_sent_is_padded_to_its_size(
    server, tmp_path
) -> None:
    segment = tmp_path / "gone.log"
    segment.write_bytes(b"R" * 100)
    async with sink_connection() as (writer, received):
        await server._send_region(writer, FileRegion(segment, 40, 300))  # 60 bytes left on disk
        await server._send_region(writer, FileRegion(tmp_path / "missing.log", 0, 20))
        writer.close()
        data = await asyncio.wait_for(received, DEADLINE_S)
    assert len(data) == 320
    assert data[:60] == b"R" * 60
    offset, length = struct.unpack_from(">qi", data, 60)
    assert offset == -1 and length > 240 - 12
    assert struct.unpack_from(">q", data, 300)[0] == -1
    assert server.metrics()["short_regions_total"] == 2


async def test_small_regions_are_read_with_the_response_and_padded_when_they_shrank(
    server, tmp_path
) -> None:
    """Where responses are assembled (a TLS connection's), regions under SMALL_REGION_BYTES
    are read (not sent by sendfile), in order with the bytes around them; one that shrank
    or vanished is padded as _send_region pads it."""
    segment = tmp_path / "small.log"
    segment.write_bytes(bytes(range(100)))
    frame = ResponseFrame(
        (
            b"head",
            FileRegion(segment, 10, 20),
            b"mid",
            FileRegion(segment, 90, 40),  # 10 bytes left on disk
            FileRegion(tmp_path / "missing.log", 0, 30),
            b"tail",
        )
    )
    async with sink_connection() as (writer, received):
        await server._send_assembled(writer, frame.with_size_prefix())
        writer.close()
        data = await asyncio.wait_for(received, DEADLINE_S)
    assert len(data) == 4 + frame.size
    body = data[4:]
    assert body[:4] == b"head" and body[4:24] == bytes(range(10, 30)) and body[24:27] == b"mid"
    assert body[27:37] == bytes(range(90, 100))
    assert struct.unpack_from(">q", body, 37)[0] == -1  # the overflow entry's offset
    assert struct.unpack_from(">q", body, 67)[0] == -1
    assert body[-4:] == b"tail"
    assert server.metrics()["short_regions_total"] == 2
    assert server.metrics()["copied_region_bytes_total"] == 30


@pytest.mark.parametrize("in_cache", [True, False], ids=["cached", "not-cached"])
async def test_a_region_sent_by_sendfile_is_read_into_the_cache_off_the_loop_first(
    server, tmp_path, monkeypatch, in_cache: bool
) -> None:
    """sendfile's kernel read runs on the loop's thread and waits for the disk: where
    responses are assembled (TLS), a region over SMALL_REGION_BYTES whose pages are not all
    cached is read in on a worker thread first (nowait.read_into_cache), then sent by
    loop.sendfile; one all cached is sent at once. Fails on the code before (nothing read
    it in: `read_on` empty when not cached). The plaintext path's own test:
    test_direct_send.py."""
    import replicad.leader.server as server_module

    data = os.urandom(4 * SMALL_REGION_BYTES)
    segment = tmp_path / "big.log"
    segment.write_bytes(data)
    fd = os.open(segment, os.O_RDONLY)
    try:
        if in_cache:
            os.pread(fd, len(data), 0)
            if not all_cached(fd, 0, len(data)):
                pytest.skip("no cachestat here: every large region is read in first")
        else:
            dropped(segment)
            if all_cached(fd, 0, len(data)):
                pytest.skip(f"pages not dropped on {tmp_path} (tmpfs)")
    finally:
        os.close(fd)
    read_on: list[int] = []
    real = server_module.read_into_cache

    def watched(fd: int, position: int, size: int) -> int:
        read_on.append(threading.get_ident())
        return real(fd, position, size)

    monkeypatch.setattr(server_module, "read_into_cache", watched)
    region = FileRegion(segment, 100, 3 * SMALL_REGION_BYTES)
    async with sink_connection() as (writer, received):
        await server._send_assembled(
            writer, ResponseFrame((b"head", region, b"tail")).with_size_prefix()
        )
        writer.close()
        body = (await asyncio.wait_for(received, DEADLINE_S))[4:]
    assert body == b"head" + data[100 : 100 + region.size] + b"tail"
    assert server.metrics()["sendfile_bytes_total"] == region.size
    if in_cache:
        assert read_on == []
    else:
        assert len(read_on) == 1 and read_on[0] != server._loop_thread
    assert server.metrics().get("sendfile_reads_off_loop_total", 0) == len(read_on)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
async def test_a_fetch_goes_by_sendfile_on_plaintext_and_is_assembled_over_tls(
    logs, fill, tmp_path, tls: bool
) -> None:
    """Records over SMALL_REGION_BYTES: a plaintext connection's response goes straight on
    its socket (direct_send.py: sendfile), a TLS connection's is assembled and encrypted;
    both bytes as on disk."""
    batches = [producer_batch(10 * i, [os.urandom(10_000) for _ in range(10)]) for i in range(3)]
    fill(logs, T0, batches, topic_id=TID)
    security, client = None, ConnectionSecurity()
    if tls:
        pki = make_test_pki(tmp_path / "pki")
        options = {
            "serve.security.tls.cert_file": str(pki.broker_cert),
            "serve.security.tls.key_file": str(pki.broker_key),
        }
        security = ServerSecurity.from_config(serve_security_from_options(options), frozenset())
        client = ConnectionSecurity(tls=ssl.create_default_context(cafile=str(pki.ca)))
    srv = LeaderServer(logs, ServeSettings(), security=security, rng=random.Random(4))
    await srv.start()
    try:
        conn = BrokerConnection(
            BrokerAddress(0, "127.0.0.1", srv.port),
            client_id="test",
            connect_timeout_s=DEADLINE_S,
            request_timeout_s=DEADLINE_S,
            security=client,
        )
        await conn.connect()
        try:
            body = await conn.request(fetch())
        finally:
            await conn.close()
    finally:
        await srv.close()
    on_disk = logs.partitions()[T0].active_segment.log_path.read_bytes()
    assert len(on_disk) > SMALL_REGION_BYTES
    assert records_of(body) == on_disk
    direct = srv.metrics().get("direct_sends_total", 0)
    assert direct == (0 if tls else 1) or not direct_send.available()


async def test_a_direct_send_waits_for_what_the_transport_still_holds(server, tmp_path) -> None:
    """A response sent straight on the socket starts once the transport has written what
    it holds (a previous response's tail): the bytes arrive in order. Fails without the
    drain to empty (the transport's bytes came after the response's)."""
    if not direct_send.available():
        pytest.skip("no direct sends here")
    segment = tmp_path / "seg.log"
    data = os.urandom(200_000)
    segment.write_bytes(data)
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
        far, _ = await asyncio.get_running_loop().sock_accept(listener)
    finally:
        listener.close()
    try:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        held = b"P" * (4 << 20)
        writer.write(held)  # nobody reads yet: most of it stays in the transport
        assert writer.transport.get_write_buffer_size() > 0
        frame = ResponseFrame((b"head", FileRegion(segment, 0, len(data)), b"tail"))
        sending = asyncio.create_task(server._send(writer, frame))
        want = len(held) + 4 + frame.size
        got = bytearray()
        far.setblocking(False)
        loop = asyncio.get_running_loop()
        while len(got) < want:
            chunk = await asyncio.wait_for(loop.sock_recv(far, 65536), DEADLINE_S)
            assert chunk, "closed early"
            got += chunk
        await asyncio.wait_for(sending, DEADLINE_S)
    finally:
        writer.close()
        far.close()
    assert bytes(got) == held + SIZE.pack(frame.size) + b"head" + data + b"tail"
    assert server.metrics().get("direct_sends_total", 0) == int(direct_send.available())


@pytest.mark.parametrize("in_cache", [True, False], ids=["cached", "not-cached"])
async def test_small_regions_are_read_on_the_loop_when_cached_else_off_it(
    server, tmp_path, monkeypatch, in_cache: bool
) -> None:
    """A run of small regions the Fetch did not read with its answer (a long-poll answered
    short of min_bytes; more than SMALL_REGION_BYTES in all) on a connection whose responses
    are assembled (TLS) is assembled on the loop when all its bytes are cached, else on a
    worker thread. Fails on the code before when cached (the run was always assembled on a
    worker thread)."""
    import replicad.leader.server as server_module

    data = os.urandom(3 * 4096)
    segment = tmp_path / "small.log"
    segment.write_bytes(data)
    if in_cache:
        cached(segment)
    else:
        dropped(segment)
    assembled_on: list[int] = []
    real = server_module.assemble

    def watched(parts: Any) -> Any:
        assembled_on.append(threading.get_ident())
        return real(parts)

    monkeypatch.setattr(server_module, "assemble", watched)
    frame = ResponseFrame((b"head", FileRegion(segment, 10, 5000), FileRegion(segment, 6000, 10)))
    async with sink_connection() as (writer, received):
        await server._send_assembled(writer, frame.with_size_prefix())
        writer.close()
        body = (await asyncio.wait_for(received, DEADLINE_S))[4:]
    assert body == b"head" + data[10:5010] + data[6000:6010]
    on_loop = [t == server._loop_thread for t in assembled_on]
    assert on_loop == ([True] if in_cache else [True, False])
    assert server.metrics().get("send_reads_off_loop_total", 0) == (0 if in_cache else 1)


async def test_a_connection_reset_before_its_transport_is_made_frees_its_slot_quietly(
    server: LeaderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admitted connection whose client resets before asyncio makes its transport: the
    connection's task ends without an exception (none left for asyncio to log with a
    traceback) and its slot, overall and for its address, is free again."""
    loop = asyncio.get_running_loop()

    async def reset(*_args: Any, **_kwargs: Any) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(loop, "connect_accepted_socket", reset)
    ours, theirs = socket.socketpair()
    with theirs:
        server._connected(ours, ("127.0.0.1", 1))
        (task,) = server._connections
        await task
    assert task.exception() is None
    assert not server._connections and not server._per_ip
    assert ours.fileno() == -1  # closed


async def test_a_cancelled_callback_is_not_logged_as_an_error(server: LeaderServer) -> None:
    """A connection cancelled while its transport closes (serve stopping under load) reaches
    the loop's exception handler as a CancelledError: not passed on to asyncio's default
    handler, which would log an error with a traceback. Other failures still are."""
    loop = asyncio.get_running_loop()
    seen: list[dict] = []
    server._previous_exception_handler = lambda _loop, context: seen.append(context)
    server._loop_exception(
        loop, {"message": "Exception in callback", "exception": asyncio.CancelledError()}
    )
    assert seen == []
    failure = {"message": "Exception in callback", "exception": RuntimeError("boom")}
    server._loop_exception(loop, failure)
    assert seen == [failure]


# -- the consumer group protocol (KIP-848) ---------------------------------------------------


@pytest.mark.parametrize("on", [False, True])
async def test_apiversions_names_the_consumer_group_apis_only_when_they_are_on(
    logs, fill, on
) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    srv = LeaderServer(logs, ServeSettings(), rng=random.Random(4), consumer_group_protocol=on)
    await srv.start()
    try:
        conn = await connect(srv)
        try:
            body = await conn.request(
                ApiVersionsRequest(client_software_name="t", client_software_version="1")
            )
        finally:
            await conn.close()
    finally:
        await srv.close()
    served = {int(k.api_key) for k in body.api_keys}
    assert ({68, 69} <= served) is on
    assert not ({68, 69} & served) or on


async def test_a_consumer_group_heartbeat_joins_and_is_assigned_by_topic_id(logs, fill) -> None:
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest

    fill(logs, T0, [producer_batch(0, [b"v"])], topic_id=TID)
    srv = LeaderServer(logs, ServeSettings(), rng=random.Random(4), consumer_group_protocol=True)
    await srv.start()
    try:
        conn = await connect(srv)
        try:
            joined = await conn.request(
                make_entity(
                    ConsumerGroupHeartbeatRequest,
                    group_id="g",
                    member_id="m-1",
                    member_epoch=0,
                    rebalance_timeout=datetime.timedelta(seconds=30),
                    subscribed_topic_names=("t",),
                    topic_partitions=(),
                )
            )
        finally:
            await conn.close()
    finally:
        await srv.close()
    assert (joined.error_code, joined.member_id, joined.member_epoch) == (ErrorCode.none, "m-1", 1)
    [assigned] = joined.assignment.topic_partitions
    assert (assigned.topic_id, tuple(assigned.partitions)) == (TID, (0,))


def _add_reader_as_in_python_3_11_2(
    self: asyncio.selector_events._SelectorTransport, fd: int, callback: Any, *args: Any
) -> None:
    """Python 3.11.2's transport: adds its reader even while paused (later 3.11s check
    is_reading() first). Debian 12's python3 is 3.11.2."""
    if self._closing:
        return
    self._loop._add_reader(fd, callback, *args)


async def test_a_tls_client_is_served_where_the_transport_reads_before_tls_starts(
    logs, fill, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TLS listener pauses each connection until its TLS starts, so the ClientHello
    reaches TLS. On Python 3.11.2 the transport started reading anyway right after that
    pause: the ClientHello went to the plaintext stream and every handshake timed out
    (serve over TLS or SASL_SSL never worked there)."""
    monkeypatch.setattr(
        asyncio.selector_events._SelectorTransport, "_add_reader", _add_reader_as_in_python_3_11_2
    )
    fill(logs, T0, [producer_batch(0, [b"v"])], topic_id=TID)
    pki = make_test_pki(tmp_path / "pki")
    options = {
        "serve.security.tls.cert_file": str(pki.broker_cert),
        "serve.security.tls.key_file": str(pki.broker_key),
    }
    security = ServerSecurity.from_config(serve_security_from_options(options), frozenset())
    srv = LeaderServer(logs, ServeSettings(), security=security, rng=random.Random(4))
    await srv.start()
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        _, writer = await asyncio.open_connection(
            "127.0.0.1",
            srv.port,
            ssl=context,
            server_hostname="localhost",
            ssl_handshake_timeout=DEADLINE_S,
        )
        assert writer.get_extra_info("ssl_object").version() is not None
        writer.close()
        await writer.wait_closed()
        assert srv.metrics().get("tls_handshake_failures_total", 0) == 0
    finally:
        await srv.close()
