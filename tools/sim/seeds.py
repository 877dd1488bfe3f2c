"""What the two simulations share, the follower's (run.py, `python -m tools.sim`) and the
mirror's (mirror_run.py): a seed's result and how it is reported, running seeds one after
the other, where their logs are written, and the command line that replays one seed.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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
