"""The durability thread's queue (replicad/follower/disk_queue.py), driven step by step."""

from __future__ import annotations

import pytest

from replicad.errors import LocalProtocolError
from replicad.follower.disk_queue import MOVES, DiskQueue, KeyEvent, KeyState, move


def _run_all(queue: DiskQueue) -> list[str]:
    ran = []
    while (job := queue.next()) is not None:
        ran.append(job.what)
        job.run()
    return ran


def test_jobs_run_first_asked_first_run() -> None:
    queue = DiskQueue()
    for what in ("flush a", "checkpoint", "flush b"):
        assert queue.ask(lambda: None, what).queued
    assert len(queue) == 3
    assert _run_all(queue) == ["flush a", "checkpoint", "flush b"]
    assert queue.next() is None


def test_asks_of_a_waiting_key_are_one_job_in_the_place_of_the_first() -> None:
    queue = DiskQueue()
    assert queue.ask(lambda: None, "epochs p1", key="p1").queued
    assert queue.ask(lambda: None, "checkpoint").queued
    assert not queue.ask(lambda: None, "epochs p1 again", key="p1").queued
    assert queue.ask(lambda: None, "epochs p2", key="p2").queued
    assert queue.merged == 1
    assert _run_all(queue) == ["epochs p1", "checkpoint", "epochs p2"]


def test_an_ask_after_its_key_started_queues_it_again() -> None:
    """The running job may have read the state before the change that asked again."""
    queue = DiskQueue()
    queue.ask(lambda: None, "epochs p1 (first)", key="p1")
    started = queue.next()
    assert started is not None and started.what == "epochs p1 (first)"
    assert queue.ask(lambda: None, "epochs p1 (second)", key="p1").queued
    assert _run_all(queue) == ["epochs p1 (second)"]


def test_jobs_without_a_key_are_never_merged() -> None:
    queue = DiskQueue()
    assert all(queue.ask(lambda: None, "checkpoint").queued for _ in range(3))
    assert len(queue) == 3 and queue.merged == 0


def test_discard_drops_every_job_not_started_and_their_keys() -> None:
    queue = DiskQueue()
    queue.ask(lambda: None, "epochs p1", key="p1")
    queue.ask(lambda: None, "checkpoint")
    assert [j.what for j in queue.discard()] == ["epochs p1", "checkpoint"]
    assert len(queue) == 0
    assert queue.ask(lambda: None, "epochs p1", key="p1").queued


def test_the_key_table_and_a_move_not_in_it() -> None:
    assert move(KeyState.ABSENT, KeyEvent.ASK) == (KeyState.WAITING, True)
    assert move(KeyState.WAITING, KeyEvent.ASK) == (KeyState.WAITING, False)
    assert move(KeyState.WAITING, KeyEvent.START) == (KeyState.ABSENT, False)
    assert len(MOVES) == 3
    with pytest.raises(LocalProtocolError, match="no transition from absent on start"):
        move(KeyState.ABSENT, KeyEvent.START)
