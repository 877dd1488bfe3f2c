"""`python -m replicad` is the `replicad` command (tools/layers.py places replicad.__main__
above the CLI; it once named a module that did not exist)."""

import subprocess
import sys

from replicad import __version__


def test_python_dash_m_replicad_runs_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replicad", "--version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"replicad {__version__}"


def test_a_usage_error_exits_as_the_script_does() -> None:
    def run(module: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", module, "no-such-command"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    ours, script = run("replicad"), run("replicad.cli")
    assert ours.returncode == script.returncode != 0
    assert "no-such-command" in ours.stderr
