"""tools/bench/archive_lag's `replicad run` configs load as replicad loads them, and its table
reads right (the bench itself needs a broker, a bucket and minutes: it runs by hand)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from replicad.config import load_config
from replicad.config.model import PayloadSigning
from tools.bench.archive_lag import MIB, Archive, Pass, config_text, table


def test_every_passes_config_loads_and_only_the_archive_passes_archive(
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
    assert archived.archive.payload_signing is PayloadSigning.AUTO
    tuned = Archive("unsigned", upload_threads=3)
    path.write_text(config_text("127.0.0.1:9", tmp_path / "d", args, "b", "http://h:1", tuned))
    loaded = load_config(path).archive
    assert loaded is not None and loaded.upload_threads == 3
    assert loaded.payload_signing is PayloadSigning.UNSIGNED
    # A baseline's config names no key it may not know.
    baseline = Archive(baseline=tmp_path)
    text = config_text("127.0.0.1:9", tmp_path / "d", args, "b", "http://h:1", baseline)
    assert "payload_signing" not in text and "upload_threads" not in text


def test_the_table_gives_each_pass_its_cost_beyond_replication() -> None:
    off = Pass(None, 5.0, None, 2.0, 60.0, None, ())
    on = Pass(Archive("unsigned"), 6.0, 8.0, 4.0, 70.0, 3.0, ((1.0, 10.0),))
    rows = table([off, on], stored=2_000_000_000).splitlines()[2:]
    assert rows[0].startswith("| archive off | 5.0 | 400 | - | - | 2.0 | - | 60 | - | 1.00x |")
    # 2 CPU s more for 2 GB: 1.00 a GB; replication at 5/6 of the rate without uploads.
    assert rows[1] == (
        "| archive on, unsigned payload | 6.0 | 333 | 8.0 | 2.0 | 4.0 | 1.00 | 70 | 3.0 | 0.83x |"
    )
