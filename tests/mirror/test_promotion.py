"""When a promoted partition is done, how long a promotion waits for it, and what its
report says (promotion.py)."""

from __future__ import annotations

from replicad.mirror.promotion import (
    POLL_MS,
    PartitionFigures,
    PromotionWait,
    Verdict,
    not_done,
    partition_report,
    pending,
)
from replicad.types import TopicPartition

SRC = TopicPartition("orders", 0)
DST = TopicPartition("dr.orders", 0)


def figures(**changes: object) -> PartitionFigures:
    base = {
        "source": SRC,
        "destination": DST,
        "source_high_watermark": 100,
        "local_high_watermark": 100,
        "mirrored_offset": 100,
        "in_flight": False,
        "halted": None,
    }
    return PartitionFigures(**{**base, **changes})  # type: ignore[arg-type]


def test_done_when_replica_and_mirror_hold_the_source_high_watermark() -> None:
    assert not_done(figures()) is None
    assert "local replica at 90" in str(not_done(figures(local_high_watermark=90)))
    assert "mirrored to 95 of 100" in str(not_done(figures(mirrored_offset=95)))
    assert not_done(figures(in_flight=True)) is not None
    assert "has not reported" in str(not_done(figures(source_high_watermark=-1)))
    assert "halted: refused" in str(not_done(figures(halted="refused")))
    assert pending([figures(), figures(mirrored_offset=1)]) == {"orders-0": "mirrored to 1 of 100"}


def test_the_report_names_what_was_left_behind() -> None:
    report = partition_report(figures(local_high_watermark=90, mirrored_offset=80), 78)
    assert report["left_behind"] == 20
    assert report["destination_log_end"] == 78
    assert report["destination_topic"] == "dr.orders"


def test_a_promotion_looks_again_until_done_or_its_deadline() -> None:
    wait = PromotionWait(1_000, 350, force=False)
    look = wait.look([figures(mirrored_offset=90)], 1_000)
    assert look.verdict is Verdict.LOOK_AGAIN and look.wake_ms == 1_000 + POLL_MS
    assert look.waiting == {"orders-0": "mirrored to 90 of 100"}
    # The last look is at the deadline, not a poll past it.
    assert wait.look([figures(mirrored_offset=95)], 1_300).wake_ms == 1_350
    assert wait.look([figures()], 1_320).verdict is Verdict.PROMOTE
    timed_out = wait.look([figures(mirrored_offset=99)], 1_350)
    assert timed_out.verdict is Verdict.TIMED_OUT and timed_out.wake_ms is None
    assert "orders-0" in timed_out.waiting


def test_a_forced_promotion_does_not_wait_and_names_what_it_left_behind() -> None:
    look = PromotionWait(0, 60_000, force=True).look([figures(halted="refused")], 0)
    assert look.verdict is Verdict.PROMOTE and look.wake_ms is None
    assert look.waiting == {"orders-0": "mirror halted: refused"}
