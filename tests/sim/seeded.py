"""What the seeded simulations' suite tests share (tests/sim/test_sim_*.py): the suite's
seeds pass, a seed replays exactly, the seeds reach every kind of event, and a planted
defect is found by a suite seed through a broken invariant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from tools.sim.seeds import SimResult

RunSeed = Callable[..., SimResult]
RunSeeds = Callable[..., tuple[list[SimResult], float]]


def assert_suite_seeds_pass(run_seeds: RunSeeds, seeds: range, what: str, **options: Any) -> None:
    failed, seconds = run_seeds(seeds, **options)
    assert not failed, "\n".join(r.summary() for r in failed[:3])
    print(f"{len(seeds)} {what} seeds in {seconds:.1f} s")


def assert_replays_exactly(run_seed: RunSeed, seed: int, *, longer_than: int, **options: Any):
    """`seed` run twice gives the same events (more than `longer_than`), the next another."""
    first, second = run_seed(seed, **options), run_seed(seed, **options)
    assert first.ok and second.ok
    assert first.event_log == second.event_log and len(first.event_log) > longer_than
    assert run_seed(seed + 1, **options).event_log != first.event_log


def missing_events(
    run_seed: RunSeed, seeds: Iterable[int], wanted: Iterable[str], **options: Any
) -> list[str]:
    """The kinds of `wanted` that none of `seeds` counted."""
    counts: Counter[str] = Counter()
    for seed in seeds:
        counts.update(run_seed(seed, **options).counts)
    return sorted(set(wanted) - set(counts))


def found_by(run_seed: RunSeed, seeds: Iterable[int], **options: Any) -> SimResult:
    """The first of `seeds` that fails: a planted defect must be found by one."""
    for seed in seeds:
        result = run_seed(seed, **options)
        if not result.ok:
            print(f"found by seed {result.seed}: {result.error}")
            return result
    raise AssertionError("the planted defect went unnoticed")


def planted_found(run_seeds: RunSeeds, seeds: Iterable[int], what: str, **options: Any) -> str:
    """The error of the first of `seeds` that fails with a defect planted (`what` names it
    in the printed line); AssertionError when none does."""
    failed, _ = run_seeds(seeds, stop_at_first=True, **options)
    assert failed, f"no suite seed found the planted defect ({what})"
    print(f"{what} found by seed {failed[0].seed}: {failed[0].error}")
    return failed[0].error or ""


def assert_found_as_invariant(failed: list[SimResult]) -> None:
    """A planted defect was found by a broken invariant, not by planted code that does not
    run (a signature the simulation does not call it with)."""
    assert failed, "the planted defect went unnoticed"
    error = failed[0].error or ""
    assert error.startswith("InvariantError"), error
    print(f"found by seed {failed[0].seed}: {error}")
