"""The group-join race of the suite's group tests, reproduced: a kafka-python group leader
whose rejoin began from a metadata change is left without its assignment for good.

    python -m tools.peers.rejoin_race --peer serve|kafka [--runs N] [--poll-ms MS]
        [--bootstrap HOST:PORT] [--work DIR]

Each run: one kafka-python member subscribes to a topic that does not exist yet, so its
first join (it leads its group) assigns nothing; the topic is then created, the member's
metadata names it, and it rejoins -- the path a member takes when it joins before its
metadata names its topic. The run ends when the member is assigned the topic's partitions
("assigned"), or when it is stranded: its join-and-sync task has finished with the
SyncGroup answer in hand (the answer arrived), yet the member is still rebalancing, with
nothing assigned, no heartbeat, and no rejoin pending ("stranded"). A stranded member is
watched past its session timeout, to show that it stays so: nothing in kafka-python ever
applies that answer. kafka-python's coordinator logs at DEBUG into one file per run
(`--work`), with serve's side of each group request (`--peer serve`: each request as it
comes and its answer as it goes back); a stranded run prints its last requests and answers.

Why (kafka-python 3.0.12, and its main branch as of 2026-08): `join_group_async` loops
`while self.need_rejoin()`, and when `consumer.poll(timeout_ms)`'s time runs out while the
join-and-sync task is in flight, it returns and leaves the task to the next poll. The
leader's `_perform_assignment` sets `_assignment_snapshot` to the metadata snapshot, so a
rejoin that began only because the two differed (no `rejoin_needed`) is no longer
"needed" once the leader has assigned: the next poll does not wait on the task again, and
the code that applies its result (state STABLE, heartbeats on, the assignment) runs only
in that wait. Java's consumer keeps a join in flight pending (`rejoinNeededOrPending`:
`rejoinNeeded || joinFuture != null`), as kafka-python 2.x did (`_rejoin_incomplete`).
A short poll timeout (`--poll-ms`) widens the window; the suite's members poll for 200 ms.

`--peer serve` runs `replicad serve`'s LeaderServer in this process over a fresh data
directory (the topic is created by writing its partition); `--peer kafka` uses the broker
at `--bootstrap`, or starts one of its own (the harness's settings).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARTITIONS = 3
# How long past its session timeout a stranded member is watched, to show it stays so.
SESSION_TIMEOUT_MS = 6_000
WATCH_PAST_SESSION_S = 3.0
HANG_S = 120.0
# The logger serve's side of the group requests goes to (InProcessServe).
SERVE_LOG = "replicad.rejoin_race.serve"


@dataclass(frozen=True)
class Outcome:
    verdict: str  # "assigned" or "stranded"
    # For a stranded member: the partitions the SyncGroup answer it never applied gives it.
    answered: tuple[int, ...] = ()
    log: Path | None = None


def stranded(consumer: Any) -> tuple[int, ...] | None:
    """The partitions of the SyncGroup answer a kafka-python 3.0.12 member holds and will
    never apply (see the module docstring), or None if it is not in that state."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
    from kafka.structs import MemberState

    coordinator = consumer._coordinator
    task = coordinator._join_task
    if task is None or not task.is_done or not task.succeeded():
        return None
    if coordinator.state is not MemberState.REBALANCING or coordinator.need_rejoin():
        return None
    assignment = ConsumerProtocolAssignment.decode(task.value)
    return tuple(sorted(tp.partition for tp in assignment.partitions()))


def run_once(
    bootstrap: str,
    topic: str,
    group: str,
    create_topic: Callable[[], None],
    *,
    poll_ms: int,
    log_path: Path,
) -> Outcome:
    """One member through the race (see the module docstring)."""
    from kafka import KafkaConsumer
    from kafka.structs import MemberState

    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    loggers = [logging.getLogger(name) for name in ("kafka.coordinator", SERVE_LOG)]
    for each in loggers:
        each.addHandler(handler)
        each.setLevel(logging.DEBUG)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=500,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=SESSION_TIMEOUT_MS // 10,
    )
    try:
        # subscribe-ok: subscribing before the topic exists is the race this reproduces
        consumer.subscribe([topic])
        coordinator = consumer._coordinator
        deadline = time.monotonic() + HANG_S
        # Its record of the subscription's metadata, before it joins (a metadata answer
        # after the first join would make it rejoin, by the same path, before the topic
        # exists).
        while coordinator._metadata_snapshot != {topic: set()}:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata for the subscription within {HANG_S:.0f} s")
            time.sleep(0.05)
        # The first generation: the leader assigns nothing (no metadata for the topic).
        while coordinator.state is not MemberState.STABLE:
            _poll(consumer, poll_ms, deadline, "the first join")
        if consumer.assignment():
            raise RuntimeError(f"{topic} was assigned before it was created")
        create_topic()
        while not consumer.assignment():
            answered = stranded(consumer)
            if answered is not None:
                # Watched past the session timeout: still stranded, still nothing assigned.
                watch = time.monotonic() + SESSION_TIMEOUT_MS / 1000 + WATCH_PAST_SESSION_S
                while time.monotonic() < watch:
                    _poll(consumer, poll_ms, deadline, "the watch")
                    if consumer.assignment() or stranded(consumer) is None:
                        break
                else:
                    return Outcome("stranded", answered, log_path)
            _poll(consumer, poll_ms, deadline, "the assignment")
        return Outcome("assigned", log=log_path)
    finally:
        consumer.close(autocommit=False)
        for each in loggers:
            each.removeHandler(handler)
        handler.close()


def _poll(consumer: Any, poll_ms: int, deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"no end to {what} within {HANG_S:.0f} s")
    consumer.poll(timeout_ms=poll_ms)


