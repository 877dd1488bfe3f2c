from __future__ import annotations

import asyncio
import datetime
import io
import random
import struct
import tracemalloc

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader
from kio.serial import entity_writer

from replicad.follower.memory_pool import PAGE, Lease, MemoryPool, size_class
from replicad.protocol.connection import BrokerAddress, BrokerConnection, HeldResponse
from tools.wait import DEADLINE_S, until


async def test_waiters_are_served_in_order_and_never_beyond_capacity():
    pool = MemoryPool(100)
    first = await pool.reserve(70)
    order: list[str] = []

    async def want(name: str, size: int) -> None:
        release = await pool.reserve(size)
        order.append(name)
        await asyncio.sleep(0)  # held across a turn of the loop
        release()

    tasks = [asyncio.create_task(want("a", 50)), asyncio.create_task(want("b", 10))]
    await until(lambda: pool.snapshot()["waiting"] == 2, what="both to wait")
    # "b" would fit now, but "a" came first: no overtaking, no starvation of big asks.
    assert order == [] and pool.snapshot()["waiting"] == 2
    first()
    await asyncio.gather(*tasks)
    assert order == ["a", "b"]
    assert pool.account.used == 0 and pool.peak <= 100


async def test_cancelled_waiter_leaves_no_trace():
    pool = MemoryPool(10)
    held = await pool.reserve(10)
    waiter = asyncio.create_task(pool.reserve(5))
    await until(lambda: pool.snapshot()["waiting"] == 1, what="the waiter to wait")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held()
    assert pool.account.used == 0
    release = await pool.reserve(10)  # the whole pool is free again
    release()
    release()  # a second release is a no-op
    assert pool.account.used == 0


async def test_a_waiter_cancelled_as_it_is_granted_passes_its_turn_on():
    pool = MemoryPool(2 * PAGE)
    held = await pool.reserve(2 * PAGE)
    gone = asyncio.create_task(pool.reserve(2 * PAGE))
    nxt = asyncio.create_task(pool.reserve(2 * PAGE))
    await until(lambda: pool.snapshot()["waiting"] == 2, what="both to wait")
    gone.cancel()  # its future is cancelled now; its task learns it on the next turn
    held()  # grants `gone` first: nothing is lent to it, so `nxt` gets the buffer
    with pytest.raises(asyncio.CancelledError):
        await gone
    lease = await asyncio.wait_for(nxt, DEADLINE_S)
    assert pool.snapshot()["used"] == 2 * PAGE and pool.snapshot()["waiting"] == 0
    lease()


async def test_random_concurrent_load_never_exceeds_the_bound():
    rng = random.Random(81)
    pool = MemoryPool(1_000)

    async def client(n: int) -> None:
        for _ in range(30):
            release = await pool.reserve(rng.randint(1, 400))
            assert pool.account.used <= 1_000
            for _ in range(rng.randint(0, 3)):  # held for a few turns: a seeded interleaving
                await asyncio.sleep(0)
            release()

    await asyncio.gather(*(client(i) for i in range(12)))
    snap = pool.snapshot()
    assert snap["peak"] <= 1_000 and snap["used"] == 0
    assert snap["waits"] > 0  # the load really contended


async def test_buffers_are_lent_again_not_allocated_per_frame():
    pool = MemoryPool(1 << 20)
    first = await pool.reserve(100_000)
    assert len(first.buffer) == 100_000
    first.buffer[:3] = b"abc"
    block = first.buffer.obj
    first()
    again = await pool.reserve(99_000)  # same size class: the same buffer
    assert again.buffer.obj is block and len(again.buffer) == 99_000
    snap = pool.snapshot()
    assert snap["reused"] == 1 and snap["used"] == size_class(100_000, 1 << 20)
    again()
    small = await pool.reserve(1_000)  # far smaller: not given the large buffer
    assert small.buffer.obj is not block
    small()


async def test_idle_buffers_count_and_are_freed_before_anyone_waits():
    pool = MemoryPool(256 * 1024)
    a = await pool.reserve(120_000)
    b = await pool.reserve(120_000)
    a()
    b()
    snap = pool.snapshot()
    assert snap["used"] == 0 and snap["idle"] == 2 * size_class(120_000, 256 * 1024)
    # Larger than either idle buffer may serve: they are freed to make room, no wait.
    c = await pool.reserve(250_000)
    snap = pool.snapshot()
    assert snap["waits"] == 0 and snap["idle"] == 0 and snap["used"] <= 256 * 1024
    assert snap["peak"] <= 256 * 1024
    c()


