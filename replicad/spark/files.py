"""Every file the Spark source opens goes through `FileOpener`, the one place to observe it.

Pruning is a promise about files not opened, so it has to be checkable: with a trace path
(the `traceFileOpens` option) each open appends one line `<purpose>\\t<path>` to that file.
Planning on the driver and reading on the executors run in different processes; lines are
appended with O_APPEND in a single write, which keeps them whole when processes interleave
on a local file system.

Files are only ever opened read-only: the data directory may belong to a running replicad.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class Purpose(enum.Enum):
    INDEX = "index"  # planning: an .index or .timeindex file
    PLAN = "plan"  # planning: a .log read to turn a timestamp into an offset
    READ = "read"  # a split's own bytes
    LOOKAHEAD = "lookahead"  # read_committed: bytes after a split, for transaction markers


@dataclass(frozen=True, slots=True)
class FileOpener:
    trace_path: str | None = None

    @contextmanager
    def open(self, path: str, purpose: Purpose) -> Iterator[int]:
        """A read-only descriptor of `path`; FileNotFoundError when it is gone."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._trace(path, purpose)
            yield fd
        finally:
            os.close(fd)

    def read_all(self, path: str, purpose: Purpose) -> bytes | None:
        """The whole file, or None when it does not exist."""
        try:
            with self.open(path, purpose) as fd:
                size = os.fstat(fd).st_size
                return os.pread(fd, size, 0) if size else b""
        except FileNotFoundError:
            return None

    def _trace(self, path: str, purpose: Purpose) -> None:
        if self.trace_path is None:
            return
        line = f"{purpose.value}\t{path}\n".encode()
        fd = os.open(self.trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class TracedOpen:
    purpose: Purpose
    path: str


def read_trace(trace_path: str) -> list[TracedOpen]:
    """The opens a trace file recorded, in the order they were appended."""
    try:
        with open(trace_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    opened = []
    for line in lines:
        purpose, _, path = line.partition("\t")
        opened.append(TracedOpen(Purpose(purpose), path))
    return opened
