"""serve's group coordinator in its deterministic simulation (tools/sim/group_run.py): the
suite's seeds keep one owner per partition and generation and refuse every fenced member's
commit after every event, a seed replays exactly, the seeds reach every kind of event, and a
planted defect -- a commit taken from a member whose instance id another process took -- is
found by a suite seed."""

from __future__ import annotations

from typing import Any

from replicad.groups.classic_group import ClassicGroup
from replicad.groups.coordinator import GroupCoordinator, MemberRef
from tools.sim.group_run import WEIGHTS, run_seed, run_seeds

SUITE_SEEDS = range(200)
EVENTS = 200


def test_suite_seeds_keep_ownership_and_fencing() -> None:
    failed, seconds = run_seeds(SUITE_SEEDS, events=EVENTS)
    assert not failed, "\n".join(r.summary() for r in failed[:3])
    print(f"{len(SUITE_SEEDS)} group seeds in {seconds:.1f} s")


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(7, events=EVENTS), run_seed(7, events=EVENTS)
    assert first.ok and second.ok
    assert first.event_log == second.event_log and len(first.event_log) > 100
    assert run_seed(8, events=EVENTS).event_log != first.event_log


def test_the_seeds_reach_every_event_and_fence_members() -> None:
    counts: dict[str, int] = {}
    for seed in range(30):
        for kind, n in run_seed(seed, events=EVENTS).counts.items():
            counts[kind] = counts.get(kind, 0) + n
    wanted = set(WEIGHTS) | {"fenced", "commits"}
    assert wanted <= set(counts), sorted(wanted - set(counts))


class AcceptsFencedCommits(GroupCoordinator):
    """The planted defect: a commit with the group's generation is taken whoever sends it
    (no check of the member id or of the instance id's current holder)."""

    @staticmethod
    def _commit_error(group: ClassicGroup, generation_id: int, who: MemberRef) -> Any:
        if generation_id == group.generation_id:
            return None
        return GroupCoordinator._commit_error(group, generation_id, who)


def test_a_planted_defect_is_found_by_a_suite_seed() -> None:
    found = next(
        (
            result
            for seed in SUITE_SEEDS
            if not (
                result := run_seed(seed, events=EVENTS, coordinator_factory=AcceptsFencedCommits)
            ).ok
        ),
        None,
    )
    assert found is not None, "no suite seed finds a commit taken from a fenced member"
    assert "commit accepted from" in (found.error or ""), found.summary()
