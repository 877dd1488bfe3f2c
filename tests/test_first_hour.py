"""The README's first command as a new user meets it: `make demo` from a fresh clone, by a
user who is not root, on a machine where kcat is not on PATH (it is only a test peer).

The user gets nothing of ours installed: a clone of the committed tree, their own venv and
pip downloads. Only Apache Kafka's jars are shared (read-only) with this run, as the same
artifacts from Maven Central; the point is the user, not the download."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.peers.kafka import KAFKA_CACHE

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


def test_make_demo_from_a_fresh_clone_as_a_user_who_is_not_root(
    new_user: tuple[str, Path],
) -> None:
    name, home = new_user
    clone = home / "replicad"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    cache = clone / ".cache" / "kafka"
    cache.mkdir(parents=True)
    (cache / "lib").symlink_to(KAFKA_CACHE / "lib")
    subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
    path = path_without("kcat", home / "bin")
    user = pwd.getpwnam(name)
    env = {
        "HOME": str(home),
        "USER": name,
        "PATH": path,
        "LANG": "C.UTF-8",
        # The machine's own pip settings (an index mirror, a wheel directory) stay.
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
    }
    result = subprocess.run(
        ["runuser", "-u", name, "--", "make", "-C", str(clone), "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert (
        "kcat"
        not in subprocess.run(
            ["runuser", "-u", name, "--", "sh", "-c", "command -v kcat || true"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert "replicated in" in output and "done: the replica is in" in output, output[-3000:]
    replica = clone / "var" / "data"
    assert replica.is_dir() and replica.stat().st_uid == user.pw_uid