async def test_a_trim_frees_the_idle_buffers_beyond_what_was_lent_since_the_last_one():
    """Issue 32: a 10,000-partition catch-up left the whole pool idle (32 MiB) once caught
    up. A trim keeps what the interval lent at most; a busy interval keeps its buffers."""
    capacity = 1 << 20
    pool = MemoryPool(capacity)
    big = [await pool.reserve(300_000) for _ in range(3)]
    for lease in big:
        lease()
    assert pool.trim() == 0  # the interval lent all three at once: they are kept
    assert pool.idle == 3 * size_class(300_000, capacity)
    # Caught up: small responses, one at a time. The large buffers are not lent for them.
    for _ in range(5):
        small = await pool.reserve(2_000)
        small()
    freed = pool.trim()
    assert freed == 3 * size_class(300_000, capacity)
    assert pool.idle == size_class(2_000, capacity)  # the one small buffer still in use
    # A lease held across the trim counts as lent: nothing of its size is kept idle beside it.
    held = await pool.reserve(2_000)
    assert pool.trim() == 0 and pool.idle == 0
    held()
    assert pool.trim() == 0 and pool.idle == size_class(2_000, capacity)
    assert pool.snapshot()["used"] == 0


async def test_a_buffer_given_back_is_freed_before_the_one_lent_in_its_place_is_made():
    # The bytes the process really holds, not the pool's count of them: a given-back buffer
    # the next waiter cannot reuse must be gone before that waiter's buffer is allocated
    # (issue 32: a reference left in the release's frames held both, 30 + 12 MiB here).
    mib = 1 << 20
    tracemalloc.start()
    try:
        pool = MemoryPool(32 * mib)
        held = await pool.reserve(30 * mib)
        waiter = asyncio.ensure_future(pool.reserve(12 * mib))  # far smaller: a new buffer
        await until(lambda: pool.snapshot()["waiting"] == 1, what="the waiter to wait")
        tracemalloc.reset_peak()
        held()  # grants the waiter at once, inside this call
        peak = tracemalloc.get_traced_memory()[1]
        lent = await waiter
        assert len(lent.buffer) == 12 * mib and pool.snapshot()["idle"] == 0
        assert peak <= 32 * mib, f"{peak / mib:.1f} MiB held at once by a 32 MiB pool"
        lent()
    finally:
        tracemalloc.stop()


