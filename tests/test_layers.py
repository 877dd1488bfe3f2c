"""tools/layers.py: replicad keeps its layers, and the check catches what would break them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.layers import (
    CORES,
    LAYERS,
    ROOT,
    Import,
    check,
    core_violations,
    cycles,
    graph,
    is_core,
    layer_of,
    main,
    module_name,
)


def test_replicad_keeps_its_layers() -> None:
    violations = check(graph())
    assert violations == [], "\n".join(v.text for v in violations)


def _copy_of_replicad(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "replicad", tmp_path / "replicad", ignore=shutil.ignore_patterns("*.pyc")
    )
    return tmp_path


def _layers_command(root: Path) -> subprocess.CompletedProcess[str]:
    """`python -m tools.layers` over the tree at `root`. The timeout is a hang's deadline:
    the check takes seconds, but 60 s was reached at load ~50 (an interpreter start and a
    parse of every module under a loaded machine)."""
    return subprocess.run(
        [sys.executable, "-m", "tools.layers", "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def _layers_main(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`tools.layers.main` over the tree at `root`, in this process (the modules it parsed
    before are not parsed again): its exit status and what it printed. The command itself,
    a process of its own, is run once (test_a_planted_upward_import_fails_the_check)."""
    capsys.readouterr()
    code = main(["--root", str(root)])
    return code, capsys.readouterr().out


def test_a_planted_upward_import_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_of_replicad(tmp_path)
    batch = root / "replicad" / "records" / "batch.py"
    # Inside a function, as a lazy import would be: it counts all the same.
    batch.write_text(
        batch.read_text() + "\n\ndef _planted():\n    from replicad.leader import server\n"
    )
    done = _layers_command(root)
    assert done.returncode == 1, done.stdout
    assert "replicad.records.batch:" in done.stdout
    assert "imports replicad.leader.server, a higher layer" in done.stdout
    code, out = _layers_main(ROOT, capsys)
    assert code == 0, out


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


def test_the_cores_import_no_io_and_read_no_clock() -> None:
    violations = core_violations()
    assert violations == [], "\n".join(v.text for v in violations)


def test_a_planted_asyncio_import_in_the_mirror_core_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_of_replicad(tmp_path)
    core = root / "replicad" / "mirror" / "partition_mirror.py"
    core.write_text(core.read_text() + "\n\ndef _planted():\n    import asyncio\n")
    code, out = _layers_main(root, capsys)
    assert code == 1, out
    assert "replicad.mirror.partition_mirror:" in out
    assert "imports asyncio, a sans-I/O core" in out


def test_a_planted_clock_in_a_core_fails_the_check(tmp_path: Path) -> None:
    root = _copy_of_replicad(tmp_path)
    for module, planted in [
        ("log/policy.py", "from replicad.clock import monotonic_ms\n"),
        ("session/cache.py", "import datetime\n\ndef _planted():\n    datetime.datetime.now()\n"),
        ("leader/fetch.py", "from time import monotonic\n"),
    ]:
        path = root / "replicad" / module
        path.write_text(path.read_text() + "\n" + planted)
    texts = sorted(v.text.split(":")[0] for v in core_violations(root))
    assert texts == ["replicad.leader.fetch", "replicad.log.policy", "replicad.session.cache"]


def test_every_core_the_architecture_names_is_checked() -> None:
    """docs/architecture.md's core column and CORES name the same modules."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("### Sans-I/O cores and their shells", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in table.splitlines():
        if row.startswith("| `replicad"):
            for path in re.findall(r"`(replicad/[\w/]+\.py)", row.split("|")[1]):
                named.add(module_name(ROOT / path, ROOT))
    assert named, "no core named in docs/architecture.md"
    assert sorted(m for m in named if not is_core(m)) == []
    modules = {module_name(p, ROOT) for p in (ROOT / "replicad").rglob("*.py")}
    assert [c for c in CORES if c not in modules] == []
