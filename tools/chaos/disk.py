"""Disk faults for a daemon under test: a small filesystem that fills up, and a slow one.

- `SmallFilesystem`: a tmpfs of a given size mounted by the test (root only), grown
  later with `resize()` (a remount keeps the files): the disk fills, then space comes
  back. Always unmounted when the block ends.
- `SlowDisk`: an LD_PRELOAD shim (slowdisk.c, compiled on first use with the
  machine's C compiler) that delays every write and fsync the daemon makes under one
  directory while a switch file exists, and counts the delayed calls. Reads, writes
  through memory maps and the kernel's writeback are not slowed: this is a
  slow write path as the daemon's syscalls see it, not a slow block device. A block
  device throttled with cgroups would not do either: tmpfs has no block device, and
  cgroup v1 blkio does not throttle buffered writes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Self

SHIM_SOURCE = Path(__file__).with_name("slowdisk.c")
SHIM_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "chaos"


class DiskFaultUnavailable(RuntimeError):
    """This machine cannot make the disk fault (not root, no compiler): the message says why."""


class SmallFilesystem:
    """A tmpfs of `size_bytes` at `path` (created), unmounted on exit."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = Path(path)
        self.size_bytes = size_bytes
        self.mounted = False

    def __enter__(self) -> Self:
        if os.geteuid() != 0:
            raise DiskFaultUnavailable("mounting a tmpfs needs root")
        self.path.mkdir(parents=True, exist_ok=True)
        self._mount("-o", f"size={self.size_bytes}")
        self.mounted = True
        return self

    def resize(self, size_bytes: int) -> None:
        """Grow (or shrink) the filesystem in place; its files stay."""
        self._mount("-o", f"remount,size={size_bytes}")
        self.size_bytes = size_bytes

    def free_bytes(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def _mount(self, *options: str) -> None:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", *options, "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise DiskFaultUnavailable(f"cannot mount a tmpfs: {done.stderr.strip()}")

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if not self.mounted:
            return
        # Lazy: a daemon still holding files there must not keep the mount alive. Again while
        # the path is still a mount point (mounts stack; one test's tmpfs was once found still
        # mounted after the suite, why is not known), and said if it stays one: a mount left
        # behind outlives the run.
        said = ""
        for _ in range(3):
            done = subprocess.run(
                ["umount", "-l", str(self.path)], capture_output=True, text=True, check=False
            )
            said = done.stderr.strip()
            if not os.path.ismount(self.path):
                break
        self.mounted = False
        if os.path.ismount(self.path) and exc_type is None:
            raise DiskFaultUnavailable(f"the tmpfs at {self.path} stays mounted: {said}")


def build_shim(cache_dir: Path = SHIM_CACHE) -> Path:
    """The compiled shim (.so), rebuilt when slowdisk.c changes."""
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = cache_dir / f"slowdisk-{digest}.so"
    if target.exists():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise DiskFaultUnavailable("no C compiler (cc) to build the slow-disk shim")
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise DiskFaultUnavailable(f"cannot build the slow-disk shim: {done.stderr.strip()}")
    os.replace(partial, target)
    return target


# A count read mid-rewrite is retried this often, 10 ms apart.
COUNT_READ_ATTEMPTS = 50


class SlowDisk:
    """Delays for one daemon's writes under `directory`, switched on and off by a file."""

    def __init__(
        self, directory: Path, workdir: Path, *, write_us: int = 2000, sync_us: int = 50_000
    ) -> None:
        self.directory = Path(directory).resolve()
        self.switch = Path(workdir) / "slowdisk.on"
        self.count_file = Path(workdir) / "slowdisk.count"
        self.write_us = write_us
        self.sync_us = sync_us
        self.shim = build_shim()

    def env(self) -> dict[str, str]:
        """The environment that puts a process on the slow disk."""
        return {
            "LD_PRELOAD": str(self.shim),
            "SLOWDISK_DIR": str(self.directory),
            "SLOWDISK_SWITCH": str(self.switch),
            "SLOWDISK_COUNT": str(self.count_file),
            "SLOWDISK_WRITE_US": str(self.write_us),
            "SLOWDISK_SYNC_US": str(self.sync_us),
        }

    def on(self) -> None:
        self.switch.touch()

    def off(self) -> None:
        self.switch.unlink(missing_ok=True)

    def delayed_calls(self) -> int:
        """Calls delayed so far (by the last process that wrote the count).

        The shim rewrites the file in place (truncate, then write) after every delayed
        call, from whichever thread made it (the daemon fsyncs on a thread of its own), so
        a read can land between the two and see nothing: read again until it parses."""
        for _ in range(COUNT_READ_ATTEMPTS):
            try:
                return int(self.count_file.read_text().strip())
            except FileNotFoundError:
                return 0
            except ValueError:
                time.sleep(0.01)
        return 0
