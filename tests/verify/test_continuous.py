"""`replicad run` with `verify: enabled` (replicad/verify/continuous.py) on a real Kafka source.

One replica is made with the check off; one byte of it is flipped while no daemon runs (as
damage on disk would be); then the daemon runs with the check on while more records
arrive: every partition is verified up to its end, status (JSON and table) and the log name
the damaged partition and offset, the metrics say how far each partition is verified, and
the offsets saved for a restart are held at the mismatch.
"""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from replicad.log.checkpoint import parse_offsets, read_text
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.verify.continuous import VERIFY_CHECKPOINT
from tools.peers.produce import produce_numbered
from tools.replica import replicad_cli, replicad_run
from tools.wait import wait_until

PARTITIONS = 2
FIRST, MORE = 300, 100


def _metrics(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_daemon_verifies_to_the_end_and_names_a_flipped_byte(
    kafka_broker, unique_topic, tmp_path, free_port
):
    topic = unique_topic
    kafka_broker.create_topic(topic, PARTITIONS)
    produce_numbered(kafka_broker.bootstrap, topic, PARTITIONS, FIRST)
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir) as proc:
        proc.wait_caught_up({TopicPartition(topic, p): FIRST for p in range(PARTITIONS)})

    segment = sorted((data_dir / f"{topic}-1").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    batches = scan_batches(memoryview(bytes(data))).batches
    victim = batches[len(batches) // 2]
    data[victim.position + victim.size - 3] ^= 0x01  # a byte of its records
    segment.write_bytes(bytes(data))

    sock = tmp_path / "c.sock"
    config = {
        "verify": {"enabled": True, "max_bytes_per_second": 10_000_000, "interval_ms": 100},
        "control": {"metrics_listen": f"127.0.0.1:{free_port}"},
    }
    run = replicad_run(
        kafka_broker.bootstrap,
        [topic],
        data_dir,
        config=config,
        control_socket=sock,
        log_path=tmp_path / "verify.log",
    )
    with run as proc:
        produce_numbered(kafka_broker.bootstrap, topic, PARTITIONS, MORE, b"w")
        end = FIRST + MORE

        def verified() -> dict[int, int]:
            snap = proc.status() or {}
            rows = (snap.get("verify") or {}).get("partitions") or ()
            return {row["partition"]: row["verified_offset"] for row in rows}

        wait_until(
            lambda: verified() == dict.fromkeys(range(PARTITIONS), end),
            timeout_s=120,
            what="every partition verified to its end",
        )
        snap = proc.status()
        assert snap is not None
        assert snap["health"]["state"] == "degraded"
        (reason,) = [r for r in snap["health"]["reasons"] if r["code"] == "verify_mismatch"]
        assert f"{topic}-1 at offset {victim.base_offset} (different_bytes)" in reason["text"]
        rows = {row["partition"]: row for row in snap["verify"]["partitions"]}
        assert rows[0]["mismatch_count"] == 0 and rows[0]["batches_compared"] > 0
        assert rows[1]["mismatch_count"] == 1
        (mismatch,) = rows[1]["mismatches"]
        assert (mismatch["offset"], mismatch["kind"]) == (victim.base_offset, "different_bytes")
        assert "fails its CRC" in mismatch["detail"]

        table = replicad_cli("status", "--socket", str(sock))
        assert table.returncode == 1, table.stderr
        assert f"ERROR at offset {victim.base_offset}: different_bytes" in table.stdout

        logged = [
            json.loads(line)
            for line in proc.output().splitlines()
            if "the replica differs from the source" in line
        ]
        assert [(e["tp"], e["offset"]) for e in logged] == [(f"{topic}-1", victim.base_offset)]

        # Saved for a restart: held at the mismatch, so the next run finds it again.
        def saved() -> dict[TopicPartition, int]:
            text = read_text(data_dir / VERIFY_CHECKPOINT)
            return parse_offsets(text, source="test") if text else {}

        held = {TopicPartition(topic, 0): end, TopicPartition(topic, 1): victim.base_offset}
        wait_until(lambda: saved() == held, timeout_s=60, what="the verified offsets saved")

        samples = _metrics(free_port)
        for partition in range(PARTITIONS):
            labels = (("partition", str(partition)), ("topic", topic))
            assert samples[("replicad_verified_offset", labels)] == end
        assert samples[("replicad_verify_mismatches", ())] == 1
