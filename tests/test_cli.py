"""The command line as a first-time user and a monitoring check meet it: start-up failures
are one line with a sysexits code, never a traceback, and `replicad status` leads with
health and exits 0 healthy, 1 degraded, 2 down, 3 unreachable."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from replicad import __version__
from replicad.cli import OWN_COMMANDS, _run_overrides, build_parser, main
from replicad.control.protocol import encode_request
from replicad.exits import EX_CANTCREAT, EX_CONFIG, EX_FAILURE
from replicad.types import TopicPartition
from tools.peers.produce import CheckedProducer
from tools.replica import ReplicadProcess, replicad_run, wait_until

REPLICAD = [sys.executable, "-m", "replicad.cli"]


def replicad(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if user is not None:
        prefix = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups"]
    return subprocess.run(
        [*prefix, *REPLICAD, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/nonexistent"} if user else None,
    )


def one_line_without_traceback(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_data_dir_that_cannot_be_created_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    args = [
        "run",
        "--bootstrap-servers",
        "127.0.0.1:9",
        "--topics",
        "orders",
        "--data-dir",
        str(tmp_path / "a-file" / "data"),
        "--control-socket",
        str(tmp_path / "control.sock"),
    ]
    for extra in (["--check-config"], []):
        result = replicad(*args, *extra)
        assert result.returncode == EX_CANTCREAT
        line = one_line_without_traceback(result.stderr)
        assert line.startswith("replicad: data_dir: ")
        assert "is not a directory" in line and "--data-dir" in line


def test_a_bad_key_is_one_line_naming_file_line_and_key(tmp_path: Path) -> None:
    config = tmp_path / "replicad.yaml"
    config.write_text(
        "source:\n  bootstrap_servers: [127.0.0.1:9]\ntopics:\n  include: [orders]\n"
        f"data_dir: {tmp_path / 'data'}\nfetch:\n  partition_max_bytes: big\n"
    )
    for extra in (["--check-config"], []):
        result = replicad("run", "-c", str(config), *extra)
        assert result.returncode == EX_CONFIG
        line = one_line_without_traceback(result.stderr)
        assert line.startswith(f"replicad: {config}:7: fetch.partition_max_bytes: "), line
    assert not (tmp_path / "data").exists()


def _nobody_cannot_run_this_checkout() -> str | None:
    """Why `nobody` cannot run this checkout's replicad, or None when it can. A clone in a
    directory nobody may enter (`mktemp -d` as root makes one of mode 0700) leaves the
    interpreter and the code out of its reach: the test then says so instead of failing."""
    probe = replicad("--version", user="nobody")
    if probe.returncode == 0:
        return None
    said = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return (
        f"user nobody cannot run {' '.join(REPLICAD)} from this checkout "
        f"(a directory above it may be closed to others): {said}"
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_a_user_who_may_not_write_there_is_told_so_by_name() -> None:
    """As a user who is not root (nobody): a data_dir in a root-owned directory."""
    unreachable = _nobody_cannot_run_this_checkout()
    if unreachable is not None:
        pytest.skip(unreachable)
    tmp_path = Path(tempfile.mkdtemp(prefix="replicad-root-only-"))
    tmp_path.chmod(0o755)  # nobody may look, not write
    (tmp_path / "root-only").mkdir(mode=0o755)
    args = ["run", "--bootstrap-servers", "127.0.0.1:9", "--topics", "orders"]
    result = replicad(
        *args,
        "--data-dir",
        str(tmp_path / "root-only" / "data"),
        "--control-socket",
        str(tmp_path / "root-only" / "control.sock"),
        "--check-config",
        user="nobody",
    )
    assert result.returncode == EX_CANTCREAT, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("replicad: data_dir: ") and "not writable by nobody" in lines[0]
    assert lines[1].startswith("replicad: control.socket: ")
    shutil.rmtree(tmp_path)


def status(sock: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return replicad("status", "--socket", str(sock), *extra)


def daemon(tmp_path: Path, bootstrap: str, topics: str) -> tuple[ReplicadProcess, Path]:
    sock = tmp_path / "control.sock"
    proc = replicad_run(bootstrap, topics, tmp_path / "data", control_socket=sock)
    wait_until(sock.exists, timeout_s=30, what="the control socket")
    return proc, sock


def test_status_of_a_daemon_whose_source_is_unreachable_is_down(tmp_path: Path) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening
    port = closed.getsockname()[1]
    proc, sock = daemon(tmp_path, f"127.0.0.1:{port}", "orders")
    try:
        wait_until(lambda: status(sock).returncode == 2, timeout_s=30, what="status to say down")
        table = status(sock)
        # A client gone before its reply was built (its timeout passed): counted in status.
        # The daemon is stopped while the client asks and leaves, so that it reads the
        # request only after the client has gone (a quiet daemon would answer first).
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as gone:
                gone.bind(f"\0replicad-test-gone-{os.getpid()}")
                gone.sendto(encode_request("status", 1), str(sock))
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: json.loads(status(sock, "--json").stdout)["control"]["abandoned"] >= 1,
            timeout_s=30,
            what="the gone client counted",
        )
        as_json = json.loads(status(sock, "--json", "--timeout", "30").stdout)
    finally:
        assert proc.stop() == 0, proc.output()
        closed.close()
    first = table.stdout.splitlines()
    assert first[0] == "health: DOWN"
    assert first[1].startswith("  - source unreachable") and f"127.0.0.1:{port}" in first[1]
    assert as_json["health"]["state"] == "down"
    assert as_json["health"]["reasons"][0]["code"] == "source_unreachable"
    # The warning the daemon logged is in the status too, counted.
    assert any(w["event"] == "metadata unavailable, retrying" for w in as_json["recent_warnings"])


def test_status_names_a_topic_the_source_lacks_and_is_healthy_without_it(
    kafka_broker, unique_topic, tmp_path: Path
) -> None:
    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap})
    for p in range(2):
        producer.produce(topic, value=b"x", partition=p)
    assert producer.flush(30) == 0
    misspelt = f"{topic}-misspelt"
    proc, sock = daemon(tmp_path / "a", kafka_broker.bootstrap, f"{topic},{misspelt}")
    try:
        wait_until(lambda: status(sock).returncode == 1, timeout_s=30, what="degraded")
        degraded = status(sock)
    finally:
        assert proc.stop() == 0, proc.output()
    assert degraded.stdout.splitlines()[:2] == [
        "health: DEGRADED",
        f"  - topic '{misspelt}' not found on the source",
    ]
    proc, sock = daemon(tmp_path / "b", kafka_broker.bootstrap, topic)
    try:
        wait_until(lambda: status(sock).returncode == 0, timeout_s=30, what="healthy")
        healthy = status(sock)
    finally:
        assert proc.stop() == 0, proc.output()
    assert healthy.stdout.splitlines()[0] == "health: HEALTHY"


def test_status_without_a_daemon_exits_3(tmp_path: Path) -> None:
    result = status(tmp_path / "nothing.sock")
    assert result.returncode == 3
    assert "not running" in result.stderr


def test_status_waits_for_the_answer_as_long_as_its_timeout_says(tmp_path: Path) -> None:
    """`--timeout SECONDS`: a daemon of 10,000 partitions under load took longer than the
    client's fixed 5 s to build its reply, and no client could ever get one (session 14).
    A socket that never answers: the message names the timeout asked; a timeout that is
    not above 0 is a usage error (3, as every status usage error)."""
    silent = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as never_answers:
        never_answers.bind(str(silent))
        result = status(silent, "--timeout", "0.5")
    assert result.returncode == 3, result.stderr
    assert "no answer within 0.5s" in result.stderr
    for bad in ("0", "-1", "soon"):
        refused = status(silent, "--timeout", bad)
        assert refused.returncode == 3 and "--timeout" in refused.stderr, refused.stderr


def test_status_does_not_load_the_spark_pipeline_and_every_command_is_still_parsed() -> None:
    """`replicad status` builds its parser without the pipeline's module (it imports the
    archive's store and the config loader: two thirds of status's start); the command line
    as a whole, help and `pipeline` included, still knows every command."""
    probe = (
        "import sys; from replicad.cli import main; code = main(sys.argv[1:]); "
        "print('replicad.spark.pipeline' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    missing = Path(tempfile.gettempdir()) / f"no-such-{os.getpid()}.sock"
    done = subprocess.run(
        [sys.executable, "-c", probe, "status", "--socket", str(missing), "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr

    def commands(word: str | None) -> list[str]:
        parser = build_parser(word)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sorted(sub.choices)

    everything = sorted([*OWN_COMMANDS, "pipeline"])
    assert commands(None) == commands("pipeline") == commands("statsu") == everything
    assert commands("status") == commands("verify") == sorted(OWN_COMMANDS)


def test_a_data_dir_another_daemon_holds_is_one_line_naming_its_pid(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with replicad_run("127.0.0.1:9", "orders", data_dir) as first:
        # The lock is taken when the logs are opened, before the (unreachable) source.
        first.wait_for(lambda: (data_dir / ".lock").exists(), timeout_s=60, what="the lock")
        second = replicad(
            "run", "--bootstrap-servers", "127.0.0.1:9", "--topics", "orders",
            "--data-dir", str(data_dir), "--control-socket", str(tmp_path / "second.sock"),
        )  # fmt: skip
    assert second.returncode == EX_FAILURE, second.stderr
    assert "Traceback" not in second.stderr, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith("replicad: data directory ") and f"(pid {first.pid})" in line, line


# -- Kafka's spellings, help on everything, exit codes within status's 0-3 (issue 36) --------


def _walk(parser: argparse.ArgumentParser, path: str = "replicad") -> Iterator[tuple[str, Any]]:
    """(command path, parser or action) for every parser and argument under `parser`."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")
        else:
            yield path, action


