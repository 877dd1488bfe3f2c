"""tools/peers/kcat.py: kcat (fetched by tools/kcat.sh) reads what a client wrote to Kafka."""

from __future__ import annotations

import pytest

from tools.peers.kcat import run_kcat
from tools.peers.process import PeerError, PeerNotInstalledError
from tools.peers.produce import consume_all, produce_mixed


def test_kcat_reads_every_committed_record_with_its_offset(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 1)
    produce_mixed(kafka_broker.bootstrap, unique_topic, partitions=1, records=300, seed=5)
    expected = consume_all(kafka_broker.bootstrap, unique_topic)[0]
    result = run_kcat(
        "-C",
        "-b",
        kafka_broker.bootstrap,
        "-t",
        unique_topic,
        "-p",
        "0",
        "-o",
        "beginning",
        "-e",
        "-q",
        "-X",
        "isolation.level=read_committed",
        "-f",
        "%o\\n",
    )
    offsets = [int(line) for line in result.stdout.split()]
    assert offsets == [r.offset for r in expected]


def test_a_failing_kcat_raises_with_its_stderr(free_port):
    with pytest.raises(PeerError, match="kcat"):
        run_kcat("-L", "-b", f"127.0.0.1:{free_port}", "-m", "1", timeout_s=30)


def test_missing_kcat_points_at_its_fetch_script(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("tools.peers.kcat.UNPACKED", tmp_path / "no-kcat")
    with pytest.raises(PeerNotInstalledError, match=r"tools/kcat\.sh fetch"):
        run_kcat("-V")


def test_kcat_unpacked_without_root_is_used_when_none_is_on_path(monkeypatch, tmp_path):
    unpacked = tmp_path / "kcat"
    unpacked.write_text("#!/bin/sh\necho 'kcat - unpacked'\n")
    unpacked.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("tools.peers.kcat.UNPACKED", unpacked)
    assert run_kcat("-V").stdout == b"kcat - unpacked\n"
