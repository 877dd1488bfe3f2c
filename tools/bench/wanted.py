"""CPU a request costs the partition table at many partitions, in process (issue 34).

    .venv/bin/python -m tools.bench.wanted [--partitions 10000] [--requests 200] [--share 100]

One `PartitionTable` over N partitions of in-memory logs (the facts the core reads, as
tests/follower/test_partition_table's MemoryLog keeps them), every partition caught up,
and `--requests` requests answered with nothing new, in two scenarios:
- shares: a sessionless leader (Tansu): the first, full, request answered without a
  session, then shares of `--share` partitions (R11), each partition answered caught up;
- session: a leader that keeps a session (Kafka): the first, full, request makes it, then
  incremental requests whose answers name no partition.
The clock advances 10 ms a request (a request every 10 ms). Printed per scenario, CPU
seconds of this process (time.process_time) over the requests: next_fetch + on_response,
the other calls the asyncio shell makes on the table each turn (without_log,
offset_questions, the epoch check: fetcher.py's `_turn`), and the part of both spent
examining partitions (`_refresh`, the partition table's R13; `_wanted` on a table before
it), also per request; and the load average beside them (a loaded machine's wall clock is
not a figure: CPU seconds are).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replicad.follower.fetch_response import (
    NO_DIVERGING_EPOCH,
    FetchedPartition,
    FetchedTopic,
    FetchResponseView,
)
from replicad.follower.fetch_settings import FetchSettings
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.follower.partition_table import PartitionTable
from replicad.log.epoch import EpochEndOffset, LeaderEpochCache
from replicad.types import TopicPartition

TOPIC_ID = uuid.UUID(int=7)
FETCH_VERSION = 13
END = 100  # every partition's log end and the leader's high watermark: caught up
STEP_MS = 10


@dataclass
class MemoryLog:
    """The facts the core reads of a log (log/partition.py's, without a disk)."""

    log_start_offset: int = 0
    log_end_offset: int = END
    high_watermark: int = END
    epochs: LeaderEpochCache = field(default_factory=LeaderEpochCache)

    def latest_epoch(self) -> int | None:
        return self.epochs.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        return self.epochs.end_offset_for(epoch, self.log_end_offset)


@dataclass(frozen=True)
class Figures:
    scenario: str
    requests: int
    table_cpu_s: float  # next_fetch + on_response
    turn_cpu_s: float  # without_log + offset_questions + the epoch check
    examine_cpu_s: float  # in either, examining partitions (_refresh, or _wanted before)

    def line(self) -> str:
        per = 1000 / self.requests
        total = self.table_cpu_s + self.turn_cpu_s
        return (
            f"{self.scenario}: {self.requests} requests, {total:.3f} CPU-s "
            f"({total * per:.3f} ms a request): next_fetch+on_response {self.table_cpu_s:.3f}, "
            f"the shell's other table calls {self.turn_cpu_s:.3f}; in both, examining "
            f"partitions {self.examine_cpu_s:.3f} ({self.examine_cpu_s * per:.3f} ms a request)"
        )


def build_table(partitions: int, share: int) -> PartitionTable:
    table = PartitionTable(1, FetchSettings(sessionless_max_partitions=share))
    for p in range(partitions):
        local = MemoryLog()
        local.epochs.assign(5, 0)
        state = PartitionState(
            tp=TopicPartition("t", p),
            topic_id=TOPIC_ID,
            leader_id=1,
            leader_epoch=5,
            phase=PartitionPhase.FETCHING,
            fetch_offset=END,
        )
        table.add(state, local)
    return table


def _answer(fetch: Any, session_id: int, *, name_all: bool) -> FetchResponseView:
    """Nothing new: each partition asked answered caught up (name_all), or none named."""
    parts = (
        tuple(
            FetchedPartition(
                partition_index=tp.partition,
                error_code=0,
                high_watermark=END,
                last_stable_offset=END,
                log_start_offset=0,
                diverging_epoch=NO_DIVERGING_EPOCH,
                aborted_transactions=-1,
                preferred_read_replica=-1,
                records=memoryview(b""),
            )
            for tp in fetch.plan.to_send
        )
        if name_all
        else ()
    )
    topics = (FetchedTopic(None, TOPIC_ID, parts),) if parts else ()
    return FetchResponseView(
        version=fetch.version,
        correlation_id=1,
        throttle_time_ms=0,
        error_code=0,
        session_id=session_id,
        responses=topics,
    )


def _shell_turn(table: PartitionTable, now_ms: int) -> None:
    """What fetcher.py's `_turn` asks the table before it sends (no question is due here);
    the epoch check as the fetcher made it before `epoch_check_due`, on a table without it."""
    table.without_log(now_ms)
    if hasattr(table, "epoch_check_due"):
        table.epoch_check_due(now_ms)
    else:
        any(
            s.epoch_check_pending and now_ms >= s.delayed_until_ms
            for s in table.partitions.values()
        )
    table.offset_questions(now_ms)


def run(scenario: str, partitions: int, requests: int, share: int) -> Figures:
    table = build_table(partitions, share)
    session_id = 0 if scenario == "shares" else 7
    now = 0
    first = table.next_fetch(now, max_version=FETCH_VERSION)
    assert first is not None and first.plan.is_full
    table.on_response(first, _answer(first, session_id, name_all=True), now)

    # The examination of partitions: `_refresh` (R13: called by next_fetch and by the
    # questions before it), or `_wanted` on a table without it (the walk per request).
    inside = [0.0]
    name = "_refresh" if hasattr(table, "_refresh") else "_wanted"
    examine: Callable[[int], Any] = getattr(table, name)

    def timed(now_ms: int) -> Any:
        start = time.process_time()
        try:
            return examine(now_ms)
        finally:
            inside[0] += time.process_time() - start

    setattr(table, name, timed)
    table_cpu = turn_cpu = 0.0
    for _ in range(requests):
        now += STEP_MS
        start = time.process_time()
        _shell_turn(table, now)
        mid = time.process_time()
        fetch = table.next_fetch(now, max_version=FETCH_VERSION)
        asked = time.process_time()
        assert fetch is not None
        if scenario == "shares":
            assert len(fetch.plan.to_send) == min(share, partitions)
        else:
            assert not fetch.plan.is_full
        answer = _answer(fetch, session_id, name_all=scenario == "shares")  # not counted
        answered = time.process_time()
        table.on_response(fetch, answer, now)
        end = time.process_time()
        turn_cpu += mid - start
        table_cpu += (asked - mid) + (end - answered)
    return Figures(scenario, requests, table_cpu, turn_cpu, inside[0])


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--share", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"partitions {args.partitions}, share {args.share}, load before {_load()}")
    for scenario in ("shares", "session"):
        figures = run(scenario, args.partitions, args.requests, args.share)
        print(figures.line())
    print(f"load after {_load()}")


if __name__ == "__main__":
    main()
