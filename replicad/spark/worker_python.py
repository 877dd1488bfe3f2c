"""The Python a local run's Spark workers start: this interpreter, importing PySpark from
where the driver imported it.

Spark puts `pyspark.zip` first on every Python worker's path. Python cannot cache bytecode
inside a zip, so each worker compiles the PySpark modules it imports, every time: 1.5 s of
CPU and 9.5 s of wall time for the streaming source's runner on this two-core machine at
load 27, against 0.5 s and 3 s from the installed package, whose bytecode is cached. For
the process that hosts a Python streaming source on the driver, Spark waits 10 s (a
constant in PythonWorkerFactory) for it to connect back; under load the zip's compile alone
ran out that time and the query failed before its first micro-batch (follow.py retries).

So a local run's workers start through a short shell script that puts the directory the
driver's `pyspark` came from ahead of Spark's path: the same PySpark (the zip is a copy of
the installed package), with its bytecode cache. Even so, at load 45-62 the imports alone
ran out the 10 s: the script starts the driver-side modules that connect back through
connect_first.py, which connects before it imports, started by its file without `site`
(connect_first.START_FLAGS says why) and without PYTHONPATH (held in HELD_PYTHONPATH until
it has connected: an interpreter's own start searches every PYTHONPATH entry for the
modules it imports, and reading pyspark.zip's 4 MB index doubled a stand-in's start). Only
for local runs: on a cluster the executors' Python is the operator's to choose.
"""

from __future__ import annotations

import atexit
import os
import shlex
import sys
import tempfile
from functools import cache
from pathlib import Path

SCRIPT = """#!/bin/sh
# Written by replicad (replicad/spark/worker_python.py): PySpark from {site}, not pyspark.zip;
# the driver-side modules connect back to Spark before they import (connect_first.py), and
# start with PYTHONPATH held aside in {held} (it puts it back once connected).
PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONPATH
case "$1 $2" in
{patterns})
    {held}=$PYTHONPATH
    export {held}
    unset PYTHONPATH
    exec {connect_first} "$@" ;;
esac
exec {python} "$@"
"""


def pyspark_home() -> Path:
    """The directory holding the `pyspark` package this process imports."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent.parent


def script(site: Path, python: str) -> str:
    from replicad.spark.connect_first import HELD_PYTHONPATH, MODULES, start_argv

    patterns = "|".join(f"'-m {module}'" for module in MODULES)
    return SCRIPT.format(
        site=shlex.quote(str(site)),
        python=shlex.quote(python),
        connect_first=shlex.join(start_argv(python)),
        patterns=patterns,
        held=HELD_PYTHONPATH,
    )


@cache
def worker_python() -> str:
    """The path of the script (written once per process, removed when it exits)."""
    fd, path = tempfile.mkstemp(prefix="replicad-python-", suffix=".sh")
    with os.fdopen(fd, "w") as f:
        f.write(script(pyspark_home(), sys.executable))
    os.chmod(path, 0o755)
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    return path
