"""tools/bench/archive_lag's `replicad run` configs load as replicad loads them (the bench
itself needs a broker, a bucket and minutes: it runs by hand)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from replicad.config import load_config
from tools.bench.archive_lag import MIB, config_text


def test_both_passes_configs_load_and_only_the_second_archives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_ARCHIVE_SECRET", "not-a-secret")
    args = argparse.Namespace(segment_mib=64, segment_ms=1000)
    path = tmp_path / "run.yaml"
    path.write_text(config_text("127.0.0.1:9", tmp_path / "data", args, None, None))
    plain = load_config(path)
    assert plain.archive is None and plain.log.segment_bytes == 64 * MIB
    path.write_text(config_text("127.0.0.1:9", tmp_path / "data", args, "b", "http://h:1"))
    archived = load_config(path)
    assert archived.archive is not None and archived.archive.bucket == "b"
    assert archived.archive.endpoint == "http://h:1" and archived.log.segment_ms == 1000
    assert archived.archive.secret_access_key is not None
