"""Durability off the event loop: the durability thread, the replicator's checkpoints on it,
and `replicad run` answering its control socket while a checkpoint waits on a slow disk
(tools/chaos/slowdisk.c). The consistency rules a checkpoint keeps while the loop appends
and truncates are tested with the log store (tests/log/test_partition.py, test_manager.py)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from replicad.control.client import query
from replicad.follower.durability import THREAD_NAME, DurabilityThread
from replicad.follower.replicator import Replicator, ReplicatorSettings
from replicad.log.config import LogConfig
from replicad.log.layout import LEADER_EPOCH_CHECKPOINT, RECOVERY_POINT_CHECKPOINT
from replicad.log.manager import LogManager
from replicad.protocol.metadata import TopicSelection
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.chaos.disk import SlowDisk
from tools.logdata.batches import producer_batch
from tools.peers.produce import CheckedProducer
from tools.replica import replicad_run
from tools.wait import DEADLINE_S, until, wait_until


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
        release.wait(DEADLINE_S)
        order.append("slow")

    waiting = asyncio.create_task(durability.run(slow))
    await until(lambda: durability.stats().running, what="the slow job to start")
    waiting.cancel()
    following = asyncio.create_task(durability.run(lambda: order.append("next")))
    await asyncio.sleep(0)  # the following job is handed to the thread
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


async def test_keyed_jobs_asked_while_one_waits_run_once(tmp_path: Path) -> None:
    durability = DurabilityThread()
    release = threading.Event()
    ran: list[str] = []
    durability.submit(lambda: release.wait(DEADLINE_S), what="a slow job")
    for n in range(5):
        durability.submit(lambda n=n: ran.append(f"epochs {n}"), what="epochs", key="p1")
    durability.submit(lambda: ran.append("other"), what="other", key="p2")
    release.set()
    await durability.run(lambda: None)
    assert ran == ["epochs 0", "other"]
    assert durability.stats().merged == 4
    durability.close()


async def test_a_failover_writes_the_epoch_files_on_the_durability_thread_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of partitions changing leader epoch at once cost the loop no fsync: the
    appends (here, on the test's loop thread) hand each partition's leader-epoch file to
    the durability thread, and epochs that change again while that write waits are one
    write (the thread is held busy meanwhile). The order against checkpoints is
    tests/log/test_partition.py's."""
    import replicad.log.partition as partition_module

    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    replicator = Replicator(
        ReplicatorSettings(("127.0.0.1:9",), tmp_path / "data", TopicSelection(("t",)))
    )
    logs.disk_later = replicator.durability.submit
    tps = [TopicPartition("t", p) for p in range(50)]
    plogs = [logs.get_or_create(tp) for tp in tps]
    real_stage = partition_module.stage_file
    staged_on: list[str] = []

    def stage(path: Path, text: str, *, tag: str = "") -> Path:
        staged_on.append(threading.current_thread().name)
        return real_stage(path, text, tag=tag)

    monkeypatch.setattr(partition_module, "stage_file", stage)
    release = threading.Event()
    replicator.durability.submit(lambda: release.wait(DEADLINE_S), what="a busy disk")
    for epoch in (3, 4, 5):  # three elections in a row
        for plog in plogs:
            raw = producer_batch(plog.log_end_offset, [b"x"], leader_epoch=epoch)
            plog.append(raw, scan_batches(raw).batches, now_ms=0)
    assert staged_on == []  # nothing written by the appending thread
    release.set()
    await replicator.durability.run(lambda: None)  # after every handed-over write
    assert staged_on == [f"{THREAD_NAME}_0"] * len(tps)  # one write a partition
    assert replicator.durability.stats().merged == 2 * len(tps)
    for plog in plogs:
        entries = [(e.epoch, e.start_offset) for e in plog.epoch_entries()]
        assert entries == [(3, 0), (4, 1), (5, 2)]
        text = (plog.directory / LEADER_EPOCH_CHECKPOINT).read_text()
        assert text == "0\n3\n3 0\n4 1\n5 2\n"
    replicator.durability.close()
    logs.close()


