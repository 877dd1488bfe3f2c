"""run_batch: exceptions, aborts and hangs of single inputs are findings; the batch goes on."""

from __future__ import annotations

import ctypes
import os
import signal
import time

from tools.chaos.isolate import run_batch


def target(data: bytes) -> None:
    if data == b"raise":
        raise ValueError("boom")
    if data == b"abort":
        os.write(2, b"memory allocation of 123 bytes failed\n")
        os.abort()
    if data == b"segv":
        ctypes.string_at(0)
    if data == b"hang":
        time.sleep(3600)  # timing-ok: a hanging input, what run_batch must give up on


def test_each_failure_is_reported_by_index_and_the_rest_runs() -> None:
    inputs = [b"ok", b"raise", b"ok", b"abort", b"ok", b"segv", b"ok"]
    failures = run_batch(target, inputs)
    assert [(f.index, f.kind) for f in failures] == [(1, "exception"), (3, "signal"), (5, "signal")]
    assert "ValueError: boom" in failures[0].detail
    assert failures[1].signal_number == signal.SIGABRT and failures[1].native_allocation_abort
    assert failures[2].signal_number == signal.SIGSEGV and not failures[2].native_allocation_abort


def test_a_hang_is_a_timeout_and_later_inputs_still_run() -> None:
    # The input hangs for an hour: run_batch returns only because it gave up on it. The
    # timeout is per input, from its start: 5 s, so that a loaded machine's slow fork does
    # not make the next input look hung too.
    failures = run_batch(target, [b"hang", b"raise"], timeout_s=5)
    assert [(f.index, f.kind) for f in failures] == [(0, "timeout"), (1, "exception")]


def test_a_clean_batch_has_no_outcomes() -> None:
    assert run_batch(target, [b"ok"] * 50) == []
