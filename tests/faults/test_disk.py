"""The disk faults: a tmpfs that fills and grows, and the LD_PRELOAD slow-disk shim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.chaos.disk import SlowDisk, SmallFilesystem

WRITE_AND_SYNC = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
os.write(fd, b"x" * 10)
os.fsync(fd)
os.close(fd)
"""


def _write_and_sync(path: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-c", WRITE_AND_SYNC, str(path)], env={**os.environ, **env}, check=True
    )


def test_slow_disk_delays_writes_under_its_directory_only_while_on(tmp_path) -> None:
    """The shim counts each call it delayed (after the delay); how long a delay lasts is
    its nanosleep's business, not something a busy machine's test can time."""
    data = tmp_path / "data"
    data.mkdir()
    slow = SlowDisk(data, tmp_path, write_us=10_000, sync_us=20_000)
    _write_and_sync(data / "a", slow.env())  # switched off
    assert slow.delayed_calls() == 0
    slow.on()
    _write_and_sync(data / "b", slow.env())
    assert slow.delayed_calls() == 2  # one write + one fsync
    # Each process writes its own count, after its first delayed call: start afresh.
    slow.count_file.unlink()
    _write_and_sync(tmp_path / "elsewhere", slow.env())
    assert slow.delayed_calls() == 0
    slow.off()
    _write_and_sync(data / "c", slow.env())
    assert slow.delayed_calls() == 0


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
