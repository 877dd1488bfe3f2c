"""Run fuzz inputs in a forked child, so that a decoder that aborts the interpreter (a
native extension failing an allocation, a segfault) is a finding, not the end of the run.

`run_batch(target, inputs)` forks one child for the whole batch; the child reports, over
a pipe, each input it starts and each exception a target lets escape. When the child
dies of a signal, the input it was running is the culprit; a new child goes on with the
next input. Forking costs tens of milliseconds here, so inputs go in batches: one fork
per batch plus one per crash. Linux only.
"""

from __future__ import annotations

import faulthandler
import os
import re
import select
import signal
import struct
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Rust's default allocation-failure handler: what kio's and cramjam's native code print
# before aborting when a length read from the input asks for more memory than exists.
NATIVE_ALLOCATION_ABORT = re.compile(r"memory allocation of \d+ bytes failed")
_STARTED = b"S"
_RAISED = b"E"
_DONE = b"D"
_RECORD = struct.Struct(">cII")  # kind, input index, length of the text that follows


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one input that did not simply pass."""

    index: int
    kind: str  # "exception", "signal", "timeout"
    detail: str = ""
    signal_number: int | None = None

    @property
    def native_allocation_abort(self) -> bool:
        return (
            self.kind == "signal"
            and self.signal_number == signal.SIGABRT
            and NATIVE_ALLOCATION_ABORT.search(self.detail) is not None
        )


def run_batch(
    target: Callable[[bytes], None], inputs: Sequence[bytes], *, timeout_s: float = 60
) -> list[Outcome]:
    """Run every input; the outcomes of those that raised, crashed or hung."""
    failures: list[Outcome] = []
    start = 0
    while start < len(inputs):
        done_until, outcome = _run_from(target, inputs, start, timeout_s, failures)
        if outcome is not None:
            failures.append(outcome)
        start = done_until
    return failures


def _run_from(
    target: Callable[[bytes], None],
    inputs: Sequence[bytes],
    start: int,
    timeout_s: float,
    failures: list[Outcome],
) -> tuple[int, Outcome | None]:
    """One child from input `start` on: (next input to run, the crash that ended it)."""
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile() as stderr:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_end)
            # The parent's fault handler (pytest turns one on) would print the child's
            # stack on an abort: the abort is reported from the exit status instead.
            faulthandler.disable()
            os.dup2(stderr.fileno(), 2)
            _child(target, inputs, start, write_end)
        os.close(write_end)
        current = start
        buffer = bytearray()
        finished = False
        deadline = time.monotonic() + timeout_s
        timed_out = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    os.kill(pid, signal.SIGKILL)
                    break
                ready, _, _ = select.select([read_end], [], [], left)
                if not ready:
                    continue
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= _RECORD.size:
                    kind, index, length = _RECORD.unpack_from(buffer)
                    if len(buffer) < _RECORD.size + length:
                        break
                    text = bytes(buffer[_RECORD.size : _RECORD.size + length])
                    del buffer[: _RECORD.size + length]
                    if kind == _STARTED:
                        current = index
                        deadline = time.monotonic() + timeout_s
                    elif kind == _RAISED:
                        failures.append(Outcome(index, "exception", text.decode(errors="replace")))
                    elif kind == _DONE:
                        finished = True
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    if finished:
        return len(inputs), None
    if timed_out:
        return current + 1, Outcome(current, "timeout", f"no result within {timeout_s:.0f} s")
    if os.WIFSIGNALED(status):
        return current + 1, Outcome(current, "signal", err, os.WTERMSIG(status))
    return current + 1, Outcome(current, "exception", f"child exited {status}: {err}")


def _child(target: Callable[[bytes], None], inputs: Sequence[bytes], start: int, pipe: int) -> None:
    def send(kind: bytes, index: int, text: bytes = b"") -> None:
        os.write(pipe, _RECORD.pack(kind, index, len(text)) + text)

    try:
        for index in range(start, len(inputs)):
            send(_STARTED, index)
            try:
                target(inputs[index])
            except Exception:
                send(_RAISED, index, traceback.format_exc().encode(errors="replace"))
        send(_DONE, len(inputs))
    finally:
        os._exit(0)
