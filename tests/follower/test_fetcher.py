"""The fetch loop in process, against a scripted leader: the pipelined request (sent
before the previous response is written) and what happens when that write fails; how a
request that ended without an answer is told to the table (R14)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

from replicad.errors import LogError
from replicad.follower.fetch_settings import (
    FetchSettings,
)
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.log import partition as partition_module
from replicad.log.partition import PartitionLog
from replicad.protocol.metadata import TopicSelection
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.produce import CheckedProducer, produce_numbered
from tools.peers.scripted_leader import ScriptedLeader
from tools.replica import end_offsets, segment_bytes
from tools.wait import until

TOPIC = "pipelined"
BATCHES = 40
PER_BATCH = 10


def _batches() -> list[bytes]:
    return [
        producer_batch(
            PER_BATCH * i, [b"v-%d" % (PER_BATCH * i + j) for j in range(PER_BATCH)], leader_epoch=1
        )
        for i in range(BATCHES)
    ]


def _replicator(bootstrap: str, data_dir: Path, topic: str, fetch: FetchSettings) -> Replicator:
    """A replicator of `topic` alone from `bootstrap`."""
    return Replicator(
        ReplicatorSettings(
            bootstrap_servers=(bootstrap,),
            data_dir=data_dir,
            selection=TopicSelection(include=(topic,)),
            fetch=fetch,
        )
    )


async def _replicate_all(replicator: Replicator, data_dir: Path, leader: ScriptedLeader) -> None:
    """Runs `replicator` until TOPIC's partition holds every batch, with no failed turn of
    the fetch loop; then stops it and the leader."""
    stop = asyncio.Event()
    task = asyncio.create_task(replicator.run(stop))
    try:
        await until(
            lambda: end_offsets(data_dir).get(TopicPartition(TOPIC, 0)) == BATCHES * PER_BATCH,
            what="every batch replicated",
        )
        fetcher = next(iter(replicator.fetchers.values()))
        assert fetcher.stats.loop_errors == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await leader.close()


async def test_a_failed_append_after_the_next_request_went_out_leaves_no_gap(tmp_path, monkeypatch):
    """Small fetches (one batch each), so every response is followed by a pipelined
    request; three appends fail. The replica must still be the leader's log, byte for
    byte: the data answering a request sent past a failed append is dropped, not
    appended after a hole."""
    batches = _batches()
    leader = ScriptedLeader(TOPIC)
    leader.set_log(batches, leader_epoch=1)
    port = await leader.start()
    appends = 0
    failed_with_next_request_out = 0
    real_append = PartitionLog.append

    def flaky_append(self, data, headers, *, now_ms):
        nonlocal appends, failed_with_next_request_out
        appends += 1
        if appends in (3, 4, 9):
            fetcher = next(iter(replicator.fetchers.values()))
            failed_with_next_request_out += fetcher._in_flight is not None
            raise LogError("injected append failure")
        return real_append(self, data, headers, now_ms=now_ms)

    monkeypatch.setattr(PartitionLog, "append", flaky_append)
    data_dir = tmp_path / "data"
    replicator = _replicator(
        f"127.0.0.1:{port}",
        data_dir,
        TOPIC,
        FetchSettings(partition_max_bytes=1, backoff_ms=20, wait_max_ms=50),
    )
    await _replicate_all(replicator, data_dir, leader)
    assert appends >= BATCHES + 3
    # The case this test is about happened: a write failed with the next request out.
    assert failed_with_next_request_out >= 1
    assert segment_bytes(data_dir / f"{TOPIC}-0") == b"".join(batches)
    assert replicator.pool.account.used == 0


# Timeouts short enough that a request left unanswered fails within the test.
IMPATIENT = FetchSettings(
    backoff_ms=20, wait_max_ms=50, request_timeout_ms=300, reconnect_backoff_ms=20
)


async def _replicate_through_faults(tmp_path, **faults: list[str]) -> None:
    """The scripted leader fails requests as `faults` (its fields) say; every batch must
    still be replicated, byte for byte, and every fault used."""
    batches = _batches()
    leader = ScriptedLeader(TOPIC)
    leader.set_log(batches, leader_epoch=1)
    for field, script in faults.items():
        setattr(leader, field, list(script))
    port = await leader.start()
    data_dir = tmp_path / "data"
    replicator = _replicator(f"127.0.0.1:{port}", data_dir, TOPIC, IMPATIENT)
    await _replicate_all(replicator, data_dir, leader)
    assert all(getattr(leader, field) == [] for field in faults)
    assert segment_bytes(data_dir / f"{TOPIC}-0") == b"".join(batches)


async def test_a_request_lost_with_its_connection_is_told_apart_from_one_not_answered(
    tmp_path, monkeypatch
):
    """R14: the table is told whether the leader had a failed request and failed it (no
    answer within the request's timeout) or the request was lost with its connection
    (closed by the leader); only the first may count as a turn for the stall rule. After
    both, replication goes on to the leader's end."""
    from replicad.follower.partition_table import PartitionTable

    told: list[bool] = []
    real_send_failed = PartitionTable.send_failed

    def send_failed(self, now_ms, *, leader_failed_it=False):
        told.append(leader_failed_it)
        return real_send_failed(self, now_ms, leader_failed_it=leader_failed_it)

    monkeypatch.setattr(PartitionTable, "send_failed", send_failed)
    await _replicate_through_faults(tmp_path, fetch_faults=["close", "silent"])
    assert told == [False, True]


async def test_a_list_offsets_not_answered_in_time_makes_the_next_ask_fewer(tmp_path, monkeypatch):
    """R15: a ListOffsets request the leader does not answer in time is told to the table,
    which asks fewer partitions next; the partition then starts and is replicated."""
    from replicad.follower.partition_table import PartitionTable

    told = 0
    real = PartitionTable.offsets_not_answered

    def offsets_not_answered(self):
        nonlocal told
        told += 1
        return real(self)

    monkeypatch.setattr(PartitionTable, "offsets_not_answered", offsets_not_answered)
    await _replicate_through_faults(tmp_path, list_offsets_faults=["silent"])
    assert told == 1


async def test_responses_as_large_as_the_pool_do_not_stall_replication(
    kafka_broker, unique_topic, tmp_path
):
    """fetch.response_max_bytes == fetch.buffer_memory (the config allows it) and many
    partitions with small batches: the leader fills max_bytes with records, and the
    fields around them would push the frame past the pool, which is then never read. The
    fetcher asks for less, so everything arrives."""
    topic = unique_topic()
    partitions = 200
    kafka_broker.create_topic(topic, partitions)
    producer = CheckedProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0, "batch.size": 600}
    )
    for i in range(16):
        for p in range(partitions):
            producer.produce(topic, value=b"%04d" % i + b"x" * 496, partition=p)
        producer.flush(30)
    assert producer.flush(30) == 0
    pool_bytes = 256 * 1024
    data_dir = tmp_path / "data"
    replicator = _replicator(
        kafka_broker.bootstrap,
        data_dir,
        topic,
        FetchSettings(
            response_max_bytes=pool_bytes,
            buffer_memory=pool_bytes,
            partition_max_bytes=64 * 1024,
            wait_max_ms=100,
        ),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(replicator.run(stop))
    try:
        await until(
            lambda: (
                sum(v for tp, v in end_offsets(data_dir).items() if tp.topic == topic)
                == 16 * partitions
            ),
            what="every partition replicated",
        )
        fetcher = next(iter(replicator.fetchers.values()))
        assert fetcher.response_max_bytes() < pool_bytes
        assert fetcher.stats.connection_errors == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert replicator.pool.peak <= pool_bytes


async def test_a_full_disk_while_logs_are_created_pauses_them_and_the_leader_goes_on(
    kafka_broker, unique_topic, tmp_path, monkeypatch
):
    """Real Kafka; the disk is full when the partitions' logs are first made (ENOSPC from
    their segments' files, three times): those partitions wait and are made again later,
    and the leader's fetch loop does not fail. Before, the OSError left the loop's turn (a
    traceback a retry, nothing fetched: session 13's 10,000-partition soak), counted as a
    loop error."""
    topic = unique_topic()
    kafka_broker.create_topic(topic, 3)
    produce_numbered(kafka_broker.bootstrap, topic, 3, 100)
    refused = 0
    real_create = partition_module.LogSegment.create

    def full_disk_create(*args, **kwargs):
        nonlocal refused
        if refused < 3:
            refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(partition_module.LogSegment, "create", full_disk_create)
    data_dir = tmp_path / "data"
    replicator = _replicator(
        kafka_broker.bootstrap, data_dir, topic, FetchSettings(backoff_ms=20, wait_max_ms=50)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(replicator.run(stop))
    try:
        await until(
            lambda: (
                {tp.partition: n for tp, n in end_offsets(data_dir).items() if tp.topic == topic}
                == {0: 100, 1: 100, 2: 100}
            ),
            what="every record replicated once the disk takes the logs",
        )
        assert all(f.stats.loop_errors == 0 for f in replicator.fetchers.values())
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert refused == 3
