"""What the simulations share, the follower's (run.py, `python -m tools.sim`), the mirror's
(mirror_run.py), the group coordinator's (group_run.py, consumer_group_run.py) and the log
store's (log_run.py): a seed's
result and how it is reported, running seeds one after the other, where their logs are
written, the command line that replays one seed or runs many (`seed_main`), and the loop
of a simulation stepped one event at a time (`stepped`).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

# The log store's fsyncs cost most of a seed's time on a disk; the simulation decides
# itself what a crash loses (recovery points), so memory-backed files change nothing.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@dataclass
class SimResult:
    seed: int
    events: int
    ok: bool
    error: str | None = None
    event_log: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # How to replay the seed ({seed} filled in), and how many of its last events to show.
    replay: str = "python -m tools.sim --seed {seed}"
    tail: int = 12

    def summary(self) -> str:
        if self.ok:
            return f"seed {self.seed}: ok ({self.events} events)"
        tail = "\n  ".join(self.event_log[-self.tail :])
        return (
            f"seed {self.seed}: FAILED after {self.events} events: {self.error}\n"
            f"  last events:\n  {tail}\n  replay: {self.replay.format(seed=self.seed)}"
        )


def run_seeds(
    run_seed: Callable[..., SimResult],
    seeds: Iterable[int],
    *,
    stop_at_first: bool = False,
    **options: Any,
) -> tuple[list[SimResult], float]:
    """The failed seeds, and how long the run took: `run_seed(seed, **options)` each."""
    started = time.perf_counter()
    failed = []
    for seed in seeds:
        result = run_seed(seed, **options)
        if not result.ok:
            failed.append(result)
            if stop_at_first:
                break
    return failed, time.perf_counter() - started


def seed_arguments(parser: argparse.ArgumentParser, *, events: int) -> None:
    """--seed N (replay one) or --seeds N [--first S], --events E, -v."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one seed")
    which.add_argument("--seeds", type=int, help="run this many seeds")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--events", type=int, default=events, help="events per seed")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every event")


def quiet_logs() -> None:
    """The daemon's own logs would drown the report (and cost time): errors only."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def report_one(result: SimResult, *, verbose: bool) -> int:
    """One replayed seed: its events when asked, its summary; the exit status."""
    if verbose:
        print("\n".join(result.event_log))
    print(result.summary())
    return 0 if result.ok else 1


class InvariantError(AssertionError):
    """A rule of the system under simulation was broken (not a crash of the simulation)."""


class Stepped(Protocol):
    """A simulation that runs one event at a time and checks its rules after each."""

    log: list[str]
    counts: Any  # a Counter of what happened

    def event(self) -> None: ...

    def check(self) -> None: ...


def stepped(seed: int, sim: Stepped, *, events: int, replay: str) -> SimResult:
    """Run `events` events of `sim`, checking after each: the seed's result, a failure
    with its trace unless it is an `InvariantError` (a rule broken: its message says it)."""
    done = 0
    try:
        for done in range(1, events + 1):  # noqa: B007 -- read after the loop
            sim.event()
            sim.check()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, InvariantError):
            error += "\n" + traceback.format_exc()
        return SimResult(seed, done, False, error, sim.log, dict(sim.counts), replay=replay)
    return SimResult(seed, done, True, None, sim.log, dict(sim.counts))


def seed_main(
    prog: str,
    doc: str | None,
    run_seed: Callable[..., SimResult],
    *,
    events: int,
    argv: list[str] | None = None,
) -> int:
    """`prog --seed N` replays one seed (its events with -v); `prog --seeds N [--first S]`
    runs many and prints the failed ones. The exit status: 1 if any failed."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    seed_arguments(parser, events=events)
    args = parser.parse_args(argv)
    quiet_logs()
    if args.seed is not None:
        return report_one(run_seed(args.seed, events=args.events), verbose=args.verbose)
    seed_range = range(args.first, args.first + args.seeds)
    failed, seconds = run_seeds(run_seed, seed_range, events=args.events)
    for result in failed:
        print(result.summary())
    print(
        f"{len(seed_range)} seeds, {args.events} events each: {len(failed)} failed, {seconds:.1f} s"
    )
    return 1 if failed else 0
