"""Rebalancing on `replicad serve`, with members that are processes of their own
(tools/peers/group_member.py, kafka-python) so that one can be SIGKILLed: members share 12
partitions, one joins late, one is SIGKILLed (its partitions move once its session times
out), one leaves cleanly, and every record is read and committed; a static member
(group.instance.id) SIGKILLed and restarted within its session timeout gets its partitions
back with no rebalance for the others, and once a third process takes its instance id its
commits are refused (FENCED_INSTANCE_ID). Then Kafka's own VerifiableConsumer, three of
them, reads every record.

The replica (12 partitions of real producer batches written through the log store) is
served by one `replicad serve` subprocess for the module; no broker is needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.leader.conftest import Served, served_numbered
from tests.leader.members import (
    KafkaPythonMember,
    VerifiableMember,
    committed_to_the_end,
    shared_by,
    stopped_after,
)
from tools.wait import wait_until

pytestmark = [pytest.mark.timeout(300)]

TOPIC = "rebalanced"
DEADLINE_S = 90


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    with served_numbered(
        tmp_path_factory.mktemp("rebalance"), TOPIC, partitions=12, per_partition=40
    ) as served:
        yield served


def member(served: Served, group: str, name: str, *args: str) -> KafkaPythonMember:
    return KafkaPythonMember(served, name, group, TOPIC, *args)


def test_a_late_join_a_sigkilled_member_and_a_clean_leave_lose_no_record(served) -> None:
    group, partitions = "dynamic", served.partitions
    slow = ("--per-record-ms", "40")  # so the group changes while records remain
    a, b = member(served, group, "a", *slow), member(served, group, "b", *slow)
    members = [a, b]
    with stopped_after(members):
        wait_until(
            lambda: shared_by(partitions, a, b), timeout_s=DEADLINE_S, what="a and b sharing"
        )
        c = member(served, group, "c", *slow)  # joins late
        members.append(c)
        wait_until(
            lambda: shared_by(partitions, a, b, c), timeout_s=DEADLINE_S, what="a, b, c sharing"
        )
        b.kill()  # no LeaveGroup: its partitions move once its session (6 s) times out
        wait_until(
            lambda: shared_by(partitions, a, c), timeout_s=DEADLINE_S, what="b's partitions moved"
        )
        assert c.stop() == 0  # leaves cleanly: a takes everything
        wait_until(lambda: a.assigned() == partitions, timeout_s=DEADLINE_S, what="a owning all")
        wait_until(
            lambda: set().union(*(m.read() for m in members)) >= served.records,
            timeout_s=DEADLINE_S,
            what="every record read",
        )
        committed_to_the_end(served, TOPIC, group, DEADLINE_S)


def test_a_static_member_restarts_without_a_rebalance_and_a_fenced_one_commits_nothing(
    served,
) -> None:
    group, partitions = "static", served.partitions
    static = ("--instance-id", "static-1", "--session-timeout-ms", "30000", "--per-record-ms", "40")
    s = member(served, group, "s", *static)
    d = member(served, group, "d", "--per-record-ms", "40")
    members = [s, d]
    with stopped_after(members):
        wait_until(
            lambda: shared_by(partitions, s, d), timeout_s=DEADLINE_S, what="s and d sharing"
        )
        held, rebalances_seen_by_d = s.assigned(), len(d.assignments())
        s.kill()
        again = member(served, group, "s-again", *static)  # within its 30 s session
        members.append(again)
        wait_until(lambda: again.assigned(), timeout_s=DEADLINE_S, what="s back")
        assert again.assigned() == held
        # d goes on reading (so it would have seen a rebalance by now): none happened.
        reads = len([e for e in d.events() if "read" in e])
        wait_until(
            lambda: (
                len([e for e in d.events() if "read" in e]) > reads
                or d.read() >= left_for(served, d)
            ),
            timeout_s=DEADLINE_S,
            what="d reading on",
        )
        assert len(d.assignments()) == rebalances_seen_by_d

        usurper = member(served, group, "usurper", *static)  # takes static-1 from s-again
        members.append(usurper)
        wait_until(lambda: usurper.assigned(), timeout_s=DEADLINE_S, what="the usurper assigned")
        wait_until(
            lambda: any(e.get("while") == "commit" for e in again.errors()) or not again.running(),
            timeout_s=DEADLINE_S,
            what="s-again fenced",
        )
        refused = [e for e in again.errors() if e.get("while") == "commit"]
        assert refused and refused[-1]["error"] == "FencedInstanceIdError", again.errors()


def left_for(served: Served, member: KafkaPythonMember) -> set[tuple[int, int]]:
    """The records of `member`'s partitions (all of them read: nothing left to show)."""
    held = member.assigned()
    return {(p, o) for p, o in served.records if p in held}


@pytest.mark.kafka
def test_kafkas_verifiable_consumer_as_three_members_reads_every_record(served) -> None:
    group = "verifiable"
    # Members that start one after another rebalance at each join; the others hear of it
    # at their next heartbeat (Java's default: every 3 s) -- every 0.5 s here.
    config = served.work / "verifiable.properties"
    config.write_text("heartbeat.interval.ms=500\n")
    members = [VerifiableMember(served, f"{i}", group, TOPIC, config) for i in range(3)]
    with stopped_after(members):
        wait_until(
            lambda: set().union(*(m.consumed() for m in members)) >= served.records,
            timeout_s=DEADLINE_S,
            what="every record",
        )
        wait_until(
            lambda: shared_by(served.partitions, *members),
            timeout_s=DEADLINE_S,
            what="3 members sharing the 12 partitions",
        )
        commits = [e for m in members for e in m.commits()]
        assert commits and all(e["success"] for e in commits), commits[-3:]
