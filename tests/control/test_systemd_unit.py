"""systemd/replicad.service: systemd's own tools accept it and rate its exposure <= 2.0."""

from __future__ import annotations

import pwd
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "replicad.service"
SYSUSERS = ROOT / "systemd" / "replicad.sysusers"
INSTALLED_BINARY = "/usr/local/bin/replicad"
MAX_EXPOSURE = 2.0
EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def directives(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of the unit; a key may repeat (SystemCallFilter=)."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found[key].append(value)
    return found


def venv_replicad() -> Path:
    """The replicad entry point next to the interpreter running the tests."""
    candidate = Path(sys.executable).parent / "replicad"
    if not candidate.exists():
        pytest.skip(f"no replicad entry point at {candidate}")
    return candidate


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify insists the ExecStart binary exists; point a copy of the unit at the venv's.
    copy = tmp_path / "replicad.service"
    copy.write_text(UNIT.read_text().replace(INSTALLED_BINARY, str(venv_replicad())))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "replicad.service" not in result.stderr  # no warnings about our unit either


def test_security_exposure_is_at_most_2() -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = EXPOSURE.search(result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_the_unit_has_what_the_issue_asks_for() -> None:
    unit = directives(UNIT.read_text())
    expected = {
        "Type": "notify",
        "Restart": "on-failure",
        "User": "replicad",
        "StateDirectory": "replicad",
        "RuntimeDirectory": "replicad",
        "ConfigurationDirectory": "replicad",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "UMask": "0027",
        "ExecStart": f"{INSTALLED_BINARY} run -c /etc/replicad/replicad.yaml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
    }
    for key, value in expected.items():
        assert unit[key] == [value], key
    assert unit["SystemCallFilter"][0] == "@system-service"
    assert int(unit["LimitNOFILE"][0]) >= 65536
    assert unit["WatchdogSec"] and "DynamicUser" not in unit


def test_sysusers_creates_the_dedicated_user() -> None:
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed")
    result = subprocess.run(
        ["systemd-sysusers", "--dry-run", str(SYSUSERS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    if not _user_exists("replicad"):  # else there is nothing to create
        assert "user 'replicad'" in result.stdout + result.stderr


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
