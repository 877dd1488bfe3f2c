"""The README's install story, run as written in a temporary root: the commands of its
"Installing" and "Running under systemd" sections, each re-rooted (/opt/replicad, /etc/...,
/var/lib/replicad, /run/replicad under the temporary root), `sudo` dropped (the suite runs as
root) and `sudo -u replicad` made `runuser` to a throw-away system user made from the shipped
sysusers line, as `systemd-sysusers` would. Only what needs systemd itself (systemd-sysusers,
systemctl) is left out.

So `make dist` builds the wheel, it installs into a fresh venv made by the system's python3,
`replicad --version` answers, the files land with the owners and modes the README gives, and
the shipped config passes `--check-config` as the service user with the environment the
unit gives it -- a user without root's capabilities, reading the config through its group."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replicad import __version__
from tools.readme import ShellCommand, shell_commands

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("Installing", "Running under systemd")
# The README's absolute paths that the test moves under its temporary root.
REROOTED = (
    "/opt/replicad",
    "/etc/replicad",
    "/etc/systemd/system",
    "/usr/lib/sysusers.d",
    "/var/lib/replicad",
    "/run/replicad",
)
# The system's PATH, not this venv's: `python3` is the one a fresh machine has, and the
# service user may run it (root's own interpreters may sit where only root can look).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What a fresh Debian or Ubuntu has, under the temporary root.
FRESH_SYSTEM_DIRECTORIES = ("opt", "etc/systemd/system", "usr/lib/sysusers.d", "var/lib", "run")


@dataclass(frozen=True)
class Install:
    root: Path
    user: str  # stands in for `replicad`

    def rerooted(self, command: str) -> str:
        """The README's command, run here: re-rooted, `sudo` dropped, the user renamed."""
        pattern = "|".join(re.escape(p) for p in REROOTED)
        command = re.sub(rf"(?<![\w/.-])({pattern})(?=[/\s]|$)", rf"{self.root}\1", command)
        command = re.sub(r"\bsudo -u replicad\b", f"runuser -u {self.user} --", command)
        command = re.sub(r"\bsudo ", "", command)
        return re.sub(r"(?<=-[ogu] )replicad\b", self.user, command)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            # The machine's pip settings (an index mirror, a wheel directory) stay.
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", self.rerooted(command)],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        return result


def readme_install_commands() -> list[ShellCommand]:
    commands = [c for c in shell_commands() if c.section in SECTIONS]
    assert {c.section for c in commands} == set(SECTIONS), "a section was renamed"
    return commands


def needs_systemd(command: ShellCommand) -> bool:
    return "systemd" in (command.needs or "").split(", ")


@pytest.fixture
def install() -> Iterator[Install]:
    if os.geteuid() != 0:
        pytest.skip("the README's steps need root (CI runs as root)")
    # Not under pytest's own (0700) temp dir: the service user must be able to look in.
    root = Path(tempfile.mkdtemp(prefix="replicad-install-"))
    root.chmod(0o755)
    for directory in FRESH_SYSTEM_DIRECTORIES:
        (root / directory).mkdir(mode=0o755, parents=True)
    user = f"rd-svc-{secrets.token_hex(3)}"
    try:
        yield Install(root, user)
    finally:
        subprocess.run(["userdel", user], check=False, capture_output=True)
        shutil.rmtree(root)


def make_sysusers_user(install: Install, sysusers: Path) -> None:
    """What `systemd-sysusers` makes of the shipped line, with useradd."""
    (line,) = [x for x in sysusers.read_text().splitlines() if x and not x.startswith("#")]
    kind, name, uid, gecos, home, shell = shlex.split(line)
    assert (kind, name, uid) == ("u", "replicad", "-")
    subprocess.run(
        [
            *("useradd", "--system", "--user-group", "--no-create-home"),
            *("--comment", gecos, "--home-dir", install.rerooted(home), "--shell", shell),
            install.user,
        ],
        check=True,
    )


def mode_and_owner(path: Path) -> tuple[str, str, str]:
    return oct(path.stat().st_mode & 0o777), path.owner(), path.group()


def unit_settings(unit: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[:1].isalpha()
    )


def test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user(
    install: Install,
) -> None:
    # The README's `make dist`, into the temporary root, whose dist/ its later steps name.
    # -o: the running venv stands; this is about the wheel, not about making the venv again.
    dist = install.root / "dist"
    subprocess.run(
        ["make", "-C", ROOT, "-o", ".venv/.demo-installed", "dist", f"DIST={dist}"],
        check=True,
        capture_output=True,
    )
    assert [w.name for w in dist.glob("*.whl")] == [f"replicad-{__version__}-py3-none-any.whl"]

    ran: list[str] = []
    outputs: dict[str, str] = {}
    for step in readme_install_commands():
        if step.command == "make dist":
            continue
        if step.command == "sudo systemd-sysusers":
            share = install.root / "usr/lib/sysusers.d"
            make_sysusers_user(install, share / "replicad.conf")
            continue
        if needs_systemd(step):
            assert step.command.startswith("sudo systemctl "), step
            continue
        outputs[step.command] = install.run(step.command).stdout
        ran.append(step.command)

    venv = install.root / "opt/replicad"
    version = next(out for cmd, out in outputs.items() if cmd.endswith("replicad --version"))
    assert version.strip() == f"replicad {__version__}"
    shipped = venv / "share" / "replicad"
    assert {p.name for p in shipped.iterdir()} == {
        "replicad.yaml",
        "replicad.service",
        "replicad.sysusers",
    }

    # Owners and modes as the README says.
    user = install.user
    assert mode_and_owner(install.root / "etc/replicad") == ("0o750", "root", user)
    assert mode_and_owner(install.root / "etc/replicad/replicad.yaml") == ("0o640", "root", user)
    for directory in ("var/lib/replicad", "run/replicad"):
        assert mode_and_owner(install.root / directory) == ("0o750", user, user)

    # The check ran as the service user, with the environment the unit gives it, and the
    # command it checked is the drop-in's ExecStart.
    (check,) = [c for c in ran if c.endswith("--check-config")]
    assert check.startswith("sudo -u replicad env ")
    words = shlex.split(check)[4:]
    environment = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    unit = unit_settings((install.root / "etc/systemd/system/replicad.service").read_text())
    assert unit["User"] == unit["Group"] == "replicad"
    assert environment == {
        "STATE_DIRECTORY": f"/var/lib/{unit['StateDirectory']}",
        "RUNTIME_DIRECTORY": f"/run/{unit['RuntimeDirectory']}",
    }
    drop_in = install.root / "etc/systemd/system/replicad.service.d/venv.conf"
    exec_start = drop_in.read_text().splitlines()[-1].removeprefix("ExecStart=")
    checked = [install.rerooted(w) for w in words[len(environment) :]]
    assert checked == [*shlex.split(exec_start), "--check-config"]
    state = install.root / "var/lib/replicad"
    runtime = install.root / "run/replicad"
    assert outputs[check].strip() == (
        f"configuration OK (data_dir {state}/data, control.socket {runtime}/control.sock)"
    )
    assert not (state / "data").exists()  # checked, not created
