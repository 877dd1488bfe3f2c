"""tools/layers.py: replicad keeps its layers, and the check catches what would break them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tools.layers import LAYERS, ROOT, Import, check, cycles, graph, layer_of


def test_replicad_keeps_its_layers() -> None:
    violations = check(graph())
    assert violations == [], "\n".join(v.text for v in violations)


def _copy_of_replicad(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "replicad", tmp_path / "replicad", ignore=shutil.ignore_patterns("*.pyc")
    )
    return tmp_path


def test_a_planted_upward_import_fails_the_check(tmp_path: Path) -> None:
    root = _copy_of_replicad(tmp_path)
    batch = root / "replicad" / "records" / "batch.py"
    # Inside a function, as a lazy import would be: it counts all the same.
    batch.write_text(
        batch.read_text() + "\n\ndef _planted():\n    from replicad.leader import server\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tools.layers", "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout
    assert "replicad.records.batch:" in done.stdout
    assert "imports replicad.leader.server, a higher layer" in done.stdout
    untouched = subprocess.run(
        [sys.executable, "-m", "tools.layers"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert untouched.returncode == 0, untouched.stdout


def test_a_cycle_within_one_layer_fails_and_is_named(tmp_path: Path) -> None:
    root = _copy_of_replicad(tmp_path)
    (root / "replicad" / "log" / "planted_a.py").write_text("from replicad.log import planted_b\n")
    (root / "replicad" / "log" / "planted_b.py").write_text(
        "def f():\n    from replicad.log.planted_a import x\n"
    )
    texts = [v.text for v in check(graph(root))]
    assert texts == [
        "import cycle: replicad.log.planted_a -> replicad.log.planted_b -> replicad.log.planted_a"
    ]


def test_siblings_in_one_layer_may_not_import_each_other() -> None:
    edges = [
        Import("replicad.follower.fetcher", "replicad.leader.frames", 7),
        # Within one entry, and down to a lower layer, is allowed.
        Import("replicad.leader.server", "replicad.leader.frames", 3),
        Import("replicad.leader.server", "replicad.protocol.codec", 4),
    ]
    assert [v.text for v in check(edges)] == [
        "replicad.follower.fetcher:7 imports replicad.leader.frames, sideways "
        "(replicad.leader and replicad.follower are siblings: share what lies below)"
    ]


def test_a_module_in_no_layer_is_named() -> None:
    edges = [Import("replicad.newthing.core", "replicad.types", 3)]
    assert [v.text for v in check(edges)] == [
        "replicad.newthing.core: in no layer (add it to LAYERS)"
    ]


def test_the_most_specific_entry_places_a_module() -> None:
    layers = (("replicad.types",), ("replicad.config",), ("replicad.config.loader",))
    assert layer_of("replicad.config.model", layers) == 1
    assert layer_of("replicad.config.loader", layers) == 2
    assert layer_of("replicad.typesetting", layers) is None
    assert layer_of("replicad", LAYERS) == 0 and layer_of("replicad.nowhere", LAYERS) is None


def test_a_chain_is_no_cycle() -> None:
    assert cycles([Import("a", "b", 1), Import("b", "c", 1)]) == []
    assert cycles([Import("a", "b", 1), Import("b", "c", 1), Import("c", "a", 2)]) == [
        ("a", "b", "c", "a")
    ]