def evidence(log_path: Path, lines: int = 10) -> str:
    """The run's last requests and answers as kafka-python (and serve) logged them, and
    how often kafka-python found no rejoin needed after its last SyncGroup answer."""
    keys = ("Sending", "Received", "serve got", "serve answers", "Setting newly", "Enabling")
    text = log_path.read_text().splitlines()
    picked = [line for line in text if any(k in line for k in keys)]
    last_sync = max((i for i, line in enumerate(text) if "Received SyncGroup" in line), default=0)
    idle = sum(1 for line in text[last_sync:] if "need_rejoin: False" in line)
    shown = [line[:240] for line in picked[-lines:]]
    return "\n".join([*shown, f"'need_rejoin: False' {idle} times after the last SyncGroup answer"])


# -- the peers -------------------------------------------------------------------------------


class InProcessServe:
    """`replicad serve`'s LeaderServer on an event loop thread, over a fresh data directory
    (groups start their first rebalance at the first join, as on the harness's brokers)."""

    def __init__(self, work: Path) -> None:
        from replicad.clock import wall_ms
        from replicad.groups.coordinator import CoordinatorConfig
        from replicad.leader.server import LeaderServer
        from replicad.leader.settings import ServeSettings
        from replicad.log.config import LogConfig
        from replicad.log.manager import LogManager

        self.logs = LogManager.open(work / "data", LogConfig(), now_ms=wall_ms())
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = LeaderServer(
            self.logs,
            ServeSettings(),
            group_config=CoordinatorConfig(initial_rebalance_delay_ms=0),
        )
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(HANG_S)
        self._tap_group_requests()

    def _tap_group_requests(self) -> None:
        """Serve's side of each group request, logged (SERVE_LOG, DEBUG) as it comes in and
        as its answer goes back: with kafka-python's own log, who lost what."""
        from replicad.protocol.apis import ApiKey

        groups = self.server.groups
        answer = groups.answer
        tap = logging.getLogger(SERVE_LOG)

        async def logged(request: Any, client_host: str) -> Any:
            head = request.head
            name = ApiKey(head.api_key).name
            tap.debug(
                "serve got %s correlation %d: %.300r", name, head.correlation_id, request.body
            )
            response = await answer(request, client_host)
            tap.debug(
                "serve answers %s correlation %d: %.300r", name, head.correlation_id, response
            )
            return response

        groups.answer = logged  # type: ignore[method-assign]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def create_topic(self, topic: str) -> None:
        """The topic's partitions, each with one record, written on the server's loop."""
        from replicad.clock import wall_ms
        from replicad.records.batch import scan_batches
        from replicad.types import TopicPartition
        from tools.logdata.batches import producer_batch

        def write() -> None:
            for p in range(PARTITIONS):
                plog = self.logs.get_or_create(TopicPartition(topic, p))
                data = producer_batch(0, [b"v"])
                plog.append(data, scan_batches(data).batches, now_ms=wall_ms())
                self.logs.checkpoint({TopicPartition(topic, p): plog.log_end_offset})
                # As the follower tells serve (a metadata request for every topic looks
                # nothing up, so the catalog would not find the new topic by itself).
                self.server.partition_changed(TopicPartition(topic, p))

        done: Future[None] = Future()

        def call() -> None:
            try:
                done.set_result(write())
            except BaseException as exc:
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(call)
        done.result(HANG_S)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(HANG_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(HANG_S)
        self.loop.close()
        self.logs.close()


@contextmanager
def peer(
    kind: str, work: Path, bootstrap: str | None
) -> Iterator[tuple[str, Callable[[str], None]]]:
    """The peer's bootstrap and how a topic is created there."""
    if kind == "serve":
        serve = InProcessServe(work)
        try:
            yield serve.bootstrap, serve.create_topic
        finally:
            serve.close()
        return
    from tools.peers.admin import create_topic_and_wait

    if bootstrap is not None:
        yield bootstrap, lambda topic: create_topic_and_wait(bootstrap, topic, PARTITIONS)
        return
    from tools.peers.kafka import KafkaBroker

    broker = KafkaBroker(work / "kafka")
    try:
        broker.start()
        yield broker.bootstrap, lambda topic: broker.create_topic(topic, PARTITIONS)
    finally:
        broker.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("serve", "kafka"), required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--poll-ms", type=int, default=200)
    parser.add_argument("--bootstrap", help="a running Kafka broker (--peer kafka)")
    parser.add_argument("--work", type=Path, help="where the logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="rejoin-race-"))
    work.mkdir(parents=True, exist_ok=True)
    counts = {"assigned": 0, "stranded": 0}
    with peer(args.peer, work, args.bootstrap) as (bootstrap, create_topic):
        for run in range(args.runs):
            tag = f"{run}-{uuid.uuid4().hex[:6]}"
            topic, group = f"race-{tag}", f"race-{tag}"
            outcome = run_once(
                bootstrap,
                topic,
                group,
                lambda topic=topic: create_topic(topic),
                poll_ms=args.poll_ms,
                log_path=work / f"run-{run}.log",
            )
            counts[outcome.verdict] += 1
            print(f"run {run}: {outcome.verdict}", flush=True)
            if outcome.verdict == "stranded" and outcome.log is not None:
                print(f"  the SyncGroup answer it holds assigns partitions {outcome.answered}")
                print("  " + evidence(outcome.log).replace("\n", "\n  "), flush=True)
    print(
        f"{args.peer}, poll {args.poll_ms} ms: {counts['stranded']} stranded, "
        f"{counts['assigned']} assigned of {args.runs} runs (logs: {work})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
