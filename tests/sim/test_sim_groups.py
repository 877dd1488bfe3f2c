"""serve's group coordinator in its deterministic simulation (tools/sim/group_run.py): the
suite's seeds keep one owner per partition and generation and refuse every fenced member's
commit after every event, a seed replays exactly, the seeds reach every kind of event, and a
planted defect -- a commit taken from a member whose instance id another process took -- is
found by a suite seed."""

from __future__ import annotations

from typing import Any

from replicad.groups.classic_group import ClassicGroup
from replicad.groups.coordinator import GroupCoordinator, MemberRef
from tests.sim.seeded import (
    assert_replays_exactly,
    assert_suite_seeds_pass,
    found_by,
    missing_events,
)
from tools.sim.group_run import WEIGHTS, run_seed, run_seeds

SUITE_SEEDS = range(200)
EVENTS = 200


def test_suite_seeds_keep_ownership_and_fencing() -> None:
    assert_suite_seeds_pass(run_seeds, SUITE_SEEDS, "group", events=EVENTS)


def test_a_seed_replays_exactly() -> None:
    assert_replays_exactly(run_seed, 7, longer_than=100, events=EVENTS)


def test_the_seeds_reach_every_event_and_fence_members() -> None:
    wanted = {*WEIGHTS, "fenced", "commits"}
    assert missing_events(run_seed, range(30), wanted, events=EVENTS) == []


class AcceptsFencedCommits(GroupCoordinator):
    """The planted defect: a commit with the group's generation is taken whoever sends it
    (no check of the member id or of the instance id's current holder)."""

    @staticmethod
    def _commit_error(group: ClassicGroup, generation_id: int, who: MemberRef) -> Any:
        if generation_id == group.generation_id:
            return None
        return GroupCoordinator._commit_error(group, generation_id, who)


def test_a_planted_defect_is_found_by_a_suite_seed() -> None:
    found = found_by(run_seed, SUITE_SEEDS, events=EVENTS, coordinator_factory=AcceptsFencedCommits)
    assert "commit accepted from" in (found.error or ""), found.summary()
