"""Consumer-group members that are processes of their own, for the group tests against a
`replicad serve` process (tests/leader/conftest.py's `served_numbered`): a member can be
SIGKILLed, stopped (SIGTERM: it closes its consumer, so a dynamic member leaves its group)
or waited on, and it says what happened as JSON objects, one a line, on its output.

- `MemberProcess`: the process, its output file and its events; what both kinds share.
- `KafkaPythonMember`: tools/peers/group_member.py (kafka-python, subscribed through
  `subscribe_knowing`).
- `VerifiableMember`: Kafka's own VerifiableConsumer (Java), of the classic protocol or,
  with `--group-protocol consumer`, of KIP-848's, with the test's `--consumer.config`.
- `shared_by(partitions, *members)`: whether the members hold `partitions` between them.
- `stopped_after(members)`: stops the members still running when a test's block ends, and
  prints what each said first when the block failed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.leader.conftest import Served
from tests.leader.test_serve_groups import committed_offsets
from tools.peers import process
from tools.peers.kafka import kafka_tool_argv
from tools.wait import wait_until

VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
STOP_TIMEOUT_S = 30


class MemberProcess:
    """One member process of group `group`; its output is `<work>/<group>-<name>.jsonl`."""

    def __init__(
        self,
        served: Served,
        name: str,
        group: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.path = served.work / f"{group}-{name}.jsonl"
        # Where the member's client logs: its output, unless a kind says otherwise.
        self.log = self.path
        self._out = open(self.path, "wb")  # noqa: SIM115 -- closed by stop()/kill()
        self.proc = process.spawn(argv, env=env, output=self._out)

    def events(self) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text() if self.log.exists() else ""
        return f"--- member {self.name}'s log, last {lines} lines ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )

    def kill(self) -> None:
        process.kill(self.proc)
        self._out.close()

    def stop(self) -> int:
        code = process.terminate(self.proc, timeout_s=STOP_TIMEOUT_S)
        self._out.close()
        return code


class KafkaPythonMember(MemberProcess):
    """tools/peers/group_member.py: `args` are its flags (--instance-id, --per-record-ms, ...)."""

    def __init__(self, served: Served, name: str, group: str, topic: str, *args: str) -> None:
        log = served.work / f"{group}-{name}.log"
        super().__init__(
            served,
            name,
            group,
            [
                sys.executable, "-m", "tools.peers.group_member", "--bootstrap",
                served.bootstrap, "--topic", topic, "--group", group, "--log", str(log), *args,
            ],
            # kafka-python's coordinator at DEBUG (each request sent and answered): what a
            # member stuck in a rebalance shows, printed when the test fails.
            env={**os.environ, "REPLICAD_GROUP_MEMBER_DEBUG": "1"},
        )  # fmt: skip
        self.log = log

    def assignments(self) -> list[frozenset[int]]:
        return [frozenset(e["assigned"]) for e in self.events() if "assigned" in e]

    def assigned(self) -> frozenset[int]:
        """Its latest assignment, while it runs (nothing once it has exited)."""
        if not self.running():
            return frozenset()
        every = self.assignments()
        return every[-1] if every else frozenset()

    def read(self) -> set[tuple[int, int]]:
        return {(p, o) for e in self.events() if "read" in e for p, o in e["read"]}

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if "error" in e]


class VerifiableMember(MemberProcess):
    """Kafka's VerifiableConsumer reading `topic` from its start, configured by the
    properties file `consumer_config`; `args` are its further flags (--group-protocol,
    --max-messages, ...)."""

    def __init__(
        self,
        served: Served,
        name: str,
        group: str,
        topic: str,
        consumer_config: Path,
        *args: str,
    ) -> None:
        super().__init__(
            served,
            name,
            group,
            kafka_tool_argv(
                VERIFIABLE_CONSUMER,
                "--bootstrap-server", served.bootstrap, "--topic", topic, "--group-id", group,
                "--reset-policy", "earliest", "--consumer.config", str(consumer_config), *args,
            ),
        )  # fmt: skip

    def consumed(self) -> list[tuple[int, int]]:
        return [
            (p["partition"], offset)
            for e in self.events()
            if e.get("name") == "records_consumed"
            for p in e["partitions"]
            for offset in range(p["minOffset"], p["maxOffset"] + 1)
        ]

    def assigned(self) -> frozenset[int]:
        """What it holds by its events: assigned less revoked since. KIP-848 assigns and
        revokes incrementally; the classic protocol's eager assignors revoke everything
        before each new assignment, which this reads the same way."""
        held: set[int] = set()
        for e in self.events():
            parts = {p["partition"] for p in e.get("partitions", ())}
            if e.get("name") == "partitions_assigned":
                held |= parts
            elif e.get("name") in ("partitions_revoked", "partitions_lost"):
                held -= parts
        return frozenset(held)

    def commits(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("name") == "offsets_committed"]


def shared_by(partitions: frozenset[int], *members: KafkaPythonMember | VerifiableMember) -> bool:
    """Whether `members` hold every one of `partitions` between them, each some, none twice."""
    sets = [m.assigned() for m in members]
    union = frozenset().union(*sets)
    return all(sets) and sum(len(s) for s in sets) == len(union) and union == partitions


@contextmanager
def stopped_after(members: list[MemberProcess]) -> Iterator[None]:
    """Stops (SIGTERM) every one of `members` still running when the block ends, members
    the block appends included; a block that fails prints each member's log tail first."""
    try:
        yield
    except Exception:
        for member in members:
            print(member.log_tail())
        raise
    finally:
        for member in members:
            if member.running():
                member.stop()


def committed_to_the_end(served: Served, topic: str, group: str, deadline_s: float) -> None:
    """Waits until `group` has committed each partition of `topic` at its log end: a group
    that read everything and committed what it read."""
    wait_until(
        lambda: committed_offsets(served.bootstrap, topic, group) == served.ends,
        timeout_s=deadline_s,
        what="every partition committed to its end",
    )
