"""`make kafka`: a broker on a fixed port with a sample topic, stopped cleanly by Ctrl-C; and
the README's "Trying it by hand" against it, as written (the port and the venv the test's)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tools.peers.process import dies_with_us, free_port
from tools.peers.produce import READ_UNCOMMITTED, consume_all, produce_mixed
from tools.readme import blocks, shell_commands
from tools.replica import end_offsets, wait_until

READY = "Kafka is up at"
SECTION = "Trying it by hand"
VENV_BIN = Path(sys.executable).parent


def readme_commands(port: int) -> list[list[str]]:
    """The section's commands after `make kafka`, for a broker on `port`, with this venv."""
    commands = [c.command for c in shell_commands() if c.section == SECTION]
    assert commands[0] == "make kafka", commands
    return [
        [
            str(VENV_BIN / "replicad") if word == ".venv/bin/replicad" else word
            for word in shlex.split(command.replace("127.0.0.1:9092", f"127.0.0.1:{port}"))
        ]
        for command in commands[1:]
    ]


def the_readmes_commands_replicate_the_sample_topic(port: int, cwd: Path) -> None:
    run, status, verify = readme_commands(port)
    assert run[1] == "run" and status[1] == "status" and verify[1] == "verify"
    daemon = subprocess.Popen(
        run, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=dies_with_us()
    )
    try:
        source = consume_all(f"127.0.0.1:{port}", "demo", isolation=READ_UNCOMMITTED)
        data_dir = cwd / "var" / "try" / "data"

        def caught_up() -> bool:
            ends = end_offsets(data_dir) if data_dir.is_dir() else {}
            return len(ends) == len(source) and subprocess.run(status, cwd=cwd).returncode == 0

        wait_until(caught_up, timeout_s=60, what="the replica to catch up, status healthy")
        shown = subprocess.run(status, cwd=cwd, capture_output=True, text=True)
        assert shown.returncode == 0 and shown.stdout.startswith("health: HEALTHY"), shown
        verified = subprocess.run(verify, cwd=cwd, capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        daemon.send_signal(signal.SIGINT)  # Ctrl-C in the README's terminal
        output = daemon.communicate(timeout=60)[0].decode()
    assert daemon.returncode == 0 and "Traceback" not in output, output


def test_a_sample_topic_the_readmes_commands_replicate_until_ctrl_c(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.localkafka", "--port", str(port), "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if READY in line:
                break
        assert any(f"{READY} 127.0.0.1:{port} with topic 'demo'" in line for line in lines), lines
        records = consume_all(f"127.0.0.1:{port}", "demo", isolation=READ_UNCOMMITTED)
        assert sum(len(r) for r in records.values()) >= 3_000  # plus aborted transactions
        # A second terminal, as the README goes on.
        try_dir = tmp_path / "checkout"
        try_dir.mkdir()
        the_readmes_commands_replicate_the_sample_topic(port, try_dir)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    java = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert java.stdout == "", "the broker outlived make kafka"


MIRROR_SECTION = "Mirroring into a second Kafka, by hand"
NO_TOPICS = "with no topics"


def start_local_kafka(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`python -m tools.localkafka ARGS` until it says it is up (its lines so far)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.localkafka", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:  # ends at the broker's first line after READY, or its exit
        lines.append(line)
        if READY in line:
            break
    return proc, lines


def test_a_second_local_kafka_is_the_mirrors_destination_as_the_readme_says(
    kafka_broker, unique_topic, tmp_path: Path
) -> None:
    """`make kafka PORT=9093 NAME=dest` (the target's command line) and the README's mirror
    section as written: its config (the session broker as the source, a topic of the test's
    with transactions in place of `demo`) and its commands; a consumer group's offsets
    follow (`groups:`), and status lists the group."""
    make_kafka, run, status = [c.command for c in shell_commands() if c.section == MIRROR_SECTION]
    assert make_kafka.startswith("make kafka PORT=9093 NAME=dest")
    (config_block,) = [b for b in blocks() if b.section == MIRROR_SECTION and b.language == "yaml"]
    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    produce_mixed(kafka_broker.bootstrap, topic, partitions=2, records=400, seed=3)
    group = f"app-{topic}"
    commit_offsets(kafka_broker.bootstrap, topic, group, {0: 50, 1: 50})
    port = free_port()
    dest_proc, lines = start_local_kafka(
        "--port", str(port), "--name", "dest", "--workdir", str(tmp_path / "dest")
    )
    dest = f"127.0.0.1:{port}"
    try:
        assert any(f"{READY} {dest}, {NO_TOPICS}" in line for line in lines), lines
        assert not any("--topics demo" in line for line in lines), lines
        config = yaml.safe_load(
            config_block.text.replace("127.0.0.1:9092", kafka_broker.bootstrap)
            .replace("127.0.0.1:9093", dest)
            .replace("[demo]", f"[{topic}]")
        )
        (tmp_path / "var" / "try").mkdir(parents=True)
        (tmp_path / "var" / "try" / "mirror.yaml").write_text(yaml.safe_dump(config))
        venv = {".venv/bin/replicad": str(VENV_BIN / "replicad")}
        run_argv = [venv.get(w, w) for w in shlex.split(run)]
        status_argv = [venv.get(w, w) for w in shlex.split(status)]
        daemon = subprocess.Popen(
            run_argv,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=dies_with_us(),
        )
        try:

            def mirrored() -> bool:
                shown = subprocess.run(
                    [*status_argv, "--json"], cwd=tmp_path, capture_output=True, text=True
                )
                if shown.returncode != 0:
                    return False
                mirror = json.loads(shown.stdout).get("mirror", {})
                parts = mirror.get("partitions", [])
                synced = (mirror.get("groups") or {}).get("groups", {}).get(group, {})
                return (
                    len(parts) == 2
                    and all(p["lag"] == 0 and (p["local_high_watermark"] or 0) > 0 for p in parts)
                    and synced.get("partitions") == 2
                    and synced.get("last_sync_ms") is not None
                )

            wait_until(mirrored, timeout_s=120, what="the mirror to catch up, status healthy")
            table = subprocess.run(status_argv, cwd=tmp_path, capture_output=True, text=True)
        finally:
            daemon.send_signal(signal.SIGINT)
            output = daemon.communicate(timeout=60)[0].decode()
        assert daemon.returncode == 0 and "Traceback" not in output, output
        assert "MIRROR" in table.stdout, table.stdout
        assert "GROUPS synced 1" in table.stdout and group in table.stdout, table.stdout
        # Translated: at most 50 (the markers before it take no offset at the destination).
        there = committed_offsets(dest, topic, group)
        assert all(there[p] is not None and there[p] <= 50 for p in (0, 1)), there
        source = consume_all(kafka_broker.bootstrap, topic)
        copied = consume_all(dest, topic)
        assert {p: [(r.key, r.value) for r in rs] for p, rs in copied.items()} == {
            p: [(r.key, r.value) for r in rs] for p, rs in source.items()
        }
    finally:
        dest_proc.send_signal(signal.SIGINT)
        assert dest_proc.wait(timeout=60) == 0


def commit_offsets(bootstrap: str, topic: str, group: str, offsets: dict[int, int]) -> None:
    """`group` commits `offsets` without joining (assign, as an admin or Spark would)."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    consumer.assign([KTP(topic, p) for p in offsets])
    consumer.commit({KTP(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    consumer.close()


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        return {p: consumer.committed(KTP(topic, p)) for p in (0, 1)}
    finally:
        consumer.close()