def test_size_classes_round_up_by_at_most_an_eighth_and_stay_within_capacity():
    for size in (1, 4096, 4097, 65_537, 1_000_000, 33_554_432):
        got = size_class(size, 1 << 30)
        assert 0 <= got - size <= max(size // 8, 4095) and got % 4096 == 0
    assert size_class(1_000_000, 1_000_001) == 1_000_001


def api_versions_frame(correlation: bytes, padding_keys: int) -> bytes:
    """A real ApiVersions v3 response (size prefix included), padded with extra keys."""
    keys = [(1, 4, 17), (2, 1, 9), (3, 4, 12), (18, 0, 3)]
    keys += [(1000 + i, 0, 0) for i in range(padding_keys)]
    buf = io.BytesIO()
    entity_writer(ResponseHeader)(
        buf, ResponseHeader(correlation_id=struct.unpack(">i", correlation)[0])
    )
    entity_writer(ApiVersionsResponse)(
        buf,
        ApiVersionsResponse(
            error_code=ErrorCode.none,
            api_keys=tuple(
                ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys
            ),
            throttle_time=datetime.timedelta(0),
        ),
    )
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


async def _leader_answering(responses: int, padding_keys: int):
    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(responses):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            correlation = (await reader.readexactly(size))[4:8]
            writer.write(api_versions_frame(correlation, padding_keys))
            await writer.drain()
        await reader.read()

    server = await asyncio.start_server(leader, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _conn(port: int, pool: MemoryPool) -> BrokerConnection:
    return BrokerConnection(
        BrokerAddress(1, "127.0.0.1", port),
        client_id="t",
        connect_timeout_s=5,
        request_timeout_s=5,
        reserve=pool.reserve,
    )


async def test_a_full_pool_stops_reading_the_socket():
    """Backpressure end to end: the second response's body is not read (its request
    does not complete) until the first response's memory is released."""
    size = len(api_versions_frame(b"\0\0\0\0", 150)) - 4
    server, port = await _leader_answering(3, 150)
    pool = MemoryPool(size + size // 2)  # room for one response, not two
    conn = _conn(port, pool)
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    async with server:
        await conn.connect()  # the negotiation's response is released at once
        assert pool.account.used == 0
        first = await conn.request(request, hold=True)
        # The pool counts the buffer it lent: the frame in whole pages, within the bound.
        assert isinstance(first, HeldResponse)
        assert size <= pool.account.used <= pool.account.capacity
        held = pool.account.used
        second = asyncio.create_task(conn.request(request, hold=True))
        await until(lambda: pool.snapshot()["waiting"] == 1, what="the second to wait for room")
        assert not second.done() and pool.account.used == held
        first.release()
        got = await asyncio.wait_for(second, DEADLINE_S)
        assert pool.peak <= pool.account.capacity
        got.release()
        await conn.close()
    assert pool.account.used == 0


async def test_a_response_larger_than_the_pool_is_read_alone_once_the_pool_is_empty():
    """The oversize rule (replicad/pool/rules.py): the response is not refused; it waits
    until nothing else is lent, then is read alone, and nothing else is lent beside it."""
    size = len(api_versions_frame(b"\0\0\0\0", 3000)) - 4
    server, port = await _leader_answering(2, 3000)
    pool = MemoryPool(4 * PAGE)
    assert size > 4 * PAGE
    conn = _conn(port, pool)
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    async with server:
        held = await pool.reserve(PAGE)  # another leader's response, still being appended
        connecting = asyncio.create_task(conn.connect())
        await until(lambda: pool.snapshot()["waiting"] == 1, what="the large one to wait")
        later = asyncio.create_task(pool.reserve(100))  # fits, but comes after it
        await until(lambda: pool.snapshot()["waiting"] == 2, what="the small one to queue")
        held()
        await asyncio.wait_for(connecting, DEADLINE_S)  # negotiated: read and released
        await asyncio.wait_for(later, DEADLINE_S)
        later.result()()
        big = await conn.request(request, hold=True)
        assert isinstance(big, HeldResponse)
        snap = pool.snapshot()
        assert snap["used"] == size and snap["idle"] == 0 and snap["oversize"] == 2
        small = asyncio.create_task(pool.reserve(10))
        await until(lambda: pool.snapshot()["waiting"] == 1, what="nothing lent beside it")
        big.release()
        (await asyncio.wait_for(small, DEADLINE_S))()
        await conn.close()
    snap = pool.snapshot()
    assert snap["used"] == 0 and snap["idle"] <= 4 * PAGE and snap["peak"] == size


async def test_a_released_response_holds_no_view_of_a_buffer_the_pool_frees():
    """A held response read in place (views of its pool buffer, as the follower's Fetch
    scanner makes them), released the way the fetcher releases it -- its own references
    dropped first, in the step its await resumed -- while another response waits for the
    buffer to be freed for a larger one: the buffer is freed, not kept alive beside its
    replacement (`freed_in_use` stays 0). The loop's handle that resumed this task still
    holds the response's task, whose result is the held response, during that step: 77 MiB
    were counted at 10,000 partitions while a released response kept its body (issue 32)."""
    size = len(api_versions_frame(b"\0\0\0\0", 150)) - 4
    server, port = await _leader_answering(2, 150)
    pool = MemoryPool(2 * size_class(size, 1 << 30))
    conn = _conn(port, pool)
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    larger: list[asyncio.Future[Lease]] = []

    def read_in_place(frame: memoryview) -> list[memoryview]:
        # Meanwhile another leader's response asks for more than the room this one leaves.
        larger.append(asyncio.ensure_future(pool.reserve(pool.account.capacity)))
        return [frame[8:], frame[:4]]

    async with server:
        await conn.connect()
        response = conn.send(request, hold=True, decode=read_in_place)
        held = await response
        del response  # as the fetcher drops its request in flight
        assert isinstance(held, HeldResponse) and pool.snapshot()["waiting"] == 1
        release = held.release
        del held
        release()  # the waiter is lent its buffer at once: the idle one is freed for it
        assert pool.snapshot()["freed_in_use"] == 0
        (await asyncio.wait_for(larger[0], DEADLINE_S))()
        await conn.close()
    assert pool.account.used == 0


def test_pool_bound_holds_while_replicating_from_kafka(kafka_broker, unique_topic, tmp_path):

    from tools.peers.produce import CheckedProducer
    from tools.replica import batches_from, replicad_run, segment_bytes

    topic = unique_topic()
    kafka_broker.create_topic(topic, 8)
    producer = CheckedProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5, "batch.size": 16384}
    )
    value = bytes(range(256)) * 4
    for i in range(6_000):
        producer.produce(topic, value=value, partition=i % 8)
    assert producer.flush(30) == 0
    capacity = 256 * 1024
    config = {
        "fetch": {
            "buffer_memory": capacity,
            "response_max_bytes": 131072,
            "partition_max_bytes": 32768,
        }
    }
    data_dir = tmp_path / "data"
    with replicad_run(
        kafka_broker.bootstrap, topic, data_dir, config=config, control_socket=tmp_path / "c.sock"
    ) as proc:
        proc.wait_caught_up(6_000)
        snap = proc.status()
        assert snap is not None
        pool = snap["memory_pool"]
    assert pool["capacity"] == capacity
    assert 0 < pool["peak"] <= capacity
    assert pool["reservations"] > 40  # ~6 MB through a 256 KiB pool, many responses
    assert pool["used"] == 0 or pool["used"] <= capacity
    for p in range(8):
        ours = segment_bytes(data_dir / f"{topic}-{p}")
        assert ours == batches_from(segment_bytes(kafka_broker.partition_dir(topic, p)))


def test_a_batch_larger_than_the_pool_is_replicated_alone_and_said(
    kafka_broker, unique_topic, tmp_path
):
    """A ~400 KB batch through a 128 KiB pool: replicated (it used to stop that leader
    until buffer_memory was raised), with a warning that names the fix."""
    from tools.peers.produce import CheckedProducer
    from tools.replica import batches_from, replicad_run, segment_bytes

    topic = unique_topic()
    kafka_broker.create_topic(topic, 1)
    producer = CheckedProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 50, "batch.size": 1 << 20}
    )
    for _ in range(400):  # one ~400 KB batch
        producer.produce(topic, value=b"z" * 1000, partition=0)
    assert producer.flush(30) == 0
    config = {"fetch": {"buffer_memory": 131072, "response_max_bytes": 65536}}
    data_dir = tmp_path / "data"
    with replicad_run(
        kafka_broker.bootstrap, topic, data_dir, config=config, control_socket=tmp_path / "c.sock"
    ) as proc:
        proc.wait_caught_up(400)
        snap = proc.status()
        assert snap is not None
        pool = snap["memory_pool"]
        assert "larger than fetch.buffer_memory is read alone" in proc.output()
    assert pool["oversize"] >= 1 and pool["peak"] > 131072
    ours = segment_bytes(data_dir / f"{topic}-0")
    assert ours == batches_from(segment_bytes(kafka_broker.partition_dir(topic, 0)))


