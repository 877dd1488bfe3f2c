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

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.leader.conftest import Served, served_numbered
from tests.leader.test_serve_groups import committed_offsets
from tools.peers import process
from tools.peers.kafka import kafka_tool_argv
from tools.wait import wait_until

pytestmark = [pytest.mark.timeout(300)]

TOPIC = "rebalanced"
PARTITIONS = 12
PER_PARTITION = 40
EVERYTHING = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
ALL = frozenset(range(PARTITIONS))
DEADLINE_S = 90
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    with served_numbered(
        tmp_path_factory.mktemp("rebalance"), TOPIC, PARTITIONS, PER_PARTITION
    ) as served:
        yield served


class Member:
    """One tools/peers/group_member.py process and what it said."""

    def __init__(self, served: Served, name: str, group: str, *args: str) -> None:
        self.name = name
        self.path = served.work / f"{group}-{name}.jsonl"
        self.log = served.work / f"{group}-{name}.log"
        self._out = open(self.path, "wb")  # noqa: SIM115 -- closed by stop()/kill()
        self.proc = process.spawn(
            [
                sys.executable, "-m", "tools.peers.group_member", "--bootstrap",
                served.bootstrap, "--topic", TOPIC, "--group", group,
                "--log", str(self.log), *args,
            ],
            # kafka-python's coordinator at DEBUG (each request sent and answered): what a
            # member stuck in a rebalance shows, printed when the test fails.
            env={**os.environ, "REPLICAD_GROUP_MEMBER_DEBUG": "1"},
            output=self._out,
        )  # fmt: skip

    def events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.path.read_text().splitlines():
            if line.startswith("{"):
                events.append(json.loads(line))
        return events

    def assignments(self) -> list[frozenset[int]]:
        return [frozenset(e["assigned"]) for e in self.events() if "assigned" in e]

    @property
    def assigned(self) -> frozenset[int]:
        """Its latest assignment, while it runs (nothing once it has exited)."""
        if self.proc.poll() is not None:
            return frozenset()
        every = self.assignments()
        return every[-1] if every else frozenset()

    def read(self) -> set[tuple[int, int]]:
        return {(p, o) for e in self.events() if "read" in e for p, o in e["read"]}

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if "error" in e]

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text() if self.log.exists() else ""
        return f"--- member {self.name}'s log, last {lines} lines ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )

    def kill(self) -> None:
        process.kill(self.proc)
        self._out.close()

    def stop(self) -> int:
        code = process.terminate(self.proc, timeout_s=30)
        self._out.close()
        return code


def shared_by(*members: Member) -> bool:
    """Whether `members` hold every partition between them, each some, none twice."""
    sets = [m.assigned for m in members]
    union = frozenset().union(*sets)
    return all(sets) and sum(len(s) for s in sets) == len(union) and union == ALL


