"""What `--check-config` and `run` find before starting: paths that cannot be created,
written or read, each named by its key with a fix and a sysexits code."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from replicad.config.model import Config, ControlConfig, SecurityConfig, SourceConfig, TlsConfig
from replicad.config.preflight import preflight
from replicad.exits import EX_CANTCREAT, EX_CONFIG, EX_NOPERM


def config(tmp_path: Path, **fields: object) -> Config:
    values: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "control": ControlConfig(socket=tmp_path / "run" / "control.sock"),
    }
    values.update(fields)
    return dataclasses.replace(Config(), **values)


def test_paths_that_can_be_created_pass(tmp_path: Path) -> None:
    assert preflight(config(tmp_path)) == ()
    assert not (tmp_path / "data").exists()  # nothing was created


def test_a_data_dir_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    problems = preflight(config(tmp_path, data_dir=tmp_path / "file" / "data"))
    assert [p.key for p in problems] == ["data_dir"]
    assert problems[0].exit_code == EX_CANTCREAT
    assert "is not a directory" in problems[0].line()
    assert "--data-dir" in problems[0].fix


def test_a_data_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("")
    problems = preflight(config(tmp_path))
    assert problems[0].key == "data_dir" and problems[0].exit_code == EX_CONFIG


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_directories_not_writable_by_this_user(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        problems = preflight(
            config(
                tmp_path,
                data_dir=locked / "data",
                control=ControlConfig(socket=locked / "control.sock"),
            )
        )
    finally:
        locked.chmod(0o700)
    assert [(p.key, p.exit_code) for p in problems] == [
        ("data_dir", EX_CANTCREAT),
        ("control.socket", EX_NOPERM),
    ]


def test_tls_files_that_are_missing_are_named(tmp_path: Path) -> None:
    tls = TlsConfig(ca_file=tmp_path / "ca.pem", cert_file=tmp_path)
    source = dataclasses.replace(SourceConfig(), security=SecurityConfig(tls=tls))
    problems = preflight(config(tmp_path, source=source))
    assert [(p.key, p.reason) for p in problems] == [
        ("source.security.tls.ca_file", "no such file"),
        ("source.security.tls.cert_file", "not a file"),
    ]


def test_a_default_socket_too_long_to_bind_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default socket lies under the user's state directory; under a deep home it is
    longer than bind() takes (the rule on the key checks only a path that was given)."""
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ("deep" * 30)))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    default = dataclasses.replace(Config(), data_dir=tmp_path / "data")
    (problem,) = preflight(default)
    assert (problem.key, problem.exit_code) == ("control.socket", EX_CONFIG)
    assert problem.path == default.control.socket
    assert "at most 107 bytes" in problem.reason and "--control-socket" in problem.fix