def test_every_command_option_and_positional_has_help_and_commands_a_description() -> None:
    missing = []
    for path, item in _walk(build_parser()):
        if isinstance(item, argparse.ArgumentParser):
            if path != "replicad" and not item.description:
                missing.append(f"{path}: no description")
            continue
        if not item.help or item.help == argparse.SUPPRESS:
            name = "/".join(item.option_strings) or item.dest
            missing.append(f"{path} {name}: no help")
    assert missing == []


def test_abbreviations_are_errors_not_guesses() -> None:
    for path, item in _walk(build_parser()):
        if isinstance(item, argparse.ArgumentParser):
            assert item.allow_abbrev is False, path
    result = replicad("run", "--bootstrap", "127.0.0.1:9", "--topic", "t", "--check-config")
    assert result.returncode == 2
    assert "unrecognized arguments: --bootstrap" in result.stderr


def test_version_short_and_long() -> None:
    for flag in ("-V", "--version"):
        result = replicad(flag)
        assert result.returncode == 0
        assert result.stdout.strip() == f"replicad {__version__}"


def test_defaults_are_shown_in_help() -> None:
    text = replicad("serve", "--help").stdout
    assert "(default: 127.0.0.1:9092)" in " ".join(text.split())
    assert "(default: 0)" in text  # --node-id


