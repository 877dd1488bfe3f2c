"""tools/leftovers.py: what a run left in the shared temporary directories, and mounts left
under its own."""

from __future__ import annotations

import time
from pathlib import Path

from tools.leftovers import SUITE_PATTERNS, found, mounts_under


def test_files_of_the_suites_kinds_made_since_the_start_are_named(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    started = time.time() - 1
    planted = [
        shared / "blockmgr-9538218a-329e-4ea3-9164-90e5cae22ce9",
        shared / "spark-37f6ee95-56bd-429f-8159-cfe146a1cbcd",
        shared / "liblz4-java-1323050674.so",
        shared / "snappy-1.1.10-43b875ba-libsnappyjava.so",
        shared / "replicad-log4j2-rt8pm2nv.properties",
        shared / "replicad-python-9swzut0q.sh",
        shared / "artifacts-33e019b1-71e2-4197-97a4-c9afc76f2e75",
    ]
    for path in planted:
        path.mkdir() if "." not in path.name else path.write_bytes(b"x")
    (shared / "unrelated-file").write_bytes(b"x")
    (shared / "spark-helper").mkdir()  # a person's directory, not Spark's
    (shared / "hsperfdata_root").mkdir()
    assert found(started, [shared]) == sorted(planted)
    # A run that started after they were made did not make them.
    assert found(time.time() + 5, [shared]) == []
    # What the caller knows to be its own is not a leftover.
    spark = shared / "spark-37f6ee95-56bd-429f-8159-cfe146a1cbcd"
    assert spark not in found(started, [shared], keep=[spark])


def test_every_kind_seen_after_a_run_is_looked_for() -> None:
    """The names the last session's runs left in /tmp (the closing note of session 11)."""
    import fnmatch

    seen = [
        "replicad-fuzz-config-3maoyrks",
        "replicad-log4j2-rt8pm2nv.properties",
        "replicad-python-9swzut0q.sh",
        "spark-37f6ee95-56bd-429f-8159-cfe146a1cbcd",
        "blockmgr-9538218a-329e-4ea3-9164-90e5cae22ce9",
        "artifacts-33e019b1-71e2-4197-97a4-c9afc76f2e75",
        "liblz4-java-13230506749440721116.so",
        "liblz4-java-13230506749440721116.so.lck",
        "snappy-1.1.10-43b875ba-5c55-49c7-961c-effda47bb1a3-libsnappyjava.so",
    ]
    assert [n for n in seen if not any(fnmatch.fnmatchcase(n, p) for p in SUITE_PATTERNS)] == []


def test_a_directory_that_is_not_there_is_skipped(tmp_path: Path) -> None:
    assert found(0, [tmp_path / "absent"]) == []


def test_mounts_at_or_below_the_roots_are_named(tmp_path: Path) -> None:
    run = tmp_path / "pt-ci"
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "proc /proc proc rw 0 0\n"
        f"tmpfs {run}/popen-gw1/test_disk_full0/disk-full-0-fs tmpfs rw,size=2048k 0 0\n"
        f"tmpfs {run}/with\\040space tmpfs rw 0 0\n"
        f"tmpfs {tmp_path}/pt-ci-other tmpfs rw 0 0\n"
        "garbage\n"
    )
    assert mounts_under([run], mounts) == [
        run / "popen-gw1" / "test_disk_full0" / "disk-full-0-fs",
        run / "with space",
    ]
    assert mounts_under([tmp_path / "elsewhere"], mounts) == []
    assert mounts_under([run], tmp_path / "no-such-file") == []
