"""Durability off the event loop: the durability thread, the replicator's checkpoints on it,
and `replicad run` answering its control socket while a checkpoint waits on a slow disk
(tools/chaos/slowdisk.c). The consistency rules a checkpoint keeps while the loop appends
and truncates are tested with the log store (tests/log/test_partition.py, test_manager.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from replicad.control.client import query
from replicad.follower.durability import THREAD_NAME, DurabilityThread
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.log.config import LogConfig
from replicad.log.layout import RECOVERY_POINT_CHECKPOINT
from replicad.log.manager import LogManager
from replicad.protocol.metadata import TopicSelection
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.chaos.disk import SlowDisk
from tools.logdata.batches import producer_batch
from tools.replica import replicad_run


async def _longest_stall(until: asyncio.Future[object], tick_s: float = 0.005) -> float:
    """The longest the loop could not run a ticker (beyond its tick), until `until` is done."""
    longest = 0.0
    last = time.perf_counter()
    while not until.done():
        await asyncio.sleep(tick_s)
        now = time.perf_counter()
        longest = max(longest, now - last - tick_s)
        last = now
    return longest


async def test_jobs_run_in_order_on_one_thread_of_their_own() -> None:
    durability = DurabilityThread()
    ran: list[tuple[int, str]] = []

    def job(n: int) -> int:
        ran.append((n, threading.current_thread().name))
        return n * 10

    results = await asyncio.gather(*(durability.run(job, n) for n in range(5)))
    assert results == [0, 10, 20, 30, 40]
    assert [n for n, _ in ran] == [0, 1, 2, 3, 4]
    assert {name for _, name in ran} == {f"{THREAD_NAME}_0"}
    assert durability.stats().jobs == 5
    durability.close()


async def test_a_failed_job_raises_in_its_caller_and_the_next_job_runs() -> None:
    durability = DurabilityThread()

    def fails() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        await durability.run(fails)
    assert await durability.run(lambda: "next") == "next"
    durability.close()


async def test_a_cancelled_caller_does_not_stop_its_job_and_the_next_waits_for_it() -> None:
    durability = DurabilityThread()
    release = threading.Event()
    order: list[str] = []

    def slow() -> None:
        release.wait(5)
        order.append("slow")

    waiting = asyncio.create_task(durability.run(slow))
    await asyncio.sleep(0.05)
    waiting.cancel()
    following = asyncio.create_task(durability.run(lambda: order.append("next")))
    await asyncio.sleep(0.05)
    assert order == [] and durability.stats().running
    release.set()
    await following
    assert order == ["slow", "next"]
    durability.close()


async def test_unawaited_jobs_run_in_turn_and_their_failures_are_counted() -> None:
    durability = DurabilityThread()
    ran: list[str] = []

    def fails() -> None:
        raise OSError(5, "Input/output error")

    durability.submit(lambda: ran.append("first"), what="first")
    durability.submit(fails, what="failing flush")
    assert await durability.run(lambda: "after") == "after"
    assert ran == ["first"]
    assert durability.stats().failed_unawaited == 1
    durability.close()


async def test_the_replicator_hands_due_flushes_to_the_durability_thread(tmp_path: Path) -> None:
    """log.flush_messages: the flush an append makes due runs on the durability thread."""
    logs = LogManager.open(tmp_path / "data", LogConfig(flush_messages=3), now_ms=0)
    replicator = Replicator(
        ReplicatorSettings(("127.0.0.1:9",), tmp_path / "data", TopicSelection(("t",)))
    )
    logs.flush_later = replicator._flush_later
    raw = producer_batch(0, [b"x" * 100] * 3)
    plog = logs.get_or_create(TopicPartition("t", 0))
    plog.append(raw, scan_batches(raw).batches, now_ms=0)
    assert plog.recovery_point == 0
    await replicator.durability.run(lambda: None)  # after the handed-over flush
    assert plog.recovery_point == 3
    replicator.durability.close()
    logs.close()


async def test_a_checkpoint_held_by_the_disk_leaves_the_loop_free_and_claims_what_it_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicator._checkpoint with every fsync held 15 ms (60 partitions: seconds in all):
    the loop keeps running (a ticker is never late by more than a fraction of it), appends
    made meanwhile land, and the recovery points written are what was synced, not more."""
    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    raw = producer_batch(0, [b"x" * 100] * 3)
    headers = scan_batches(raw).batches
    tps = [TopicPartition("t", p) for p in range(60)]
    for tp in tps:
        logs.get_or_create(tp).append(raw, headers, now_ms=0)
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.015)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    replicator = Replicator(
        ReplicatorSettings(("127.0.0.1:9",), tmp_path / "data", TopicSelection(("t",)))
    )
    replicator.logs = logs
    started = time.perf_counter()
    checkpoint = asyncio.ensure_future(replicator._checkpoint())
    await asyncio.sleep(0.1)
    # The loop appends while the checkpoint syncs: after it, these are not claimed.
    later = bytearray(raw)
    later[:8] = (3).to_bytes(8, "big")
    logs.get_or_create(tps[-1]).append(later, scan_batches(later).batches, now_ms=0)
    stall = await _longest_stall(checkpoint)
    await checkpoint
    took = time.perf_counter() - started
    monkeypatch.undo()
    assert took > 1.5  # three files of every partition were synced, one by one
    # On the loop it would be all of it; a loaded machine alone stalls a loop ~0.1-0.4 s.
    assert stall < took / 4
    claims = (tmp_path / "data" / RECOVERY_POINT_CHECKPOINT).read_text().splitlines()[2:]
    assert claims[-1] in ("t 59 3", "t 59 6")  # the append may have made the flush or not
    assert {line.rsplit(" ", 1)[1] for line in claims[:-1]} == {"3"}
    replicator.durability.close()
    logs.close()


PARTITIONS = 40
SYNC_S = 0.25


def test_replicad_run_answers_status_while_a_checkpoint_waits_on_a_slow_disk(
    kafka_broker, unique_topic, tmp_path: Path
) -> None:
    """`replicad run` with every fsync in its data directory taking 0.25 s (LD_PRELOAD shim):
    a checkpoint of 40 partitions' unsynced files takes tens of seconds, and the control
    socket answers status within a second all along (on the old code, where checkpoints ran
    on the event loop, status waited for the whole checkpoint)."""
    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5})

    def produce(n: int) -> None:
        for p in range(PARTITIONS):
            for i in range(n):
                producer.produce(topic, value=b"v%d" % i, partition=p)
        assert producer.flush(30) == 0

    produce(5)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    slow = SlowDisk(data_dir, tmp_path, write_us=0, sync_us=int(SYNC_S * 1_000_000))
    sock = tmp_path / "control.sock"
    config = {"checkpoint_interval_ms": 500}
    with replicad_run(
        kafka_broker.bootstrap, topic, data_dir, config=config, control_socket=sock, env=slow.env()
    ) as proc:
        proc.wait_caught_up(5 * PARTITIONS)
        # New data in every partition (their files unsynced), then the slow disk.
        produce(3)
        proc.wait_caught_up(8 * PARTITIONS)
        slow.on()
        delayed_before = slow.delayed_calls()
        slowest = 0.0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            asked = time.monotonic()
            status = query(sock, "status", timeout_s=5)
            slowest = max(slowest, time.monotonic() - asked)
            assert status
            time.sleep(0.2)
        delayed = slow.delayed_calls() - delayed_before
        slow.off()
        # A checkpoint was at work on the slow disk the whole time (0.25 s per fsync).
        assert delayed >= 6 / SYNC_S * 0.8
        assert slowest < 1.0
