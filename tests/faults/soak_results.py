"""A made-up soak result, for the tests of what renders or judges one: tools/chaos/soak.py's
table row and verdict, tools/chaos/report.py's page. One place to follow SoakResult."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tools.chaos.follower import DaemonCounters
from tools.chaos.soak import SoakResult, SoakSample, trends


def made_up_soak(samples: Sequence[SoakSample], **fields: Any) -> SoakResult:
    """A half-hour soak that took `samples` (and their trends), lost and duplicated
    nothing and found no problem, `fields` on top."""
    made: dict[str, Any] = dict(
        duration_s=1800,
        faults={},
        samples=tuple(samples),
        trends=trends(list(samples)),
        records_checked=10,
        lost=0,
        duplicated=0,
        counters=DaemonCounters(),
        problems=(),
    )
    return SoakResult(**{**made, **fields})
