"""Shared fixtures for the control-socket tests: running code as another user."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

NOBODY_UID = 65534
NOBODY_GID = 65534


def _run_as(uid: int, gid: int, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a forked child with `uid`/`gid`; return its result or raise its exception.

    A fork rather than a new interpreter: the venv's python may sit where that user
    cannot read it.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            outcome: tuple[str, Any] = ("ok", fn())
        except BaseException as exc:
            outcome = ("raised", exc)
        with os.fdopen(write_end, "wb") as pipe:
            pickle.dump(outcome, pipe)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "raised":
        raise value
    return value


@pytest.fixture
def run_as_nobody() -> Callable[[Callable[[], Any]], Any]:
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    return lambda fn: _run_as(NOBODY_UID, NOBODY_GID, fn)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="replicad-ctl-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