async def test_a_checkpoint_held_by_the_disk_leaves_the_loop_free_and_claims_what_it_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicator._checkpoint with every fsync held until the test lets the disk go (60
    partitions): the fsyncs run on the durability thread, the loop runs and appends while
    they are held, and the recovery points written are what was synced, not more. How long
    a checkpoint on a slow disk blocks the loop is `python -m tools.chaos.checkpoint_block`'s
    figure (docs/reliability.md)."""
    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    raw = producer_batch(0, [b"x" * 100] * 3)
    headers = scan_batches(raw).batches
    tps = [TopicPartition("t", p) for p in range(60)]
    for tp in tps:
        logs.get_or_create(tp).append(raw, headers, now_ms=0)
    real_fsync = os.fsync
    loop_thread = threading.current_thread()
    disk_free = threading.Event()
    synced_on: set[str] = set()

    def held_fsync(fd: int) -> None:
        synced_on.add(threading.current_thread().name)
        if threading.current_thread() is not loop_thread:  # on the loop it would hang it
            disk_free.wait(DEADLINE_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    replicator = Replicator(
        ReplicatorSettings(("127.0.0.1:9",), tmp_path / "data", TopicSelection(("t",)))
    )
    replicator.logs = logs
    checkpoint = asyncio.ensure_future(replicator._checkpoint())
    await until(lambda: synced_on, what="the checkpoint's first fsync")
    # The loop runs and appends while the disk holds the checkpoint: after it, these are
    # not claimed.
    later = bytearray(raw)
    later[:8] = (3).to_bytes(8, "big")
    logs.get_or_create(tps[-1]).append(later, scan_batches(later).batches, now_ms=0)
    assert not checkpoint.done()
    disk_free.set()
    await checkpoint
    monkeypatch.undo()
    assert synced_on == {f"{THREAD_NAME}_0"}
    claims = (tmp_path / "data" / RECOVERY_POINT_CHECKPOINT).read_text().splitlines()[2:]
    assert claims[-1] in ("t 59 3", "t 59 6")  # the append may have made the flush or not
    assert {line.rsplit(" ", 1)[1] for line in claims[:-1]} == {"3"}
    replicator.durability.close()
    logs.close()


PARTITIONS = 40
# 120 unsynced files at 5 s an fsync: a checkpoint of ten minutes, under way all along the
# test (and cut short by slow.off()).
SYNC_S = 5


def test_replicad_run_answers_status_while_a_checkpoint_waits_on_a_slow_disk(
    kafka_broker, unique_topic, tmp_path: Path
) -> None:
    """`replicad run` with every fsync in its data directory taking 5 s (LD_PRELOAD shim):
    once a checkpoint of 40 partitions' unsynced files waits on the disk, the control socket
    still answers status (on the old code, where checkpoints ran on the event loop, status
    waited for the whole checkpoint: minutes, past the query's deadline)."""
    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5})

    def produce(n: int) -> None:
        for p in range(PARTITIONS):
            for i in range(n):
                producer.produce(topic, value=b"v%d" % i, partition=p)
        assert producer.flush(30) == 0

    produce(5)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    slow = SlowDisk(data_dir, tmp_path, write_us=0, sync_us=SYNC_S * 1_000_000)
    sock = tmp_path / "control.sock"
    config = {"checkpoint_interval_ms": 500}
    with replicad_run(
        kafka_broker.bootstrap, topic, data_dir, config=config, control_socket=sock, env=slow.env()
    ) as proc:
        proc.wait_caught_up(5 * PARTITIONS)
        # The slow disk, then new data in every partition (their files unsynced): a
        # checkpoint syncs only the partitions written since the last one.
        slow.on()
        delayed_before = slow.delayed_calls()
        produce(3)
        proc.wait_caught_up(8 * PARTITIONS)
        wait_until(
            lambda: slow.delayed_calls() > delayed_before,
            what="a checkpoint to wait on the slow disk",
        )
        for _ in range(3):
            assert query(sock, "status", timeout_s=60)
        slow.off()
