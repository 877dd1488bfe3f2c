"""The mirror's deterministic simulation (tools/sim/mirror_run.py) in the suite: a few
hundred seeds keep exactly-once and order after every event, a seed replays exactly, the
seeds reach every fault, and planted defects -- progress saved before the destination
acknowledged; the destination's producer expiry ignored; a failed first save taken as
saved -- are found by suite seeds, as broken invariants (not as a crash of the planted
code)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import structlog

from replicad.mirror.partition_mirror import PartitionMirror, Progress, Send
from replicad.mirror.restamp import ProducerStamp
from tests.sim.seeded import (
    assert_found_as_invariant,
    assert_replays_exactly,
    assert_suite_seeds_pass,
    missing_events,
)
from tools.sim.mirror_run import WEIGHTS, run_seed, run_seeds

SUITE_SEEDS = range(300)
EVENTS = 120


@pytest.fixture(autouse=True)
def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def test_suite_seeds_keep_every_record_once_and_in_order() -> None:
    assert_suite_seeds_pass(run_seeds, SUITE_SEEDS, "mirror", events=EVENTS)


def test_a_seed_replays_exactly() -> None:
    assert_replays_exactly(run_seed, 7, longer_than=50, events=EVENTS)


def test_the_seeds_reach_every_fault() -> None:
    wanted = {
        *WEIGHTS,
        "new_session",
        "coalesced",
        "run_cut",
        "too_large",
        "unknown_producer_id",
        "first_save_failed",
    }
    assert missing_events(run_seed, range(40), wanted, events=EVENTS) == []


class ProgressAtSend(PartitionMirror):
    """The planted defect: progress moves when a batch is sent, not when the destination
    acknowledged it (a crash then skips what never arrived)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sent_to: tuple[int, int] | None = None

    def next_send(
        self, now_ms: int, stamp: ProducerStamp, wall_ms: int | None = None
    ) -> Send | None:
        send = super().next_send(now_ms, stamp, wall_ms)
        if send is not None:
            h = send.entry.header
            self._sent_to = (h.next_offset, send.expected_dest + h.record_count)
        return send

    def progress(self) -> Progress:
        saved = super().progress()
        if self._sent_to is None or self._sent_to[0] <= saved.position:
            return saved
        return Progress(self._sent_to[0], self._sent_to[1], saved.points)


def test_progress_saved_before_the_destination_acknowledged_is_found() -> None:
    failed, _ = run_seeds(
        SUITE_SEEDS, events=EVENTS, core_factory=ProgressAtSend, stop_at_first=True
    )
    assert_found_as_invariant(failed)


class IgnoresProducerExpiry(PartitionMirror):
    """The planted defect: every batch is judged fresh, so old records are pipelined and
    resent as if the destination always kept our producer's state (it forgets it by the
    timestamps of our last batch: a gap, or a resend written twice)."""

    def _old(self, timestamp_ms: int, wall_ms: int | None) -> bool:
        return False


def test_the_destinations_producer_expiry_ignored_is_found() -> None:
    failed, _ = run_seeds(
        SUITE_SEEDS, events=EVENTS, core_factory=IgnoresProducerExpiry, stop_at_first=True
    )
    assert_found_as_invariant(failed)


class FirstSaveFailureTakenAsSaved(PartitionMirror):
    """The planted defect: a failed first save counts as saved, so a new partition sends
    before its first progress is on disk (a crash then takes our records at the
    destination for what it held before, and sends them again)."""

    def first_save_failed(self, now_ms: int) -> None:
        self.first_progress_saved()


def test_a_failed_first_save_taken_as_saved_is_found() -> None:
    failed, _ = run_seeds(
        SUITE_SEEDS, events=EVENTS, core_factory=FirstSaveFailureTakenAsSaved, stop_at_first=True
    )
    assert_found_as_invariant(failed)