async def test_grants_of_one_give_back_never_charge_an_idle_buffer_beyond_the_room() -> None:
    """Two waiters granted by one give-back are both charged before either is lent: the
    idle buffer charged to the first must not be charged to the second past the room left
    (found by tools/sim's memory pool: 8 KiB charged for 100 bytes with 4 KiB left)."""
    pool = MemoryPool(3 * PAGE)
    first = await pool.reserve(2 * PAGE)
    second = asyncio.ensure_future(pool.reserve(2 * PAGE))
    third = asyncio.ensure_future(pool.reserve(100))
    await asyncio.sleep(0)
    assert not second.done() and not third.done()
    first.release()
    leases = [await second, await third]
    assert pool.account.used + pool.idle <= 3 * PAGE
    assert sorted(len(lease.buffer.obj) for lease in leases) == [PAGE, 2 * PAGE]
    for lease in leases:
        lease.release()


async def test_an_idle_buffer_freed_while_a_view_still_holds_it_is_counted():
    """A view kept past a lease's release keeps its buffer alive when the pool frees it
    for a larger one: nothing is freed, the new buffer is memory over the bound. The pool
    counts those bytes (`freed_in_use`); a buffer nobody holds is not counted."""
    pool = MemoryPool(256 * 1024)
    a = await pool.reserve(100_000)
    a()
    c = await pool.reserve(250_000)  # frees the idle one: nobody held it
    assert pool.snapshot()["freed_in_use"] == 0
    c()
    b = await pool.reserve(100_000)
    kept = b.buffer[:10]  # a view that outlives the release
    b()
    d = await pool.reserve(250_000)
    assert pool.snapshot()["freed_in_use"] == size_class(100_000, 256 * 1024)
    del kept
    d()
