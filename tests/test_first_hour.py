"""The README's first command as a new user meets it: `make demo` from a fresh clone, by a
user who is not root, on a machine where kcat is not on PATH (it is only a test peer); and
the test peer itself, kcat, fetched by such a user when the system's package lists are
empty (a fresh container's are).

The user gets nothing of ours installed: a clone of the committed tree, their own venv and
pip downloads. Only Apache Kafka's jars are shared (read-only) with this run, as the same
artifacts from Maven Central (Kafka's and the tiered storage test jar, both of which `make
demo` fetches); the point is the user, not the download."""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.peers.kafka import KAFKA_CACHE
from tools.peers.tiered import TIERED_CACHE

ROOT = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_S = 900


@pytest.fixture
def new_user() -> Iterator[tuple[str, Path]]:
    """A throw-away login user with a home of its own (needs root to make one)."""
    if os.geteuid() != 0:
        pytest.skip("making a throw-away user needs root (CI runs as root)")
    name = f"rd-demo-{secrets.token_hex(3)}"
    base = Path(tempfile.mkdtemp(prefix="replicad-first-hour-"))
    base.chmod(0o755)
    home = base / name
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", name],
        check=True,
    )
    try:
        yield name, home
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", name], check=False)
        shutil.rmtree(base, ignore_errors=True)


def path_without(program: str, directory: Path) -> str:
    """A PATH with every program of /usr/bin and /usr/sbin but `program`."""
    directory.mkdir()
    for source in (Path("/usr/bin"), Path("/usr/sbin")):
        for entry in source.iterdir():
            link = directory / entry.name
            if entry.name != program and not link.exists():
                link.symlink_to(entry)
    return str(directory)


def fresh_clone(name: str, home: Path) -> tuple[Path, dict[str, str]]:
    """A clone of the committed tree in the user's home, and the environment of a login
    with kcat off PATH."""
    clone = home / "replicad"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    path = path_without("kcat", home / "bin")
    env = {
        "HOME": str(home),
        "USER": name,
        "PATH": path,
        "LANG": "C.UTF-8",
        # The machine's own pip settings (an index mirror, a wheel directory) stay.
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
    }
    return clone, env


def as_user(name: str, env: dict[str, str], *argv: str, timeout: float = 600) -> str:
    result = subprocess.run(
        ["runuser", "-u", name, "--", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def demo_table(output: str) -> dict[int, tuple[int, int]]:
    """The demo's partition table: partition -> (source end, replica end)."""
    rows = re.findall(r"^\s+demo-events-(\d+)\s+(\d+)\s+(\d+)\s+\d+$", output, re.MULTILINE)
    return {int(p): (int(source), int(replica)) for p, source, replica in rows}


# The suite's timeout (600 s, pyproject) would end it before its own deadline (seen at load 60,
# with slow package downloads): the deadline of `make demo` rules, plus room for the clone.
@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)
def test_make_demo_from_a_fresh_clone_as_a_user_who_is_not_root(
    new_user: tuple[str, Path],
) -> None:
    name, home = new_user
    clone, env = fresh_clone(name, home)
    # `make demo` fetches Kafka's jars and the tiered storage test jar: both shared.
    for shared in (KAFKA_CACHE, TIERED_CACHE):
        cache = clone / ".cache" / shared.name
        cache.mkdir(parents=True)
        (cache / "lib").symlink_to(shared / "lib")
    subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
    user = pwd.getpwnam(name)
    output = as_user(name, env, "make", "-C", str(clone), "demo", timeout=DEMO_TIMEOUT_S)
    assert as_user(name, env, "sh", "-c", "command -v kcat || true").strip() == ""
    assert "replicated in" in output and "done: the replica is in" in output, output[-3000:]
    # What the demo shows: every partition's replica ends where the source ends. (librdkafka
    # may also print a GETPID retry while the broker's transaction coordinator loads: seen at
    # load 50 in a demo that succeeded, a moment of the machine and not a result.)
    table = demo_table(output)
    assert sorted(table) == list(range(4)), output[-3000:]
    assert all(source == replica > 0 for source, replica in table.values()), output[-3000:]
    replica = clone / "var" / "data"
    assert replica.is_dir() and replica.stat().st_uid == user.pw_uid


def test_kcat_is_fetched_without_root_when_the_package_lists_are_empty(
    new_user: tuple[str, Path],
) -> None:
    """`make test`'s one peer from outside PyPI and Maven Central: `make test-peers` as a
    user who is not root, kcat not on PATH, apt's package lists empty (APT_CONFIG points
    apt at an empty directory, as a fresh container has)."""
    name, home = new_user
    clone, env = fresh_clone(name, home)
    empty_lists = home / "empty-package-lists"
    (empty_lists / "partial").mkdir(parents=True)
    apt_config = home / "apt.conf"
    apt_config.write_text(f'Dir::State::Lists "{empty_lists}";\n')
    subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
    env = {**env, "APT_CONFIG": str(apt_config)}
    as_user(name, env, "make", "-C", str(clone), "test-peers")
    kcat = as_user(name, env, str(clone / "tools" / "kcat.sh"), "path").strip()
    assert kcat == str(clone / ".cache" / "kcat" / "bin" / "kcat")
    assert as_user(name, env, kcat, "-V").startswith("kcat - Apache Kafka")
    # It had to fetch package lists of its own, into the clone.
    assert any((clone / ".cache" / "apt" / "lists").glob("*Packages*"))
