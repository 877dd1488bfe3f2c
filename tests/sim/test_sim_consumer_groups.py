"""serve's consumer group protocol (KIP-848) in its deterministic simulation
(tools/sim/consumer_group_run.py): the suite's seeds keep every partition with one member
and refuse every stale or removed member's commit after every event, a seed replays exactly,
the seeds reach every kind of event, and a planted defect -- a partition given before its
owner revoked it -- is found by a suite seed."""

from __future__ import annotations

import pytest

from replicad.groups.consumer_group import ConsumerGroup
from tests.sim.seeded import (
    assert_replays_exactly,
    assert_suite_seeds_pass,
    found_by,
    missing_events,
)
from tools.sim.consumer_group_run import WEIGHTS, run_seed, run_seeds

SUITE_SEEDS = range(100)
EVENTS = 200


def test_suite_seeds_keep_one_owner_per_partition_and_refuse_stale_commits() -> None:
    assert_suite_seeds_pass(run_seeds, SUITE_SEEDS, "consumer group", events=EVENTS)


def test_a_seed_replays_exactly() -> None:
    assert_replays_exactly(run_seed, 7, longer_than=100, events=EVENTS)


def test_the_seeds_reach_every_event_and_fence_members() -> None:
    wanted = {*WEIGHTS, "fenced", "commits"}
    assert missing_events(run_seed, range(30), wanted, events=EVENTS) == []


def test_a_planted_defect_is_found_by_a_suite_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Assign before revoke: a partition another member still holds counts as free.
    monkeypatch.setattr(ConsumerGroup, "held_by_others", lambda _self, _member_id: frozenset())
    found = found_by(run_seed, SUITE_SEEDS, events=EVENTS)
    assert "held by" in (found.error or ""), found.summary()
