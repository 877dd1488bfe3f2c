"""tools/bench/spark_cpu.py: a read's CPU counts a process that ends during it, whether its
parent reaps it (counted once) or ignores SIGCHLD as PySpark's daemon does (not lost)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tools.bench.measure import tree_cpu_seconds
from tools.bench.spark_cpu import TreeCpu, snapshot
from tools.wait import wait_until

# A parent that forks one child and then only waits; the child, on its parent's stdin and
# stdout, burns CPU until its own CPU time reaches what it is told, and exits when told.
FAMILY = textwrap.dedent(
    """
    import os, signal, sys, time
    if sys.argv[1] == "ignore":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as pyspark.daemon does
    child = os.fork()
    if child == 0:
        print(os.getpid(), flush=True)
        for line in sys.stdin:
            if line.startswith("burn"):
                target = float(line.split()[1])
                while time.process_time() < target:
                    pass
                print("burned", flush=True)
            else:
                os._exit(0)
        os._exit(0)
    if sys.argv[1] == "wait":
        os.waitpid(child, 0)
    signal.pause()
    """
)

BURN_S = 0.3


class Family:
    def __init__(self, mode: str) -> None:
        self.parent = subprocess.Popen(
            [sys.executable, "-c", FAMILY, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.parent.stdin is not None and self.parent.stdout is not None
        self.stdin, self.stdout = self.parent.stdin, self.parent.stdout
        self.child = int(self.stdout.readline())

    def burn(self, cpu_s: float) -> None:
        self.stdin.write(f"burn {cpu_s}\n")
        self.stdin.flush()
        assert self.stdout.readline().strip() == "burned"

    def end_child(self) -> None:
        self.stdin.write("exit\n")
        self.stdin.flush()
        # Gone from the parent's tree: reaped (by the parent or, ignored, by the kernel).
        wait_until(
            lambda: all(seen.pid != self.child for seen in snapshot([self.parent.pid]).values()),
            what="the child reaped",
        )


@pytest.fixture
def family(request: pytest.FixtureRequest) -> Iterator[Family]:
    made = Family(request.param)
    try:
        yield made
    finally:
        made.parent.kill()
        made.parent.wait()


@pytest.mark.parametrize("family", ["ignore"], indirect=True)
def test_a_worker_that_ends_during_a_read_takes_none_of_its_cpu_out(family: Family) -> None:
    family.burn(BURN_S)  # before the read: not the read's
    before = tree_cpu_seconds(family.parent.pid)
    meter = TreeCpu(lambda: [family.parent.pid], every_s=3600)  # polls only when told
    family.end_child()
    counted = sum(spent.total for spent in meter.stop())
    # Two readings of the tree lose the child with all it ever spent (the old meter's
    # negative total); the sampler counts what it spent during the read: about nothing.
    assert tree_cpu_seconds(family.parent.pid) - before < -BURN_S / 2  # timing-ok: CPU s
    assert -0.05 < counted < BURN_S / 2  # timing-ok: CPU seconds, a count of work done


@pytest.mark.parametrize("family", ["ignore"], indirect=True)
def test_what_an_unreaped_worker_spent_before_it_ended_is_counted(family: Family) -> None:
    meter = TreeCpu(lambda: [family.parent.pid], every_s=3600)
    family.burn(BURN_S)
    meter.sample()  # a poll between the burn and the end, as the sampler's thread takes
    family.end_child()
    spent = meter.stop()
    child = [s for s in spent if s.pid == family.child]
    assert len(child) == 1
    assert child[0].ended and not child[0].started
    assert child[0].total >= BURN_S - 0.02  # timing-ok: CPU seconds (clock ticks)
    assert sum(s.total for s in spent) >= BURN_S - 0.02  # timing-ok: CPU seconds


@pytest.mark.parametrize("family", ["wait"], indirect=True)
def test_a_child_its_parent_reaps_is_counted_once(family: Family) -> None:
    meter = TreeCpu(lambda: [family.parent.pid], every_s=3600)
    family.burn(BURN_S)
    meter.sample()  # the child seen with its CPU, then reaped into its parent's
    family.end_child()
    spent = meter.stop()
    parent = [s for s in spent if s.pid == family.parent.pid]
    assert parent[0].reaped >= BURN_S - 0.02  # timing-ok: CPU seconds of the reaped child
    # Once: by the parent that reaped it, not again by the child as last seen.
    assert sum(s.total for s in spent) < 1.5 * BURN_S  # timing-ok: CPU seconds


@pytest.mark.parametrize("family", ["ignore", "wait"], indirect=True)
def test_a_parent_ignoring_sigchld_is_told_from_proc(family: Family) -> None:
    seen = {s.pid: s for s in snapshot([family.parent.pid]).values()}
    assert set(seen) == {family.parent.pid, family.child}
    ignoring = family.parent.args[-1] == "ignore"
    assert seen[family.parent.pid].ignores_children is ignoring
    assert seen[family.child].ppid == family.parent.pid


def test_a_process_that_ends_while_its_threads_are_listed_is_kept_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process can end between the read of its stat and the listing of its threads
    (/proc/PID/task is gone): the poll keeps what it read and goes on. It raised in the
    meter's thread (a quiet run of tools.bench.spark, 2026-11-27), which then stopped
    polling for the rest of that read."""
    import os
    from pathlib import Path

    real_glob = Path.glob

    def glob_of_a_process_gone(self: Path, pattern: str):  # type: ignore[no-untyped-def]
        if pattern.startswith("task/"):
            raise FileNotFoundError(2, "No such file or directory", str(self / "task"))
        return real_glob(self, pattern)

    monkeypatch.setattr(Path, "glob", glob_of_a_process_gone)
    seen = {s.pid for s in snapshot([os.getpid()]).values()}
    assert seen == {os.getpid()}
