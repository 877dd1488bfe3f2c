"""direct_send.py: a response's bytes and file regions written straight on a plaintext
socket, in order, through full sockets, slow readers, clients that leave, files that shrank,
and pages not in the page cache."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.clock import wall_ms
from replicad.leader import direct_send
from replicad.log import nowait
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.segment import FileRegion
from replicad.records.batch import scan_batches
from replicad.records.downconvert import LazyDownConversion
from replicad.types import TopicPartition
from tests.page_cache import cached, dropped
from tools.logdata.batches import producer_batch
from tools.peers.kcat import run_kcat
from tools.peers.pki import make_test_pki
from tools.wait import DEADLINE_S

pytestmark = pytest.mark.skipif(not direct_send.available(), reason="no cachestat or sendfile")

MIB = 1 << 20


@contextlib.asynccontextmanager
async def connection(
    *, server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[asyncio.StreamWriter, asyncio.StreamReader]]:
    """A connection's two ends: the server side's writer (what direct_send writes on) and
    the client side's reader."""
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)
        await done.wait()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ssl)
    port = server.sockets[0].getsockname()[1]
    reader, client = await asyncio.open_connection(
        "127.0.0.1",
        port,
        ssl=client_ssl,
        server_hostname="localhost" if client_ssl is not None else None,
    )
    try:
        yield await asyncio.wait_for(accepted, DEADLINE_S), reader
    finally:
        done.set()
        client.close()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


