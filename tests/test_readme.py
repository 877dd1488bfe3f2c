"""The README holds to what the code does: every code block says its language; every shell
command runs in a test or says what it needs (`# needs: ...`); every replicad command line
parses; every make target exists; the Spark example runs as written, from the venv's python
without the venv on PATH; the columns and options it lists are the data source's."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replicad.cli import build_parser
from replicad.config import config_from_mapping
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.spark.options import OPTION_NAMES
from replicad.spark.schema import RECORDS_ARROW
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream
from tools.peers.pki import Pki, make_test_pki
from tools.readme import README, blocks, shell_commands

ROOT = Path(__file__).resolve().parents[1]
QUICK_JVM = "-XX:TieredStopAtLevel=1"  # as tests/spark/conftest.py's
LANGUAGES = {"sh", "text", "yaml", "python"}
# The README's commands that no marker excuses, and the test that runs each.
RUN_BY = {
    "make demo": (
        "tests/test_first_hour.py",
        "test_make_demo_from_a_fresh_clone_as_a_user_who_is_not_root",
    ),
    "make test": (".ci/run", "make test"),  # CI runs the README's test command: this suite
    "make kafka": (
        "tests/peers/test_localkafka.py",
        "test_a_sample_topic_the_readmes_commands_replicate_until_ctrl_c",
    ),
    "make dist": (
        "tests/test_install.py",
        "test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user",
    ),
}
# Sections whose commands a test runs, marked or not (each in a stand-in: a temporary root
# for the install, a broker of the test's own for `make kafka`), but those that need
# systemd or a cluster.
SECTIONS_RUN_BY = {
    "Mirroring into a second Kafka, by hand": (
        "tests/peers/test_localkafka.py",
        "test_a_second_local_kafka_is_the_mirrors_destination_as_the_readme_says",
    ),
    "Trying it by hand": (
        "tests/peers/test_localkafka.py",
        "test_a_sample_topic_the_readmes_commands_replicate_until_ctrl_c",
    ),
    "Installing": (
        "tests/test_install.py",
        "test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user",
    ),
    "Running under systemd": (
        "tests/test_install.py",
        "test_the_wheel_installs_and_the_shipped_config_checks_as_the_service_user",
    ),
}


def test_every_code_block_says_its_language() -> None:
    found = blocks()
    assert found
    assert [b for b in found if b.language not in LANGUAGES] == []
    assert not re.search(r"\n\n    \S", README.read_text()), "an indented code block"


def test_every_shell_command_runs_in_a_test_or_says_what_it_needs() -> None:
    unmarked = {c.command for c in shell_commands() if c.needs is None}
    assert unmarked == set(RUN_BY), "add the command's test to RUN_BY, or mark it"
    sections = {c.section for c in shell_commands()}
    assert set(SECTIONS_RUN_BY) <= sections, "a section the tests run was renamed"
    for path, name in [*RUN_BY.values(), *SECTIONS_RUN_BY.values()]:
        text = (ROOT / path).read_text()
        assert f"def {name}(" in text or name in text, (path, name)


def replicad_argv(command: str) -> list[str] | None:
    """The arguments of a command line that runs replicad (None if it runs none)."""
    words = shlex.split(command.split("&&")[0].split("|")[-1])
    if words[:1] == ["sudo"]:
        words = words[3:] if words[1:2] == ["-u"] else words[1:]
    if words[:1] == ["env"]:
        words = list(itertools.dropwhile(lambda w: "=" in w, words[1:]))
    if words and (words[0] == "replicad" or words[0].endswith("/bin/replicad")):
        return words[1:]
    return None


def test_every_replicad_command_line_parses() -> None:
    parser = build_parser()
    checked = 0
    for c in shell_commands():
        argv = replicad_argv(c.command)
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
        for c in shell_commands()
        if c.command.startswith("make ")
        for word in c.command.split()[1:]
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
    # How PySpark starts its JVM, as the Spark tests' own sessions do (tests/spark/conftest.py:
    # the client compiler only, no web UI): the example's code is untouched, its driver JVM
    # starts in about half the time (C2's compile threads compete with the suite for 2 cores).
    submit = f"--driver-java-options {QUICK_JVM} --conf spark.ui.enabled=false pyspark-shell"
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**env, "PATH": path, "PYSPARK_SUBMIT_ARGS": submit},
        capture_output=True,
        text=True,
        # Only a hang reaches it: the local Spark session's start, at load 30, passed 300 s.
        timeout=540,
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


def placed_files(value: object, key: str, pki: Pki) -> object:
    """The README's example with each /etc/replicad file it names made for the test, of the
    kind its key wants (the loader reads certificates, passwords and users files)."""
    if isinstance(value, dict):
        return {k: placed_files(v, str(k), pki) for k, v in value.items()}
    if isinstance(value, list):
        return [placed_files(v, key, pki) for v in value]
    if not (isinstance(value, str) and value.startswith("/etc/replicad/")):
        return value
    certificates = {"cert_file": pki.broker_cert, "key_file": pki.broker_key, "ca_file": pki.ca}
    if key in certificates:
        return str(certificates[key])
    placed = pki.directory / Path(value).name
    if key == "users_file":
        password = pki.directory / "replica-password"
        password.write_text("a password\n")
        placed.write_text(f"replica:\n  password_file: {password}\n")
    else:
        assert key.endswith("password_file"), key
        placed.write_text("a password\n")
    return str(placed)


def test_the_yaml_examples_are_valid_config(tmp_path: Path) -> None:
    """Each `yaml` block, with the two keys every config needs, loads without a problem:
    its keys exist and its values pass their rules (a renamed key fails here)."""
    examples = [b for b in blocks() if b.language == "yaml"]
    assert examples
    pki = make_test_pki(tmp_path)
    for block in examples:
        example = yaml.safe_load(block.text)
        config = {"source": {"bootstrap_servers": ["127.0.0.1:9092"]}, "topics": {}}
        for section, keys in placed_files(example, "", pki).items():
            if isinstance(keys, dict):
                config.setdefault(section, {}).update(keys)
            else:  # a top-level value (data_dir)
                config[section] = keys
        config["topics"].setdefault("include", ["orders"])
        config_from_mapping(config, source=f"README.md:{block.line}")  # raises naming the key
