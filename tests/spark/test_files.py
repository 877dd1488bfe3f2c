"""The open hook: read-only opens, traced one whole line each, across processes."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from replicad.spark.files import FileOpener, Purpose, TracedOpen, read_trace


def test_opens_are_traced_with_their_purpose(tmp_path):
    trace = tmp_path / "trace"
    data = tmp_path / "a.log"
    data.write_bytes(b"abc")
    opener = FileOpener(str(trace))
    with opener.open(str(data), Purpose.READ) as file:
        assert file.pread(3, 0) == b"abc"
        assert file.size == 3
        with pytest.raises(OSError):
            os.write(file.fd, b"x")  # read-only
    assert opener.read_all(str(data), Purpose.INDEX) == b"abc"
    assert opener.read_all(str(tmp_path / "missing"), Purpose.INDEX) is None
    assert read_trace(str(trace)) == [
        TracedOpen(Purpose.READ, str(data)),
        TracedOpen(Purpose.INDEX, str(data)),
    ]


def test_without_a_trace_path_nothing_is_written(tmp_path):
    data = tmp_path / "a.log"
    data.write_bytes(b"")
    assert FileOpener().read_all(str(data), Purpose.PLAN) == b""
    assert os.listdir(tmp_path) == ["a.log"]
    assert read_trace(str(tmp_path / "never")) == []


def _open_many(trace: str, path: str, times: int) -> None:
    opener = FileOpener(trace)
    for _ in range(times):
        opener.read_all(path, Purpose.READ)


def test_lines_stay_whole_when_processes_trace_at_once(tmp_path):
    trace = str(tmp_path / "trace")
    path = str(tmp_path / ("x" * 200 + ".log"))
    open(path, "wb").close()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_open_many, args=(trace, path, 300)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    assert read_trace(trace) == [TracedOpen(Purpose.READ, path)] * 1200
