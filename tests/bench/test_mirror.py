"""tools/bench/mirror.py: the order of an A/B's runs and the table's load column (the
bench itself needs MirrorMaker 2's jars and minutes: it runs by hand)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.measure import Measured
from tools.bench.mirror import AS_STORED, MIRRORMAKER2, REPLICAD, Run, Workload, planned, table


def test_an_ab_interleaves_the_checkouts_and_runs_mirrormaker_2_once_at_the_end() -> None:
    old = Path("/checkouts/old")
    runs = planned([REPLICAD, AS_STORED, MIRRORMAKER2], {"old": old}, repeat=2)
    once = [
        (REPLICAD, REPLICAD, None),
        (REPLICAD, f"{REPLICAD} [old]", old),
        (AS_STORED, AS_STORED, None),
        (AS_STORED, f"{AS_STORED} [old]", old),
    ]
    assert runs == [*once, *once, (MIRRORMAKER2, MIRRORMAKER2, None)]
    assert planned([REPLICAD], {}, repeat=1) == [(REPLICAD, REPLICAD, None)]


def test_each_row_says_the_load_it_ran_under_and_compares_with_the_peer_of_its_workload() -> None:
    tiny = Workload("tiny", "t", 1000, 6, True)
    ours = Run(f"{REPLICAD} [old]", tiny, Measured(2.0, 1.0, 50.0), load=7.25)
    peer = Run(MIRRORMAKER2, tiny, Measured(4.0, 8.0, 500.0), load=3.0)
    row = table([ours, peer]).splitlines()[2]
    assert f"| tiny | {REPLICAD} [old] | 500 |" in row
    assert "| 7.2 | 2.00x / - / 0.12 / - |" in row
