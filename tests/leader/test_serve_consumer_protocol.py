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

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.leader.conftest import Served, served_numbered
from tests.leader.members import VerifiableMember, committed_to_the_end, shared_by, stopped_after
from tests.leader.test_serve_groups import CONSUMER_GROUPS, describe_rows
from tools.peers.kafka import run_kafka_class
from tools.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TOPIC = "kip848"
DEADLINE_S = 120


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("kip848")
    # Small polls, so a member stopping at --max-messages has not read everything.
    (work / "consumer.properties").write_text("max.poll.records=5\n")
    flags = ("--group-consumer-protocol", "--group-consumer-heartbeat-interval-ms", "500")
    with served_numbered(work, TOPIC, partitions=6, per_partition=40, flags=flags) as served:
        yield served


def test_java_consumers_of_the_consumer_protocol_share_a_topic_across_joins_and_leaves(
    served,
) -> None:
    group, partitions = "kip848-group", served.partitions
    config = served.work / "consumer.properties"

    def member(name: str, *args: str) -> VerifiableMember:
        return VerifiableMember(
            served, name, group, TOPIC, config, "--group-protocol", "consumer", *args
        )

    # a reads part of the topic alone, then leaves (closing: a heartbeat of epoch -1).
    a = member("a", "--max-messages", str(len(served.records) // 3))
    members = [a]
    with stopped_after(members):
        assert a.proc.wait(timeout=DEADLINE_S) == 0
        assert a.assigned() == frozenset() and a.consumed()
        # b and c join the group a left, and share the rest.
        b, c = member("b"), member("c")
        members += [b, c]
        wait_until(
            lambda: shared_by(partitions, b, c),
            timeout_s=DEADLINE_S,
            what="b and c sharing the partitions",
        )
        wait_until(
            lambda: set(a.consumed() + b.consumed() + c.consumed()) >= served.records,
            timeout_s=DEADLINE_S,
            what="every record read",
        )
        committed_to_the_end(served, TOPIC, group, DEADLINE_S)
        # One row per partition: committed offset, log end, lag, and the member holding it
        # (from ConsumerGroupDescribe): b and c, three partitions each.
        output = run_kafka_class(
            CONSUMER_GROUPS, "--bootstrap-server", served.bootstrap, "--describe", "--group", group
        ).stdout
        end = str(served.per_partition)
        assert describe_rows(output, TOPIC) == dict.fromkeys(partitions, (end, end, "0"))
        holders = Counter(
            cols[6] for line in output.splitlines() if (cols := line.split())[1:2] == [TOPIC]
        )
        assert sorted(holders.values()) == [len(partitions) // 2] * 2, output
        c.stop()  # leaves (its shutdown hook closes the consumer): b takes everything
        assert any(e.get("name") == "shutdown_complete" for e in c.events())
        wait_until(lambda: b.assigned() == partitions, timeout_s=DEADLINE_S, what="b owning all")
        every = Counter(a.consumed() + b.consumed() + c.consumed())
        assert set(every) == served.records
        assert [r for r, n in every.items() if n > 1] == []
        assert all(e["success"] for m in members for e in m.commits())
