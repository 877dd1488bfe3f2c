"""tracemalloc inside a benchmarked daemon: where each rise of its Python memory was made.

`start()` (called first thing in the daemon's process, see PROGRAM) turns tracemalloc on
and starts a thread that polls the traced total every POLL_S; whenever it is STEP above
the last snapshot's, it takes a snapshot at once (while the rise is still held) and
writes to the file named by the environment's TRACE_OUT the tracebacks that grew most
since that last snapshot, then keeps the new one. Every REBASE_S without a rise the
baseline snapshot is taken again, so a report says what the last seconds added, not the
whole run. tracemalloc slows the daemon and adds its own memory, and each comparison
walks every trace in Python with the GIL held (seconds at 10,000 partitions): a traced
run finds where a step comes from, on a quiet machine; its RSS figures are not the
bench's.

    TRACE_OUT=/tmp/trace.txt python -c "$(tools.bench.traced.PROGRAM)" run -c CONFIG
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

MIB = 1 << 20
POLL_S = 0.05
STEP = 4 * MIB
REBASE_S = 5.0
FRAMES = 4
SHOWN = 12
ENV = "TRACE_OUT"
# The daemon as tools/replica.AS_INSTALLED starts it, traced.
PROGRAM = (
    "import sys; sys.modules['hypothesis'] = None; from tools.bench.traced import start; "
    "start(); from replicad.cli import main; sys.exit(main())"
)


def start() -> threading.Event:
    """Tracing on when TRACE_OUT names a file; the event is set once the watch has its
    first baseline (at once when tracing is off): what is allocated after it is a rise the
    watch can see."""
    baseline = threading.Event()
    out = os.environ.get(ENV)
    if not out:
        baseline.set()
        return baseline
    tracemalloc.start(FRAMES)
    thread = threading.Thread(
        target=_watch, args=(out, baseline), name="tracemalloc-watch", daemon=True
    )
    thread.start()
    return baseline


def _watch(out: str, baseline: threading.Event) -> None:
    began = time.monotonic()
    base = _snapshot()
    base_total = tracemalloc.get_traced_memory()[0]
    based_at = began
    baseline.set()
    while True:
        time.sleep(POLL_S)
        total = tracemalloc.get_traced_memory()[0]
        now = time.monotonic()
        if total >= base_total + STEP:
            snap = _snapshot()
            report = describe(snap, base, now - began, base_total, total)
            with open(out, "a") as f:
                f.write(report + "\n")
            base, base_total, based_at = snap, total, now
        elif now - based_at >= REBASE_S:
            base, base_total, based_at = _snapshot(), total, now


def _snapshot() -> tracemalloc.Snapshot:
    # Not filtered: Snapshot.filter_traces matches every frame of every trace with fnmatch
    # in Python, minutes at 10,000 partitions on a loaded machine, the GIL held throughout.
    return tracemalloc.take_snapshot()


def describe(
    snap: tracemalloc.Snapshot, base: tracemalloc.Snapshot, at_s: float, was: int, now: int
) -> str:
    """The tracebacks that grew most between `base` and `snap`, largest first."""
    lines = [f"{at_s:8.1f} s: traced {was / MIB:.1f} -> {now / MIB:.1f} MiB"]
    for stat in snap.compare_to(base, "traceback")[:SHOWN]:
        if stat.size_diff <= 0:
            break
        lines.append(f"  +{stat.size_diff / MIB:7.2f} MiB in {stat.count_diff:+,} blocks:")
        lines += [f"      {frame.filename}:{frame.lineno}" for frame in stat.traceback]
    return "\n".join(lines)
