"""docs/reliability.md rendering, from fabricated results (the runs are the scenario tests)."""

from __future__ import annotations

from tests.faults.soak_results import made_up_soak
from tools.chaos.follower import DaemonCounters
from tools.chaos.fuzz import FuzzRun
from tools.chaos.report import TESTS, Meta, render
from tools.chaos.scenarios import SCENARIOS, ScenarioResult
from tools.chaos.soak import FdCounts, SoakResult, SoakSample

META = Meta("python -m tools.chaos.report", "ci", "4.3.1", "2026-01-01", "2 cores", 300.0)


def result(name: str, **changes: object) -> ScenarioResult:
    values: dict[str, object] = dict(
        name=name,
        title=f"{name} title",
        size="ci",
        runs=1,
        faults={"cut": 2, "stall": 1},
        records_checked=12345,
        lost=0,
        duplicated=0,
        recovery_s=(0.5, 1.5, 2.5),
        counters=DaemonCounters(crc_failures=3, errors=7),
        daemon="ran to the end, stopped cleanly",
        problems=(),
        known_issues=(),
        notes=("a note",),
        elapsed_s=40.0,
    )
    values.update(changes)
    return ScenarioResult(**values)  # type: ignore[arg-type]


def soak_result() -> SoakResult:
    samples = [
        SoakSample(float(i), 50_000, 30_000, 2, FdCounts(5, i, 4), None, i * 10) for i in range(20)
    ]
    return made_up_soak(
        samples,
        duration_s=120,
        faults={"cut": 4},
        records_checked=999,
        notes=("asyncio task count: missing",),
    )


def test_one_table_row_per_scenario_with_its_figures() -> None:
    text = render(
        [result("network"), result("corrupt", recovery_s=())],
        None,
        [FuzzRun("config", "mutation", 10, 5000, 0, 0)],
        META,
    )
    rows = [line for line in text.splitlines() if line.startswith("| network")]
    assert rows == [
        "| network: network title | 1 | 3 (cut 2, stall 1) | 12,345 | 0 / 0 "
        "| 1.5 s median, 2.5 s max | ok | `tests/faults/test_scenarios.py::test_network_faults` |"
    ]
    assert "| corrupt: corrupt title | 1 | 3 (cut 2, stall 1) | 12,345 | 0 / 0 | n/a | ok" in text
    assert "| config | mutation | 10 | 5,000 | 0 | 0 |" in text
    assert "Produced by `python -m tools.chaos.report`" in text


def test_failures_and_known_bugs_are_shown_not_hidden() -> None:
    text = render(
        [
            result("disk-full", known_issues=("checkpoint-enospc: it dies",)),
            result("slow-disk", problems=("run 1: invariant: 3 records missing",), lost=3),
        ],
        soak_result(),
        [],
        META,
    )
    assert "| 0 / 0 | 1.5 s median, 2.5 s max | known bug |" in text
    assert "| 3 / 0 | 1.5 s median, 2.5 s max | **FAILED** |" in text
    assert "- known daemon bug: checkpoint-enospc: it dies" in text
    assert "- problem: run 1: invariant: 3 records missing" in text
    assert "| anon_kb | 30000 | 30000 | +24576 | yes |" in text
    assert "| data_fds |" in text and "reported" in text
    assert "asyncio task count: missing" in text
    assert "## Daemon bugs found here and fixed" in text
    assert "## The event loop during a checkpoint" in text


def test_every_scenario_names_its_ci_test() -> None:
    assert {s.name for s in SCENARIOS} <= set(TESTS)
