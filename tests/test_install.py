"""The README's install story, its steps that need no systemd, in a temporary root: `make
dist` builds a wheel, the wheel installs into a fresh venv (as under /opt/replicad),
`replicad --version` answers, and the shipped config passes `--check-config` as the
service user runs it (its own state and runtime directories, the config readable through
its group only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad import __version__

ROOT = Path(__file__).resolve().parents[1]
SERVICE_USER = "nobody"  # stands in for the `replicad` system user (systemd/replicad.sysusers)
SERVICE_GROUP = "nogroup"


def run(*argv: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs
    )
    assert result.returncode == 0, f"{argv}: {result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def fake_root() -> Iterator[Path]:
    # Not under pytest's own (0700) temp dir: the service user must be able to look in.
    root = Path(tempfile.mkdtemp(prefix="replicad-install-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user(
    fake_root: Path,
) -> None:
    dist = fake_root / "dist"
    # -o: the running venv stands; this is about the wheel, not about making the venv again.
    run("make", "-C", ROOT, "-o", ".venv/.demo-installed", "dist", f"DIST={dist}")
    wheels = list(dist.glob("replicad-*.whl"))
    assert len(wheels) == 1, wheels

    venv = fake_root / "opt" / "replicad"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "--quiet", wheels[0])
    version = run(venv / "bin" / "replicad", "--version")
    assert version.stdout.strip() == f"replicad {__version__}"
    shipped = venv / "share" / "replicad"
    assert {p.name for p in shipped.iterdir()} == {
        "replicad.yaml",
        "replicad.service",
        "replicad.sysusers",
    }

    if os.geteuid() != 0:
        pytest.skip("the service-user steps need root to create that user's directories")
    etc = fake_root / "etc" / "replicad"
    etc.mkdir(parents=True)
    config = etc / "replicad.yaml"
    shutil.copy(shipped / "replicad.yaml", config)
    shutil.chown(config, "root", SERVICE_GROUP)
    config.chmod(0o640)  # as the README says: root owns it, the service's group reads it
    state, runtime = fake_root / "var/lib/replicad", fake_root / "run/replicad"
    for directory in (state, runtime):
        directory.mkdir(parents=True)
        shutil.chown(directory, SERVICE_USER, SERVICE_GROUP)
        directory.chmod(0o750)
    check = subprocess.run(
        [
            "setpriv",
            f"--reuid={SERVICE_USER}",
            f"--regid={SERVICE_GROUP}",
            "--clear-groups",
            str(venv / "bin" / "replicad"),
            "run",
            "-c",
            str(config),
            "--check-config",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        # What systemd sets for StateDirectory=replicad and RuntimeDirectory=replicad.
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": "/nonexistent",
            "STATE_DIRECTORY": str(state),
            "RUNTIME_DIRECTORY": str(runtime),
        },
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == (
        f"configuration OK (data_dir {state}/data, control.socket {runtime}/control.sock)"
    )
    assert not (state / "data").exists()  # checked, not created
