"""serve's consumer group protocol (KIP-848) in its deterministic simulation
(tools/sim/consumer_group_run.py): the suite's seeds keep every partition with one member
and refuse every stale or removed member's commit after every event, a seed replays exactly,
the seeds reach every kind of event, and a planted defect -- a partition given before its
owner revoked it -- is found by a suite seed."""

from __future__ import annotations

import pytest

from replicad.groups.consumer_group import ConsumerGroup
from tools.sim.consumer_group_run import WEIGHTS, run_seed, run_seeds

SUITE_SEEDS = range(100)
EVENTS = 200


def test_suite_seeds_keep_one_owner_per_partition_and_refuse_stale_commits() -> None:
    failed, seconds = run_seeds(SUITE_SEEDS, events=EVENTS)
    assert not failed, "\n".join(r.summary() for r in failed[:3])
    print(f"{len(SUITE_SEEDS)} consumer group seeds in {seconds:.1f} s")


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


def test_a_planted_defect_is_found_by_a_suite_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Assign before revoke: a partition another member still holds counts as free.
    monkeypatch.setattr(ConsumerGroup, "held_by_others", lambda _self, _member_id: frozenset())
    found = next((r for seed in SUITE_SEEDS if not (r := run_seed(seed, events=EVENTS)).ok), None)
    assert found is not None, "no suite seed finds an assignment made before the revocation"
    assert "held by" in (found.error or ""), found.summary()