def segment(tmp_path: Path, name: str, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def open_descriptors() -> set[tuple[str, str]]:
    """This process's descriptors and what each is open on."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed by now
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


async def test_bytes_and_regions_go_out_in_order_and_a_short_region_is_padded(
    tmp_path: Path,
) -> None:
    """Small and large regions sent from their files between the response's bytes; one
    whose file shrank and one whose file is gone are padded with an overflow entry to the
    size announced (the client drops it)."""
    small, small_data = segment(tmp_path, "small.log", 5000)
    large, large_data = segment(tmp_path, "large.log", 3 * MIB)
    parts = (
        b"head",
        FileRegion(small, 10, 200),
        b"mid",
        FileRegion(large, 100, 3 * MIB - 100),
        FileRegion(small, 4990, 40),  # 10 bytes left on disk
        FileRegion(tmp_path / "missing.log", 0, 30),
        b"tail",
    )
    counters: Counter[str] = Counter()
    async with connection() as (writer, reader):
        expected = 4 + 200 + 3 + (3 * MIB - 100) + 40 + 30 + 4
        sending = asyncio.create_task(direct_send.send(writer.transport, parts, counters))
        body = await asyncio.wait_for(reader.readexactly(expected), DEADLINE_S)
        await sending
    at = 0
    for piece in (b"head", small_data[10:210], b"mid", large_data[100:], small_data[4990:]):
        assert body[at : at + len(piece)] == piece
        at += len(piece)
    assert struct.unpack_from(">q", body, at)[0] == -1  # the overflow entry's offset
    assert struct.unpack_from(">q", body, at + 30)[0] == -1
    assert body[-4:] == b"tail"
    # The small region cached is copied into the write; the large one and the shrunk one
    # (a short read would wait: sent, then padded) go by sendfile.
    assert counters["copied_region_bytes_total"] == 200
    assert counters["sendfile_bytes_total"] == 3 * MIB - 100 + 10
    assert (counters["short_regions_total"], counters["direct_sends_total"]) == (2, 1)


async def test_a_client_reading_slowly_gets_every_byte_through_a_full_socket(
    tmp_path: Path,
) -> None:
    """Small socket buffers and a client that reads a little at a time (on the same loop:
    a send that held the loop would never end): the writes stop part way (EAGAIN), wait
    for room on the loop, and go on where they stopped."""
    path, data = segment(tmp_path, "big.log", 4 * MIB)
    parts = (
        b"h" * 3000,
        FileRegion(path, 0, 2 * MIB),
        b"m" * 70_000,
        FileRegion(path, 2 * MIB, 2 * MIB),
    )
    counters: Counter[str] = Counter()
    async with connection() as (writer, reader):
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        client = reader._transport.get_extra_info("socket")  # type: ignore[attr-defined]
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sending = asyncio.create_task(direct_send.send(writer.transport, parts, counters))
        got = bytearray()
        while len(got) < 3000 + 4 * MIB + 70_000:
            got += await asyncio.wait_for(reader.read(8192), DEADLINE_S)
            await asyncio.sleep(0)
        await asyncio.wait_for(sending, DEADLINE_S)
    assert bytes(got) == b"h" * 3000 + data[: 2 * MIB] + b"m" * 70_000 + data[2 * MIB :]
    assert counters["send_waits_total"] > 0


async def test_a_client_gone_mid_response_ends_the_send_and_leaves_no_descriptor(
    tmp_path: Path,
) -> None:
    """The client reads a little and resets: the send fails as a ConnectionError (the
    connection's end, as any write's), and the duplicated socket and the segment's
    descriptor are closed."""
    path, _ = segment(tmp_path, "big.log", 8 * MIB)
    counters: Counter[str] = Counter()
    async with connection() as (writer, reader):
        before = open_descriptors()
        sending = asyncio.create_task(
            direct_send.send(writer.transport, (b"head", FileRegion(path, 0, 8 * MIB)), counters)
        )
        await asyncio.wait_for(reader.readexactly(1000), DEADLINE_S)
        client = reader._transport.get_extra_info("socket")  # type: ignore[attr-defined]
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reader._transport.abort()  # type: ignore[attr-defined]
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(sending, DEADLINE_S)
        assert open_descriptors() - before == set()


@pytest.mark.parametrize("size", [100_000, 3000], ids=["large", "small"])
@pytest.mark.parametrize("in_cache", [True, False], ids=["cached", "not-cached"])
async def test_a_region_not_in_the_page_cache_is_read_in_on_a_worker_thread_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_cache: bool, size: int
) -> None:
    """sendfile's read of the file waits on the disk on the loop's thread: a region whose
    pages are not all cached is read in on a worker thread first; one all cached is sent
    at once (a small one copied into the write, a large one by sendfile)."""
    path, data = segment(tmp_path, "seg.log", 256 * 1024)
    if in_cache:
        cached(path)
    else:
        dropped(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            if nowait.all_cached(fd, 0, len(data)):
                pytest.skip(f"pages not dropped on {tmp_path} (tmpfs)")
        finally:
            os.close(fd)
    read_on: list[int] = []
    real = nowait.read_into_cache

    def watched(fd: int, position: int, size: int) -> int:
        read_on.append(threading.get_ident())
        return real(fd, position, size)

    monkeypatch.setattr(nowait, "read_into_cache", watched)
    counters: Counter[str] = Counter()
    async with connection() as (writer, reader):
        sending = asyncio.create_task(
            direct_send.send(writer.transport, (FileRegion(path, 7, size),), counters)
        )
        body = await asyncio.wait_for(reader.readexactly(size), DEADLINE_S)
        await sending
    assert body == data[7 : 7 + size]
    if in_cache:
        assert read_on == []
    elif size > direct_send.COPY_REGION_BYTES:
        assert len(read_on) == 1 and read_on[0] != threading.get_ident()
    else:
        # The copy's read without waiting failed, which starts the kernel's read-ahead: by
        # the cachestat that follows the pages may be in, and the region goes at once.
        assert len(read_on) <= 1 and threading.get_ident() not in read_on
    assert counters["sendfile_reads_off_loop_total"] == len(read_on)
    copied = in_cache and size <= direct_send.COPY_REGION_BYTES
    assert counters["copied_region_bytes_total"] == (size if copied else 0)


async def test_only_a_plaintext_response_with_regions_is_sent_here(tmp_path: Path) -> None:
    """TLS encrypts in the process (server.py assembles its responses); a response of bytes
    alone is one write already; a down-conversion is converted while it is sent."""
    pki = make_test_pki(tmp_path / "pki")
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ssl.load_cert_chain(pki.broker_cert, pki.broker_key)
    client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    region = FileRegion(tmp_path / "seg.log", 0, 10)
    conversion = object.__new__(LazyDownConversion)
    async with connection() as (writer, _):
        assert direct_send.takes(writer.transport, (b"x", region))
        assert not direct_send.takes(writer.transport, (b"x", b"y"))
        assert not direct_send.takes(writer.transport, (b"x", region, conversion))
    async with connection(server_ssl=server_ssl, client_ssl=client_ssl) as (writer, _):
        assert not direct_send.takes(writer.transport, (b"x", region))


# -- real clients reading responses of megabytes sent straight -------------------------------

TOPIC = "direct"
PARTITIONS = 3
BATCHES = 40
PER_BATCH = 50
VALUE_BYTES = 2000  # 100 KB a batch, 4 MB a partition: responses of megabytes

Row = tuple[int, int, bytes]


def value(partition: int, offset: int) -> bytes:
    return f"p{partition}-o{offset}-".encode().ljust(VALUE_BYTES, b"v")


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Row]]:
    """PARTITIONS partitions of real producer batches; the rows a consumer must read."""
    data_dir = tmp_path_factory.mktemp("direct") / "data"
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())
    rows: list[Row] = []
    try:
        ends = {}
        for p in range(PARTITIONS):
            tp = TopicPartition(TOPIC, p)
            plog = logs.get_or_create(tp)
            for b in range(BATCHES):
                first = b * PER_BATCH
                data = producer_batch(first, [value(p, first + i) for i in range(PER_BATCH)])
                plog.append(data, scan_batches(data).batches, now_ms=wall_ms())
            ends[tp] = plog.log_end_offset
            rows += [(p, o, value(p, o)) for o in range(BATCHES * PER_BATCH)]
        logs.checkpoint(ends)
    finally:
        logs.close()
    return data_dir, sorted(rows)


@pytest.fixture
def served(replica, serve_in_thread) -> Iterator[Any]:
    logs = LogManager.open(replica[0], LogConfig(), now_ms=wall_ms())
    try:
        yield serve_in_thread(logs)
    finally:
        logs.close()


def sent_straight(served: Any) -> None:
    metrics = served.call(served.server.metrics)
    assert metrics.get("direct_sends_total", 0) > 0, metrics


def test_kcat_reads_every_record_sent_straight(served, replica) -> None:
    result = run_kcat(
        "-b", served.bootstrap, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q",
        "-X", "fetch.message.max.bytes=4194304",
        "-f", "%p %o %s\\n",
    )  # fmt: skip
    got = sorted(
        (int(p), int(o), v.encode())
        for p, o, v in (line.split(" ") for line in result.stdout.decode().splitlines())
    )
    assert got == replica[1]
    sent_straight(served)


def test_librdkafka_reads_every_record_sent_straight(served, replica) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as KTP

    errors: list[Any] = []
    consumer = Consumer(
        {
            "bootstrap.servers": served.bootstrap,
            "group.id": "direct-readers",
            "enable.auto.commit": False,
            "fetch.max.bytes": 16 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            "log_level": 3,
            "error_cb": errors.append,
        }
    )
    got: list[Row] = []
    want = len(replica[1])
    try:
        consumer.assign([KTP(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < want and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.value()))
    finally:
        consumer.close()
    assert sorted(got) == replica[1], errors
    sent_straight(served)


def test_kafka_python_reads_every_record_sent_straight(served, replica) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=served.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=16 << 20,
    )
    consumer.assign([KTP(TOPIC, p) for p in range(PARTITIONS)])
    got: list[Row] = []
    want = len(replica[1])
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < want and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                got += [(tp.partition, m.offset, m.value) for m in messages]
    finally:
        consumer.close()
    assert sorted(got) == replica[1]
    sent_straight(served)
