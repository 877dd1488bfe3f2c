"""The consumer group protocol (KIP-848) on `replicad serve`, with Kafka's own Java client:
VerifiableConsumer processes with `--group-protocol consumer` read a topic from serve as a
group while members join and leave, every record read once (a record read twice would be
an offset committed wrong, or a partition held by two members); `kafka-consumer-groups
--describe` shows the group (through ConsumerGroupDescribe) and its lag.

The replica is written through the log store (no broker); one `replicad serve` subprocess
with `--group-consumer-protocol` (the default) serves the module. A serve without it does not
advertise the new APIs, so the same Java consumer is refused by its own client.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.leader.conftest import Served, served_numbered
from tests.leader.test_serve_groups import CONSUMER_GROUPS, committed_offsets, describe_rows
from tools.peers import process
from tools.peers.kafka import kafka_tool_argv, run_kafka_class
from tools.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TOPIC = "kip848"
PARTITIONS = 6
PER_PARTITION = 40
EVERYTHING = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
ALL = frozenset(range(PARTITIONS))
DEADLINE_S = 120
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("kip848")
    # Small polls, so a member stopping at --max-messages has not read everything.
    (work / "consumer.properties").write_text("max.poll.records=5\n")
    flags = ("--group-consumer-protocol", "--group-consumer-heartbeat-interval-ms", "500")
    with served_numbered(work, TOPIC, PARTITIONS, PER_PARTITION, flags) as served:
        yield served


class Verifiable:
    """One VerifiableConsumer process of the consumer protocol and its JSON events."""

    def __init__(self, served: Served, name: str, group: str, *args: str) -> None:
        self.path = served.work / f"{group}-{name}.jsonl"
        self._out = open(self.path, "wb")  # noqa: SIM115 -- closed by stop()
        self.proc = process.spawn(
            kafka_tool_argv(
                VERIFIABLE_CONSUMER,
                "--bootstrap-server", served.bootstrap, "--topic", TOPIC,
                "--group-id", group, "--group-protocol", "consumer",
                "--reset-policy", "earliest",
                "--consumer.config", str(served.work / "consumer.properties"), *args,
            ),
            output=self._out,
        )  # fmt: skip

    def events(self) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def consumed(self) -> list[tuple[int, int]]:
        return [
            (p["partition"], offset)
            for e in self.events()
            if e.get("name") == "records_consumed"
            for p in e["partitions"]
            for offset in range(p["minOffset"], p["maxOffset"] + 1)
        ]

    def assigned(self) -> frozenset[int]:
        """What it holds by its events: assigned less revoked since (KIP-848 assigns and
        revokes incrementally)."""
        held: set[int] = set()
        for e in self.events():
            parts = {p["partition"] for p in e.get("partitions", ())}
            if e.get("name") == "partitions_assigned":
                held |= parts
            elif e.get("name") in ("partitions_revoked", "partitions_lost"):
                held -= parts
        return frozenset(held)

    def commits_failed(self) -> list[dict[str, Any]]:
        commits = [e for e in self.events() if e.get("name") == "offsets_committed"]
        return [e for e in commits if not e["success"]]

    def stop(self) -> int:
        code = process.terminate(self.proc, timeout_s=30)
        self._out.close()
        return code


def test_java_consumers_of_the_consumer_protocol_share_a_topic_across_joins_and_leaves(
    served,
) -> None:
    group = "kip848-group"
    # a reads part of the topic alone, then leaves (closing: a heartbeat of epoch -1).
    a = Verifiable(served, "a", group, "--max-messages", str(len(EVERYTHING) // 3))
    members = [a]
    try:
        assert a.proc.wait(timeout=DEADLINE_S) == 0
        assert a.assigned() == frozenset() and a.consumed()
        # b and c join the group a left, and share the rest.
        b, c = Verifiable(served, "b", group), Verifiable(served, "c", group)
        members += [b, c]

        def shared() -> bool:
            held = (b.assigned(), c.assigned())
            return all(held) and not held[0] & held[1] and held[0] | held[1] == ALL

        wait_until(shared, timeout_s=DEADLINE_S, what="b and c sharing the partitions")
        wait_until(
            lambda: set(a.consumed() + b.consumed() + c.consumed()) >= EVERYTHING,
            timeout_s=DEADLINE_S,
            what="every record read",
        )
        wait_until(
            lambda: (
                committed_offsets(served.bootstrap, TOPIC, group)
                == dict.fromkeys(range(PARTITIONS), PER_PARTITION)
            ),
            timeout_s=DEADLINE_S,
            what="every partition committed to its end",
        )
        # One row per partition: committed offset, log end, lag, and the member holding it
        # (from ConsumerGroupDescribe): b and c, three partitions each.
        output = run_kafka_class(
            CONSUMER_GROUPS, "--bootstrap-server", served.bootstrap, "--describe", "--group", group
        ).stdout
        end = str(PER_PARTITION)
        assert describe_rows(output, TOPIC) == dict.fromkeys(range(PARTITIONS), (end, end, "0"))
        holders = Counter(
            cols[6] for line in output.splitlines() if (cols := line.split())[1:2] == [TOPIC]
        )
        assert sorted(holders.values()) == [PARTITIONS // 2] * 2, output
        c.stop()  # leaves (its shutdown hook closes the consumer): b takes everything
        assert any(e.get("name") == "shutdown_complete" for e in c.events())
        wait_until(lambda: b.assigned() == ALL, timeout_s=DEADLINE_S, what="b owning all")
        every = Counter(a.consumed() + b.consumed() + c.consumed())
        assert set(every) == EVERYTHING
        assert [r for r, n in every.items() if n > 1] == []
        assert not any(m.commits_failed() for m in members)
    finally:
        for member in members:
            if member.proc.poll() is None:
                member.stop()
