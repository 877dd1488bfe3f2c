"""What the simulations share, the follower's (run.py, `python -m tools.sim`), the mirror's
(mirror_run.py), the group coordinator's (group_run.py, consumer_group_run.py) and the log
store's (log_run.py): a seed's
result and how it is reported, running seeds one after the other, where their logs are
written, the command line that replays one seed or runs many (`seed_main`: in W processes
with --workers, a progress line every K seeds with --progress), and the loop of a
simulation stepped one event at a time (`stepped`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import multiprocessing
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
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


@dataclass(frozen=True)
class SteppedSeeds:
    """`run_seed` of a stepped simulation: `make(seed, **options)` run for `events` events
    (by default) and replayed with `replay`; `main` its command line (`seed_main`). A class,
    not a closure: --workers sends it to forked processes."""

    make: Callable[..., Stepped]
    prog: str  # python -m ...
    doc: str | None
    events: int

    def __call__(self, seed: int, *, events: int | None = None, **options: Any) -> SimResult:
        replay = f"{self.prog} --seed {{seed}}"
        sim = self.make(seed, **options)
        return stepped(seed, sim, events=self.events if events is None else events, replay=replay)

    def run_seeds(self, seeds: Iterable[int], **options: Any) -> tuple[list[SimResult], float]:
        return run_seeds(self, seeds, **options)

    def main(self, argv: list[str] | None = None) -> int:
        return seed_main(self.prog, self.doc, self, events=self.events, argv=argv)


def _run_one(run_seed: Callable[..., SimResult], events: int, seed: int) -> SimResult:
    result = run_seed(seed, events=events)
    if result.ok:
        result.event_log = []  # not needed, and costly to send back from a worker
    return result


def _results(
    run_seed: Callable[..., SimResult], seeds: range, events: int, workers: int
) -> Iterator[SimResult]:
    """Each seed's result: in this process, or in `workers` forked ones (each seed is
    independent: the same results, in another order)."""
    one = functools.partial(_run_one, run_seed, events)
    if workers <= 1:
        yield from map(one, seeds)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(one, seeds, chunksize=20)


def seed_main(
    prog: str,
    doc: str | None,
    run_seed: Callable[..., SimResult],
    *,
    events: int,
    argv: list[str] | None = None,
) -> int:
    """`prog --seed N` replays one seed (its events with -v); `prog --seeds N [--first S]
    [--workers W] [--progress K]` runs many, printing each failed one as it fails, then
    what the seeds did and a summary. The exit status: 1 if any failed."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    seed_arguments(parser, events=events)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="W",
        help=f"processes for --seeds (this machine has {os.cpu_count()} CPUs)",
    )
    parser.add_argument(
        "--progress", type=int, default=0, metavar="K", help="a progress line every K seeds"
    )
    args = parser.parse_args(argv)
    quiet_logs()
    if args.seed is not None:
        return report_one(run_seed(args.seed, events=args.events), verbose=args.verbose)
    started = time.perf_counter()
    failed = 0
    counts: Counter[str] = Counter()
    seeds = range(args.first, args.first + args.seeds)
    for done, result in enumerate(_results(run_seed, seeds, args.events, args.workers), start=1):
        counts.update(result.counts)
        if not result.ok:
            failed += 1
            print(result.summary(), flush=True)
        if args.progress and done % args.progress == 0:
            rate = done / (time.perf_counter() - started)
            print(f"... {done} seeds, {failed} failed, {rate:.1f} seeds/s", flush=True)
    print("what the seeds did:", ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    took = time.perf_counter() - started
    workers = f"{args.workers} worker{'s' if args.workers != 1 else ''}"
    print(
        f"{len(seeds)} seeds ({seeds.start}..{seeds.stop - 1}), {args.events} events each: "
        f"{failed} failed, {took:.1f} s ({len(seeds) / took:.1f} seeds/s, {workers})"
    )
    return 1 if failed else 0
