"""tools/bench/mirror.py: the order of an A/B's runs, the table's load column, and how
the destination's progress is read (the bench itself needs MirrorMaker 2's jars and
minutes: it runs by hand)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tools.bench.measure import Measured
from tools.bench.mirror import (
    AS_STORED,
    ASK_TIMEOUT_S,
    MIRRORMAKER2,
    PROGRESS_EVERY_S,
    REPLACE_AFTER_S,
    REPLICAD,
    DestinationProgress,
    Run,
    Workload,
    planned,
    table,
)
from tools.peers.produce import produce_numbered
from tools.wait import wait_until


def test_an_ab_interleaves_the_checkouts_and_runs_mirrormaker_2_once_at_the_end() -> None:
    old = Path("/checkouts/old")
    runs = planned([REPLICAD, AS_STORED, MIRRORMAKER2], {"old": old}, repeat=2)
    once = [
        (REPLICAD, REPLICAD, None),
        (REPLICAD, f"{REPLICAD} [old]", old),
        (AS_STORED, AS_STORED, None),
        (AS_STORED, f"{AS_STORED} [old]", old),
    ]
    assert runs == [*once, *once, (MIRRORMAKER2, MIRRORMAKER2, None)]
    assert planned([REPLICAD], {}, repeat=1) == [(REPLICAD, REPLICAD, None)]


def test_each_row_says_the_load_it_ran_under_and_compares_with_the_peer_of_its_workload() -> None:
    tiny = Workload("tiny", "t", 1000, 6, True)
    ours = Run(f"{REPLICAD} [old]", tiny, Measured(2.0, 1.0, 50.0), load=7.25)
    peer = Run(MIRRORMAKER2, tiny, Measured(4.0, 8.0, 500.0), load=3.0)
    row = table([ours, peer]).splitlines()[2]
    assert f"| tiny | {REPLICAD} [old] | 500 |" in row
    assert "| 7.2 | 2.00x / - / 0.12 / - |" in row


def test_destination_progress_counts_the_destination_topics_records(
    kafka_broker: Any, unique_topic: Any
) -> None:
    """Against Kafka: no records while the topic does not exist (its asks fail), then the
    sum of its partitions' end offsets."""
    topic = unique_topic("progress")
    progress = DestinationProgress(kafka_broker.bootstrap, topic, 2)
    try:
        wait_until(lambda: progress.records() == 0 and progress.answers > 0, what="an answer")
        assert progress.failures > 0 and progress.last_error is not None
        kafka_broker.create_topic(topic, 2)
        produce_numbered(kafka_broker.bootstrap, topic, 2, 7)
        wait_until(lambda: progress.records() == 14, what="14 records")
    finally:
        progress.close()


class _Client:
    """A stand-in admin client (a stall of librdkafka's cannot be made on demand): its
    asks are never answered (`offset` None), fail (`offset` an exception) or answer
    `offset` for every partition."""

    def __init__(self, offset: Any) -> None:
        self.offset = offset
        self.asks = 0

    def list_offsets(self, wanted: dict[Any, Any], request_timeout: float) -> dict[Any, Any]:
        self.asks += 1
        futures = {}
        for tp in wanted:
            future: Future[Any] = Future()
            if isinstance(self.offset, Exception):
                future.set_exception(self.offset)
            elif self.offset is not None:
                future.set_result(SimpleNamespace(offset=self.offset))
            futures[tp] = future
        return futures


def test_destination_progress_replaces_a_client_that_stopped_answering() -> None:
    """An ask left unanswered past ASK_TIMEOUT_S, or asks failing for REPLACE_AFTER_S in a
    row, and the next ask is a new client's: a client stuck after the destination fenced
    itself no longer stalls the bench (the old progress asked the same consumer forever);
    failing asks make at most one new client every REPLACE_AFTER_S."""
    from confluent_kafka import KafkaError, KafkaException

    refused = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    clients = [_Client(None), _Client(refused), _Client(50)]
    made = iter(clients)
    now = [0.0]
    progress = DestinationProgress(
        "unused:9", "t", 3, admin=lambda: next(made), clock=lambda: now[0]
    )
    assert progress.records() == 0 and clients[0].asks == 1
    now[0] += ASK_TIMEOUT_S - 0.01
    assert progress.records() == 0 and clients[0].asks == 1  # still waiting for it
    now[0] += 0.01
    # Stuck: replaced, and the new client asked at once.
    assert progress.records() == 0 and (progress.clients, clients[1].asks) == (2, 1)
    refusals = 0
    while progress.clients == 2:
        now[0] += PROGRESS_EVERY_S
        assert progress.records() == 0
        refusals += 1
    # Refused for REPLACE_AFTER_S: replaced, and the third client asked at once.
    assert refusals == round(REPLACE_AFTER_S / PROGRESS_EVERY_S) == clients[1].asks
    assert clients[2].asks == 1
    now[0] += PROGRESS_EVERY_S
    assert progress.records() == 150
    assert progress.failures == 1 + refusals
