"""tools/bench/ceiling.py: the plain socket-to-file copy carries the bytes exactly."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from tools.bench.ceiling import main
from tools.wait import wait_until


def test_the_receiver_writes_every_file_in_order(tmp_path: Path):
    rng = random.Random(3)
    files = []
    for i, size in enumerate([0, 1, 3 * 1024 * 1024 + 7, 4096]):
        f = tmp_path / f"seg{i}.log"
        f.write_bytes(rng.randbytes(size))
        files.append(f)
    port_file = tmp_path / "port"
    sender = subprocess.Popen(
        [sys.executable, "-m", "tools.bench.ceiling", "send", str(port_file), *map(str, files)]
    )
    try:
        wait_until(lambda: port_file.exists() and port_file.read_text(), what="the port file")
        out = tmp_path / "out"
        expected = b"".join(f.read_bytes() for f in files)
        assert main(["receive", port_file.read_text(), str(out), str(len(expected))]) == 0
        assert sender.wait(30) == 0
    finally:
        sender.kill()
        sender.wait()
    assert out.read_bytes() == expected


def test_a_short_stream_is_an_error(tmp_path: Path):
    f = tmp_path / "seg.log"
    f.write_bytes(b"x" * 100)
    port_file = tmp_path / "port"
    sender = subprocess.Popen(
        [sys.executable, "-m", "tools.bench.ceiling", "send", str(port_file), str(f)]
    )
    try:
        wait_until(lambda: port_file.exists() and port_file.read_text(), what="the port file")
        assert main(["receive", port_file.read_text(), str(tmp_path / "out"), "101"]) == 1
    finally:
        sender.kill()
        sender.wait()
