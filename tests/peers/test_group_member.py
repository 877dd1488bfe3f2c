"""tools/peers/group_member.py's `know_topics`, and the kafka-python race it keeps the suite's
group members out of (tools/peers/rejoin_race.py), against `replicad serve`'s LeaderServer
in this process (no broker):

- `know_topics` returns once the consumer's metadata names a topic created after the
  consumer started; for a topic that never comes it raises TimeoutError naming it. A
  member subscribed by `subscribe_knowing` joins once, with every partition.
- kafka-python 3.0.12 strands a group leader whose rejoin began from a metadata change
  (its topic appeared after its first join) when a poll gives up while its SyncGroup is
  answered: serve's answer arrives, and the member never applies it (no assignment, no
  heartbeat; the suite's failures were this). Serve holds the leader's SyncGroup answer
  here until the member's poll has given up, so the race is met every run. If this test
  fails after kafka-python changed, check whether it fixed the race; `know_topics` stays
  until then.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.protocol.apis import ApiKey
from tools.peers.group_member import know_topics, subscribe_knowing
from tools.peers.rejoin_race import PARTITIONS, InProcessServe, stranded
from tools.wait import wait_until

pytestmark = [pytest.mark.timeout(300)]

ALL = tuple(range(PARTITIONS))
HANG_S = 120.0


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[InProcessServe]:
    served = InProcessServe(tmp_path)
    try:
        yield served
    finally:
        served.close()


def member(serve: InProcessServe, group: str, **settings: Any) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=serve.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        metadata_max_age_ms=500,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=600,
        **settings,
    )


def poll_until(consumer: Any, what: str, done: Any) -> None:
    def polled() -> bool:
        consumer.poll(timeout_ms=200)
        return bool(done())

    wait_until(polled, timeout_s=HANG_S, interval_s=0, what=what)


def test_know_topics_sees_a_new_topic_and_subscribe_knowing_joins_once_with_all_of_it(
    serve,
) -> None:
    from kafka import ConsumerRebalanceListener

    topic = f"known-{uuid.uuid4().hex[:8]}"
    consumer = member(serve, "known")
    assigned: list[tuple[int, ...]] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, partitions: Any) -> None:
            assigned.append(tuple(sorted(tp.partition for tp in partitions)))

    try:
        serve.create_topic(topic)  # after the consumer has its first metadata
        know_topics(consumer, [topic])
        assert consumer.partitions_for_topic(topic) == set(ALL)
        subscribe_knowing(consumer, [topic], Listener())
        poll_until(consumer, "the member assigned", lambda: assigned)
        for _ in range(5):  # a rejoin would be on its way by now: its metadata is 500 ms old
            consumer.poll(timeout_ms=200)
        # One join, with every partition: nothing assigned first, and no rejoin.
        assert assigned == [ALL]
    finally:
        consumer.close(autocommit=False)


def test_know_topics_names_a_topic_that_never_comes(serve) -> None:
    consumer = member(serve, "unknown")
    try:
        with pytest.raises(TimeoutError, match="never-created"):
            know_topics(consumer, ["never-created"], timeout_s=1)
    finally:
        consumer.close(autocommit=False)


def test_kafka_python_strands_a_leader_whose_poll_gave_up_while_its_sync_was_answered(
    serve,
) -> None:
    from kafka.structs import MemberState

    topic = f"late-{uuid.uuid4().hex[:8]}"
    created, held, release = threading.Event(), threading.Event(), threading.Event()
    groups = serve.server.groups
    answer = groups.answer

    async def holding(request: Any, client_host: str) -> Any:
        """A SyncGroup once the topic exists (the rejoin's), answered but held until released."""
        response = await answer(request, client_host)
        if request.head.api_key == ApiKey.SYNC_GROUP and created.is_set():
            held.set()
            await asyncio.to_thread(release.wait, HANG_S)
        return response

    groups.answer = holding  # type: ignore[method-assign]
    consumer = member(serve, "stranded")
    try:
        consumer.subscribe([topic])  # no such topic yet: its first join assigns nothing
        coordinator = consumer._coordinator
        # Its record of the subscription's metadata, made before it joins (else a metadata
        # answer after the first join would make it rejoin before the topic exists).
        wait_until(
            lambda: coordinator._metadata_snapshot == {topic: set()},
            timeout_s=HANG_S,
            what="the subscription's metadata",
        )
        poll_until(consumer, "the first join", lambda: coordinator.state is MemberState.STABLE)
        assert consumer.assignment() == set()
        created.set()
        serve.create_topic(topic)  # the metadata changes: the leader rejoins
        poll_until(consumer, "the rejoin's SyncGroup answered", held.is_set)
        consumer.poll(timeout_ms=200)  # gives up while the answer is held
        release.set()
        wait_until(lambda: coordinator._join_task.is_done, timeout_s=HANG_S, what="the answer")
        for _ in range(5):
            consumer.poll(timeout_ms=200)
        # The answer came (every partition) and was never applied: no assignment, still
        # rebalancing, heartbeats off, no rejoin pending.
        assert stranded(consumer) == ALL
        assert consumer.assignment() == set()
        assert not coordinator._heartbeat_enabled
    finally:
        release.set()
        consumer.close(autocommit=False)
