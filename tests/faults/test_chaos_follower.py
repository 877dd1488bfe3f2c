"""tools/chaos/follower.py: where a scenario's `replicad run` gets its control socket."""

import os
from pathlib import Path

from replicad.config.rules import UNIX_SOCKET_PATH_MAX
from tools.chaos.follower import control_socket_path


def test_the_socket_stays_in_the_work_directory_when_its_path_fits(tmp_path: Path) -> None:
    assert control_socket_path(tmp_path, "replicad") == tmp_path / "replicad.sock"


def test_a_work_directory_too_deep_for_a_socket_gets_a_short_one(tmp_path: Path) -> None:
    # As under pytest-xdist: pytest's base, the worker's popen-gw1/ and a long test name.
    deep = tmp_path / ("popen-gw1" + "/test_replicad_follows_a_seeded_leader_move0" * 3)
    deep.mkdir(parents=True)
    path = control_socket_path(deep, "cluster-reassignment-0")
    assert len(os.fsencode(deep / "cluster-reassignment-0.sock")) > UNIX_SOCKET_PATH_MAX
    assert len(os.fsencode(path)) <= UNIX_SOCKET_PATH_MAX
    assert path.name == "cluster-reassignment-0.sock"
    assert path.parent.is_dir()