def test_kafkas_spellings_and_repeated_topics_are_the_same_config(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path / "d"), "--control-socket", str(tmp_path / "c.sock")]
    kafka_style = _run_overrides(
        build_parser().parse_args(
            ["run", "--bootstrap-server", "h:1", "--topic", "a", "--topic", "b,c", *base]
        )
    )
    ours = _run_overrides(
        build_parser().parse_args(["run", "--bootstrap-servers", "h:1", "--topics", "a,b,c", *base])
    )
    assert kafka_style == ours
    assert ours["topics.include"] == ["a", "b", "c"]
    regex = _run_overrides(build_parser().parse_args(["run", "--include", "orders\\..*", *base]))
    assert regex["topics.regex"] == "orders\\..*" and regex["topics.include"] == []


def test_status_usage_errors_and_unreadable_configs_exit_3_not_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {bootstrap_servers: ['h:1']}\ntopics: {include: [t]}\nfetch: 7\n")
    for args in (["--bogus"], ["--interval", "soon"], ["-c", str(bad)]):
        result = replicad("status", *args)
        assert result.returncode == 3, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert f"{bad}:3: fetch" in replicad("status", "-c", str(bad)).stderr


def test_a_stale_socket_is_named_as_stale(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as left_behind:
        left_behind.bind(str(path))  # closed on exit, its file stays: a SIGKILLed daemon's
    result = status(path)
    assert result.returncode == 3
    line = one_line_without_traceback(result.stderr)
    assert "not running" in line and "stale control socket" in line and str(path) in line


def test_kafka_spellings_replicate_and_run_serves_without_a_config_file(
    kafka_broker, unique_topic, tmp_path: Path, free_port: int
) -> None:
    first, second = unique_topic("a"), unique_topic("b")
    for topic in (first, second):
        kafka_broker.create_topic(topic, 1)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap})
    for topic in (first, second):
        for i in range(5):
            producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    sock = tmp_path / "control.sock"
    listen = f"127.0.0.1:{free_port}"
    proc = ReplicadProcess(
        [
            "run", "--bootstrap-server", kafka_broker.bootstrap,
            "--topic", first, "--topic", second,
            "--data-dir", str(tmp_path / "data"), "--control-socket", str(sock),
            "--serve-listen", listen, "--log-format", "json",
        ],
        log_path=tmp_path / "replicad.log",
        data_dir=tmp_path / "data",
        control_socket=sock,
    )  # fmt: skip
    with proc:
        proc.wait_caught_up({TopicPartition(first, 0): 5, TopicPartition(second, 0): 5})
        proc.wait_serving()
        wait_until(lambda: status(sock).returncode == 0, timeout_s=60, what="healthy")
        table = status(sock).stdout
        consumer = KafkaConsumer(
            bootstrap_servers=listen, auto_offset_reset="earliest", consumer_timeout_ms=20_000
        )
        consumer.assign([KafkaTopicPartition(second, 0)])
        values = [record.value for _, record in zip(range(5), consumer, strict=False)]
        consumer.close()
    assert f"serving on {listen}" in table
    assert values == [b"v%d" % i for i in range(5)]


