"""What a test run leaves behind outside its own directories: files in the machine's /tmp and
/dev/shm, and filesystems still mounted under the run's directories.

The suite gives every process it starts a temporary directory of its own (TMPDIR, and
`java.io.tmpdir` for the JVMs: tests/conftest.py), removed when the run ends, so nothing it
makes should appear in /tmp. What still does is a temporary file made where that is not
honoured (a JVM started without the option, a path written out in full), and it stays on
the machine after every run: Spark's `spark-*`/`blockmgr-*` directories, the native
libraries the JVMs unpack (`liblz4-java-*.so`, `snappy-*-libsnappyjava.so`), replicad's own
`replicad-*` scratch files. The suite's end names each one (`found`) and fails the run.

Only names the suite's processes make are looked at, and only entries changed since the run
began: another program's files in /tmp are not the suite's business.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

# Where temporary files land when TMPDIR and java.io.tmpdir are not honoured.
SHARED_DIRS = (Path("/tmp"), Path("/dev/shm"))
# Names the suite's processes give their temporary files and directories: replicad's and
# the tests' own (replicad-*, rd-sock-*), Spark's local and artifact directories, the native
# libraries snappy-java and lz4-java unpack, a JVM's crash or heap files.
SUITE_PATTERNS = (
    "replicad-*",
    "rd-sock-*",
    "spark-????????-????-????-????-????????????",  # Spark's own: a UUID after the name
    "blockmgr-????????-????-????-????-????????????",
    "artifacts-????????-????-????-????-????????????",
    "liblz4-java-*",
    "snappy-*-libsnappyjava.so",
    "libzstd-jni-*",
    "hs_err_pid*.log",
    "java_pid*.hprof",
)


def found(
    since: float,
    dirs: Iterable[Path] = SHARED_DIRS,
    patterns: Sequence[str] = SUITE_PATTERNS,
    *,
    keep: Iterable[Path] = (),
) -> list[Path]:
    """Entries of `dirs` named like `patterns` and created or changed at or after `since`
    (seconds since the epoch), other than `keep`: what a run that began at `since` left."""
    kept = {Path(p) for p in keep}
    left: list[Path] = []
    for directory in dirs:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
                continue
            path = Path(entry.path)
            if path in kept:
                continue
            try:
                changed = entry.stat(follow_symlinks=False).st_ctime
            except OSError:
                continue  # gone meanwhile: not left
            if changed >= since:
                left.append(path)
    return sorted(left)


MOUNTS = Path("/proc/self/mounts")
_OCTAL = re.compile(r"\\([0-7]{3})")


def mounts_under(roots: Iterable[Path], mounts_file: Path = MOUNTS) -> list[Path]:
    """Mount points at or below any of `roots` (a test's tmpfs left mounted)."""
    resolved = [Path(os.path.realpath(r)) for r in roots]
    try:
        lines = mounts_file.read_text().splitlines()
    except OSError:
        return []
    points: list[Path] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        # /proc/mounts escapes a space, tab, newline and backslash in octal.
        point = Path(_OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[1]))
        if any(point == r or r in point.parents for r in resolved):
            points.append(point)
    return sorted(set(points))
