"""python -m tools.sim --seed N [-v] | --seeds N [--first S] [--events E] [--progress K]
[--workers W]

The follower's simulation (run.py). A failing seed is printed as soon as it fails, with its
last events and how to replay it. --workers runs the seeds in W processes (each seed is
independent: the same results, in another order); the report is the same. The command line
is every simulation's (seeds.seed_main)."""

from __future__ import annotations

import sys

from tools.sim.run import run_seed
from tools.sim.seeds import seed_main


def main(argv: list[str] | None = None) -> int:
    return seed_main("python -m tools.sim", __doc__, run_seed, events=150, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
