"""The loop both group syncs run (groups/sync_rounds.py): failed rounds are named and tried
again, a bug of ours does not end the loop, a partial listing is said. The rounds here are
the test's own functions; the syncs' real rounds are tested against Kafka in
tests/mirror/test_group_sync_shell.py and tests/leader/test_source_group_sync.py."""

from __future__ import annotations

import asyncio
from typing import Any

from replicad.config.model import GroupsConfig
from replicad.errors import KafkaConnectionError
from replicad.groups.cluster_reader import GroupListing, ListedGroup
from replicad.groups.sync_rounds import SyncRounds


class Said:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))

    def exception(self, event: str, **fields: Any) -> None:
        self.lines.append(("exception", event, fields))


async def test_a_failed_round_is_named_said_once_and_tried_again_until_one_succeeds() -> None:
    said = Said()
    loop = SyncRounds(GroupsConfig(sync_interval_ms=1), said, "group sync")
    stop = asyncio.Event()
    problems: list[str | None] = []
    failures: list[str] = []
    outcomes: list[BaseException | None] = [
        KafkaConnectionError("no broker answers"),
        KafkaConnectionError("no broker answers"),
        ValueError("a bug"),
        None,
    ]

    async def round_() -> None:
        problems.append(loop.problem)  # as the previous round left it
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome is not None:
            raise outcome

    await asyncio.wait_for(loop.run(round_, stop, failures.append), timeout=60)
    assert problems == [
        None,
        "no broker answers",
        "no broker answers",
        "internal error: ValueError: a bug",
    ]
    assert loop.problem is None  # the last round succeeded
    assert failures == ["no broker answers"] * 2 + ["internal error: ValueError: a bug"]
    # The same failure twice within a minute is said once; a bug with its traceback.
    assert said.lines == [
        ("warning", "group sync: round failed; tried again", {"error": "no broker answers"}),
        ("exception", "group sync: round failed", {}),
    ]


class Listing:
    """A source whose broker 2 did not answer ListGroups (no real cluster can be made to
    drop one broker's answer on cue)."""

    async def list_groups(self) -> GroupListing:
        return GroupListing(
            (
                ListedGroup("app", "consumer"),
                ListedGroup("connect-x", "connect"),
                ListedGroup("spark", ""),
                ListedGroup("skip-me", "consumer"),
            ),
            {2: "coordinator_not_available"},
        )


async def test_the_chosen_groups_and_a_partial_listing_said() -> None:
    said = Said()
    loop = SyncRounds(GroupsConfig(exclude=("skip-.*",)), said, "group sync")
    listing, chosen = await loop.chosen(Listing())  # type: ignore[arg-type]
    assert not listing.complete
    # Consumer groups and groups that only commit; not Connect's, not the excluded.
    assert chosen == ["app", "spark"]
    assert said.lines == [
        (
            "warning",
            "source brokers did not list their groups; those groups wait",
            {"brokers": {2: "coordinator_not_available"}},
        )
    ]
