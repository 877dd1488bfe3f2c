"""The README holds to what the code does: every code block says its language; every shell
command runs in a test or says what it needs (`# needs: ...`); every replicad command line
parses; every make target exists; the Spark example runs as written, from the venv's python
without the venv on PATH; the columns and options it lists are the data source's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from replicad.cli import build_parser
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.spark.options import OPTION_NAMES
from replicad.spark.schema import RECORDS_ARROW
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LANGUAGES = {"sh", "text", "yaml", "python"}
NEEDS = re.compile(r"\s+#\s*needs:\s*(?P<what>.+)$")
# The README's commands that no marker excuses, and the test that runs each.
RUN_BY = {
    "make demo": (
        "tests/test_first_hour.py",
        "test_make_demo_from_a_fresh_clone_as_a_user_who_is_not_root",
    ),
    "make test": (".ci/run", "make test"),  # CI runs the README's test command: this suite
    "make kafka": (
        "tests/peers/test_localkafka.py",
        "test_serves_a_sample_topic_on_the_port_asked_for_until_interrupted",
    ),
    "make dist": (
        "tests/test_install.py",
        "test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user",
    ),
}


@dataclass(frozen=True)
class Block:
    language: str
    line: int
    text: str


def blocks() -> list[Block]:
    found = []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"^```(\S*)\s*$", lines[i])
        if match:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(match.group(1), i + 1, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return found


def shell_commands() -> list[tuple[str, str | None]]:
    """(command, what it needs or None) for every command of every `sh` block."""
    commands = []
    for block in blocks():
        if block.language != "sh":
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            needs = NEEDS.search(line)
            command = NEEDS.sub("", line).strip() if needs else line
            commands.append((command, needs.group("what") if needs else None))
    return commands


def test_every_code_block_says_its_language() -> None:
    found = blocks()
    assert found
    assert [b for b in found if b.language not in LANGUAGES] == []
    assert not re.search(r"\n\n    \S", README.read_text()), "an indented code block"


def test_every_shell_command_runs_in_a_test_or_says_what_it_needs() -> None:
    unmarked = {command for command, needs in shell_commands() if needs is None}
    assert unmarked == set(RUN_BY), "add the command's test to RUN_BY, or mark it"
    for path, name in RUN_BY.values():
        text = (ROOT / path).read_text()
        assert f"def {name}(" in text or name in text, (path, name)


def replicad_argv(command: str) -> list[str] | None:
    """The arguments of a command line that runs replicad (None if it runs none)."""
    words = shlex.split(command.split("&&")[0].split("|")[-1])
    if words[:1] == ["sudo"]:
        words = words[3:] if words[1:2] == ["-u"] else words[1:]
    if words and (words[0] == "replicad" or words[0].endswith("/bin/replicad")):
        return words[1:]
    return None


def test_every_replicad_command_line_parses() -> None:
    parser = build_parser()
    checked = 0
    for command, _ in shell_commands():
        argv = replicad_argv(command)
        if argv is None or argv == ["--version"]:
            continue
        parser.parse_args(argv)  # SystemExit (and a usage message) on an unknown flag
        checked += 1
    assert checked >= 4


def test_every_make_target_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = {m.group(1) for m in re.finditer(r"^([a-z][\w-]*):", makefile, re.M)}
    used = {
        word
        for command, _ in shell_commands()
        if command.startswith("make ")
        for word in command.split()[1:]
        if "=" not in word
    }
    assert used and used <= targets


def readme_bullet(name: str) -> str:
    text = README.read_text()
    start = text.index(f"- {name}")
    return text[start : text.index("\n- ", start + 1)]


def test_the_columns_listed_are_the_tables() -> None:
    listed = re.findall(r"`(\w+)`", readme_bullet("Columns").split("gzip")[0])
    assert [c for c in listed if c != "includeControl"] == RECORDS_ARROW.names


def test_the_options_listed_are_the_sources() -> None:
    listed = set(re.findall(r"`(\w+)`", readme_bullet("Options")))
    named = {o for o in listed if o in OPTION_NAMES or not o.islower()}
    # `path` is load()'s argument; the values quoted (records, batches, ...) are lower case.
    assert named == set(OPTION_NAMES) - {"path"}


def test_the_spark_example_runs_as_written_from_the_venvs_python(tmp_path: Path) -> None:
    """As the README says: after `make demo` (a replica of `demo-events` in var/data), from
    the repository's root, with `.venv/bin/python` and no venv on PATH."""
    (example,) = [b.text for b in blocks() if b.language == "python" and "replicad" in b.text]
    manager = LogManager.open(tmp_path / "var" / "data", LogConfig(), now_ms=0)
    for partition in range(2):
        log = manager.get_or_create(TopicPartition("demo-events", partition))
        for raw in batch_stream(partition, 10):
            log.append(raw, scan_batches(raw).batches, now_ms=0)
        manager.checkpoint({TopicPartition("demo-events", partition): log.log_end_offset})
    manager.close()
    (tmp_path / "example.py").write_text(example)
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYSPARK_PYTHON"}}
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    rows = [line for line in result.stdout.splitlines() if "demo-events" in line]
    assert len(rows) == 2, result.stdout


@pytest.mark.parametrize("flag", ["--data-dir", "--control-socket"])
def test_run_help_states_the_defaults(flag: str) -> None:
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    help_text = next(a.help for a in run._actions if flag in a.option_strings)
    assert "systemd" in help_text and "root" in help_text
