"""One kafka-python consumer-group member as a process of its own, for tests that SIGKILL a
member or stop it (SIGTERM: it closes its consumer, so a dynamic member leaves its group):

    python -m tools.peers.group_member --bootstrap HOST:PORT --topic T --group G \\
        [--instance-id ID] [--session-timeout-ms MS] [--per-record-ms MS] [--log FILE]

It subscribes, polls, and commits synchronously after every poll that returned records.
Each record takes --per-record-ms of "processing" (default 0), so that a test's joins, kills
and restarts happen while there is still something to read. One JSON object per line on
stdout, flushed at once:
- {"assigned": [partitions]} each time the group assigns it partitions (every rebalance it
  takes part in, even one that gives it the same partitions);
- {"read": [[partition, offset], ...]} per poll that returned records;
- {"error": "<exception class>", "while": "poll" | "commit"} when the client raises. A
  commit refused during a rebalance is said and reading goes on (the next owner reads
  those records again: at least once). A commit refused because the member is fenced
  (another process took its group.instance.id) ends it with status 3; so does an error in
  poll, after one more try to commit what it read (refused too when fenced: said).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

EXIT_CLIENT_ERROR = 3
FENCED = "FencedInstanceIdError"


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str] | None = None) -> int:
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--instance-id")
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--per-record-ms", type=int, default=0)
    parser.add_argument("--log", help="kafka-python's log lines go here, not to stderr")
    args = parser.parse_args(argv)

    # kafka-python's own account of each join and assignment: what a failed test shows. In
    # a file of its own with --log: its heartbeat thread writes while the main thread prints
    # an event, and a log line once landed inside an event's line on a shared output.
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        **({"filename": args.log} if args.log else {"stream": sys.stderr}),
    )
    debug = os.environ.get("REPLICAD_GROUP_MEMBER_DEBUG") == "1"
    logging.getLogger("kafka.coordinator").setLevel(logging.DEBUG if debug else logging.INFO)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            say(assigned=sorted(tp.partition for tp in assigned))

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        group_instance_id=args.instance_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        max_poll_records=5,
        # kafka-python asks for metadata again only at its 5-minute age: a member whose
        # first answer did not list the topic yet takes an empty assignment until then
        # (a member of the hog run's failed rebalance test reported [] twice; 40ad403 made
        # the same change for the mirror's group members).
        metadata_max_age_ms=2_000,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=max(100, args.session_timeout_ms // 10),
    )
    subscribe_knowing(consumer, [args.topic], Listener())
    try:
        while not stop.is_set():
            try:
                polled = consumer.poll(timeout_ms=200)
            except Exception as exc:
                say(error=type(exc).__name__, detail=str(exc), **{"while": "poll"})
                commit(consumer)
                return EXIT_CLIENT_ERROR
            read = [[tp.partition, m.offset] for tp, ms in polled.items() for m in ms]
            if not read:
                continue
            time.sleep(len(read) * args.per_record_ms / 1000)  # the records' processing
            say(read=read)
            if commit(consumer) == FENCED:
                return EXIT_CLIENT_ERROR
    finally:
        consumer.close(autocommit=False)
    return 0


def know_topics(consumer: Any, topics: list[str], timeout_s: float = 300.0) -> None:
    """Wait until `consumer`'s metadata holds each of `topics`, before it subscribes.

    kafka-python may join a group before its first metadata answer names the topic: a
    leader then assigns nothing ("No partition metadata for topic") and rejoins when the
    metadata arrives. kafka-python 3.0.12 can strand a leader in that rejoin: if a poll
    gives up while its SyncGroup is answered, the answer is never applied (no assignment,
    no heartbeat; expelled at its session timeout) -- the suite's failures against serve
    and Kafka. tools/peers/rejoin_race.py says why and reproduces it; tests/peers/
    test_group_member.py shows it. A member that knows its topics first joins with them
    (`subscribe_knowing` also closes the window after the subscription).
    """
    deadline = time.monotonic() + timeout_s
    while not all(consumer.partitions_for_topic(t) for t in topics):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no metadata for {topics} within {timeout_s:.0f} s")
        time.sleep(0.1)


def subscribe_knowing(
    consumer: Any, topics: list[str], listener: Any = None, timeout_s: float = 300.0
) -> None:
    """Subscribe `consumer` to `topics` (which exist) so that its first join assigns them
    and nothing in its metadata later makes its leader rejoin (know_topics' race).

    `know_topics` first; then, once subscribed, wait until the consumer's own record of
    the subscription's metadata -- what its leader compares the assignment with, and
    rejoins on when they differ -- names every partition. kafka-python builds that record
    only from a metadata answer that comes after the subscription: a first join before it
    assigns every partition from the cluster's metadata but keeps an empty record, and so
    rejoins, by the racy path, when the answer comes (the same start hung one run of
    tests/peers/test_group_member.py's own member). A kafka-python without that record
    skips the second wait.
    """
    know_topics(consumer, topics, timeout_s)
    if listener is None:
        consumer.subscribe(topics)
    else:
        consumer.subscribe(topics, listener=listener)
    coordinator = getattr(consumer, "_coordinator", None)
    if not hasattr(coordinator, "_metadata_snapshot"):
        return
    wanted = {t: consumer.partitions_for_topic(t) for t in topics}
    deadline = time.monotonic() + timeout_s
    while not all(coordinator._metadata_snapshot.get(t) == wanted[t] for t in topics):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the subscription's metadata for {topics} within {timeout_s:.0f} s")
        time.sleep(0.05)


def commit(consumer: Any) -> str | None:
    """Commit what was read; the error's class name (said) when it is refused."""
    try:
        consumer.commit()
    except Exception as exc:
        say(error=type(exc).__name__, detail=str(exc), **{"while": "commit"})
        return type(exc).__name__
    return None


if __name__ == "__main__":
    sys.exit(main())
