"""tools/bench/mirror_path.py: the mirror's own path, in one process, mirrors every batch
of its log in coalesced runs (a short run: the bench's figure is its CPU time)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.mirror_path import mirror_all, write_log


def test_every_batch_is_mirrored_in_coalesced_runs(tmp_path: Path) -> None:
    plog = write_log(tmp_path, 600)
    try:
        sends, records = mirror_all(plog, 600, 64 * 1024)
    finally:
        plog.close()  # type: ignore[attr-defined]
    assert records == 600
    # About 100 one-record batches of ~600 bytes fit 64 KiB: runs, not one send a batch.
    assert 2 <= sends <= 20