def test_serves_group_flags_take_whole_milliseconds_from_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    serve = ["serve", "--data-dir", "d"]
    flag = "--group-initial-rebalance-delay-ms"
    assert build_parser().parse_args(serve).group_initial_rebalance_delay_ms == 3_000
    assert build_parser().parse_args([*serve, flag, "0"]).group_initial_rebalance_delay_ms == 0
    for bad, said in (("-5", "-5 is below 0"), ("3s", "'3s' is not a whole number of ms")):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*serve, flag, bad])
        assert exited.value.code == 2
        assert f"argument {flag}: {said}" in capsys.readouterr().err


def test_serves_group_flags_reach_its_coordinator_with_the_config_models_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from replicad import logs
    from replicad.config.model import GroupsConfig
    from replicad.groups.coordinator import CoordinatorConfig
    from replicad.leader import server

    given: dict[str, Any] = {}

    async def serve_forever(data_dir: Path, listen: str, **kwargs: Any) -> int:
        given.update(kwargs)
        return 0

    monkeypatch.setattr(server, "serve_forever", serve_forever)
    monkeypatch.setattr(logs, "configure_logging", lambda *args: None)
    serve = ["serve", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
    assert main([*serve, "--group-max-session-timeout-ms", "7000"]) == 0
    groups = GroupsConfig(max_session_timeout_ms=7000)
    assert given["group_config"] == CoordinatorConfig.from_config(groups)
    assert given["consumer_group_protocol"] is GroupsConfig().consumer_protocol
    assert main([*serve, "--no-group-consumer-protocol"]) == 0
    assert given["group_config"] == CoordinatorConfig.from_config(GroupsConfig())
    assert given["consumer_group_protocol"] is False
