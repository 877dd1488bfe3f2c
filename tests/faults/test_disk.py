"""The disk faults: a tmpfs that fills and grows, and the LD_PRELOAD slow-disk shim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.chaos.disk import SlowDisk, SmallFilesystem

WRITE_AND_SYNC = """
import os, sys, time
target = sys.argv[1]
started = time.monotonic()
fd = os.open(target, os.O_WRONLY | os.O_CREAT)
os.write(fd, b"x" * 10)
os.fsync(fd)
os.close(fd)
print(time.monotonic() - started)
"""


def _timed_write(path: Path, env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", WRITE_AND_SYNC, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return float(done.stdout)


def test_slow_disk_delays_writes_under_its_directory_only_while_on(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    slow = SlowDisk(data, tmp_path, write_us=100_000, sync_us=200_000)
    assert _timed_write(data / "a", slow.env()) < 0.25  # switched off
    slow.on()
    assert _timed_write(data / "b", slow.env()) >= 0.3  # one write + one fsync
    assert _timed_write(tmp_path / "elsewhere", slow.env()) < 0.25
    assert slow.delayed_calls() == 2
    slow.off()
    assert _timed_write(data / "c", slow.env()) < 0.25


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_small_filesystem_fills_grows_and_goes_away(tmp_path) -> None:
    mount = tmp_path / "small"
    with SmallFilesystem(mount, 256 * 1024) as fs:
        assert os.path.ismount(mount)
        with pytest.raises(OSError), (mount / "big").open("wb") as big:
            big.write(b"\0" * (512 * 1024))
            big.flush()
        fs.resize(4 * 1024 * 1024)
        assert fs.free_bytes() > 3 * 1024 * 1024
        (mount / "big").write_bytes(b"\0" * (512 * 1024))  # fits now, files kept
    assert not os.path.ismount(mount)