def test_a_late_join_a_sigkilled_member_and_a_clean_leave_lose_no_record(served) -> None:
    group = "dynamic"
    slow = ("--per-record-ms", "40")  # so the group changes while records remain
    a, b = Member(served, "a", group, *slow), Member(served, "b", group, *slow)
    members = [a, b]
    try:
        wait_until(lambda: shared_by(a, b), timeout_s=DEADLINE_S, what="a and b sharing")
        c = Member(served, "c", group, *slow)  # joins late
        members.append(c)
        wait_until(lambda: shared_by(a, b, c), timeout_s=DEADLINE_S, what="a, b, c sharing")
        b.kill()  # no LeaveGroup: its partitions move once its session (6 s) times out
        wait_until(lambda: shared_by(a, c), timeout_s=DEADLINE_S, what="b's partitions moved")
        assert c.stop() == 0  # leaves cleanly: a takes everything
        wait_until(lambda: a.assigned == ALL, timeout_s=DEADLINE_S, what="a owning all")
        wait_until(
            lambda: set().union(*(m.read() for m in members)) >= EVERYTHING,
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
    except Exception:
        for member in members:
            print(member.log_tail())
        raise
    finally:
        for member in members:
            if member.proc.poll() is None:
                member.stop()


def test_a_static_member_restarts_without_a_rebalance_and_a_fenced_one_commits_nothing(
    served,
) -> None:
    group = "static"
    static = ("--instance-id", "static-1", "--session-timeout-ms", "30000", "--per-record-ms", "40")
    s = Member(served, "s", group, *static)
    d = Member(served, "d", group, "--per-record-ms", "40")
    members = [s, d]
    try:
        wait_until(lambda: shared_by(s, d), timeout_s=DEADLINE_S, what="s and d sharing")
        held, rebalances_seen_by_d = s.assigned, len(d.assignments())
        s.kill()
        again = Member(served, "s-again", group, *static)  # within its 30 s session
        members.append(again)
        wait_until(lambda: again.assigned, timeout_s=DEADLINE_S, what="s back")
        assert again.assigned == held
        # d goes on reading (so it would have seen a rebalance by now): none happened.
        reads = len([e for e in d.events() if "read" in e])
        wait_until(
            lambda: len([e for e in d.events() if "read" in e]) > reads or d.read() >= left_for(d),
            timeout_s=DEADLINE_S,
            what="d reading on",
        )
        assert len(d.assignments()) == rebalances_seen_by_d

        usurper = Member(served, "usurper", group, *static)  # takes static-1 from s-again
        members.append(usurper)
        wait_until(lambda: usurper.assigned, timeout_s=DEADLINE_S, what="the usurper assigned")
        wait_until(
            lambda: (
                any(e.get("while") == "commit" for e in again.errors())
                or again.proc.poll() is not None
            ),
            timeout_s=DEADLINE_S,
            what="s-again fenced",
        )
        refused = [e for e in again.errors() if e.get("while") == "commit"]
        assert refused and refused[-1]["error"] == "FencedInstanceIdError", again.errors()
    except Exception:
        for member in members:
            print(member.log_tail())
        raise
    finally:
        for member in members:
            if member.proc.poll() is None:
                member.stop()


def left_for(member: Member) -> set[tuple[int, int]]:
    """The records of `member`'s partitions (all of them read: nothing left to show)."""
    return {(p, o) for p in member.assigned for o in range(PER_PARTITION)}


@pytest.mark.kafka
def test_kafkas_verifiable_consumer_as_three_members_reads_every_record(served) -> None:
    group = "verifiable"
    outputs = [served.work / f"verifiable-{i}.jsonl" for i in range(3)]
    # Members that start one after another rebalance at each join; the others hear of it
    # at their next heartbeat (Java's default: every 3 s) -- every 0.5 s here.
    config = served.work / "verifiable.properties"
    config.write_text("heartbeat.interval.ms=500\n")
    files = [open(path, "wb") for path in outputs]  # noqa: SIM115 -- closed below
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for out in files:
            procs.append(
                process.spawn(
                    kafka_tool_argv(
                        VERIFIABLE_CONSUMER,
                        "--bootstrap-server", served.bootstrap, "--topic", TOPIC,
                        "--group-id", group, "--reset-policy", "earliest",
                        "--consumer.config", str(config),
                    ),
                    output=out,
                )
            )  # fmt: skip

        def events() -> list[list[dict[str, Any]]]:
            return [
                [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
                for path in outputs
            ]

        def consumed() -> set[tuple[int, int]]:
            return {
                (p["partition"], offset)
                for member in events()
                for e in member
                if e.get("name") == "records_consumed"
                for p in e["partitions"]
                for offset in range(p["minOffset"], p["maxOffset"] + 1)
            }

        def assigned() -> list[set[int]]:
            last: list[set[int]] = []
            for member in events():
                sets = [e for e in member if e.get("name") == "partitions_assigned"]
                last.append({p["partition"] for p in sets[-1]["partitions"]} if sets else set())
            return last

        wait_until(lambda: consumed() >= EVERYTHING, timeout_s=DEADLINE_S, what="every record")
        wait_until(
            lambda: all(assigned()) and sorted(p for s in assigned() for p in s) == sorted(ALL),
            timeout_s=DEADLINE_S,
            what="3 members sharing the 12 partitions",
        )
        commits = [e for member in events() for e in member if e.get("name") == "offsets_committed"]
        assert commits and all(e["success"] for e in commits), commits[-3:]
    finally:
        for proc in procs:
            process.terminate(proc, timeout_s=30)
        for out in files:
            out.close()
