"""python -m tools.sim --seed N [-v] | --seeds N [--first S] [--events E] [--progress K]
[--workers W]

A failing seed is printed as soon as it fails, with its last events and how to replay it.
--workers runs the seeds in W processes (each seed is independent: the same results, in
another order); the report is the same."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator

from tools.sim.run import run_seed
from tools.sim.seeds import SimResult, quiet_logs, report_one, seed_arguments


def _run(seed_and_events: tuple[int, int]) -> SimResult:
    seed, events = seed_and_events
    result = run_seed(seed, events=events)
    if result.ok:
        result.event_log = []  # not needed, and costly to send back
    return result


def _results(seeds: range, events: int, workers: int) -> Iterator[SimResult]:
    if workers <= 1:
        yield from (run_seed(seed, events=events) for seed in seeds)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(_run, ((s, events) for s in seeds), chunksize=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sim", description=__doc__)
    seed_arguments(parser, events=150)
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
    last = args.first + args.seeds - 1
    results = _results(range(args.first, last + 1), args.events, args.workers)
    for done, result in enumerate(results, start=1):
        counts.update(result.counts)
        if not result.ok:
            failed += 1
            print(result.summary(), flush=True)
        if args.progress and done % args.progress == 0:
            rate = done / (time.perf_counter() - started)
            print(f"... {done} seeds, {failed} failed, {rate:.1f} seeds/s", flush=True)
    print("what the seeds did:", ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    took = time.perf_counter() - started
    print(
        f"{args.seeds} seeds ({args.first}..{last}), {args.events} events each: "
        f"{failed} failed, {took:.1f} s ({args.seeds / took:.1f} seeds/s, "
        f"{args.workers} worker{'s' if args.workers != 1 else ''})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
