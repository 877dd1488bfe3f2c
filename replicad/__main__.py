"""`python -m replicad ...`: the same command line as the `replicad` script."""

from replicad.cli import main

raise SystemExit(main())
