"""tools/bench/traced.py: a process started under it says where its Python memory rose:
the line that made a step of small objects is named in the report file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The step is made once the watch has its baseline (an event, not a sleep that a loaded
# machine may outlast: a step made before the baseline is in it, and never reported).
_CHILD = """
import sys, time
from tools.bench.traced import start
baseline = start()
assert baseline.wait(60), "the watch took no baseline"
held = [str(i) * 20 for i in range(200_000)]  # the step: about 16 MiB of small strings
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not open(sys.argv[1]).read().count("MiB in"):
    time.sleep(0.05)
"""


def test_a_step_of_small_objects_is_traced_to_the_line_that_made_it(tmp_path: Path) -> None:
    out = tmp_path / "trace.txt"
    out.write_text("")
    env = {**os.environ, "TRACE_OUT": str(out), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", _CHILD, str(out)], env=env, check=True, timeout=120)
    report = out.read_text()
    assert "traced" in report and "<string>:6" in report, report
