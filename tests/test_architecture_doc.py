"""docs/architecture.md held to the code: every `path:name` it cites exists, every layer of
tools/layers.py is in its table, and the README links it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tools.layers import LAYERS, ROOT

DOC = ROOT / "docs" / "architecture.md"
# `replicad/x/y.py:Name` or `replicad/x/y.py:Class.method`, inside backticks.
CITATION = re.compile(r"`(replicad/[\w/]+\.py):([\w.]+)`")
CITED_PATH = re.compile(r"`(replicad/[\w/]+\.py)`")


def defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of a module, and `Class.method` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
    return names


def missing_citations(text: str, root: Path) -> list[str]:
    missing = []
    for path in sorted(set(CITED_PATH.findall(text))):
        if not (root / path).is_file():
            missing.append(path)
    for path, name in sorted(set(CITATION.findall(text))):
        if (root / path).is_file() and name not in defined_names(root / path):
            missing.append(f"{path}:{name}")
    return missing


def test_every_cited_module_and_name_exists() -> None:
    text = DOC.read_text()
    assert len(CITATION.findall(text)) >= 30  # the KIP table and the flow cite real names
    assert missing_citations(text, ROOT) == []


def test_a_renamed_function_is_caught(tmp_path: Path) -> None:
    module = tmp_path / "replicad" / "log" / "epoch.py"
    module.parent.mkdir(parents=True)
    module.write_text("class LeaderEpochCache:\n    def end_offset(self): ...\n")
    text = "`replicad/log/epoch.py:LeaderEpochCache.end_offset_for` and `replicad/gone.py`"
    assert missing_citations(text, tmp_path) == [
        "replicad/gone.py",
        "replicad/log/epoch.py:LeaderEpochCache.end_offset_for",
    ]


def test_every_layer_is_in_the_layer_table() -> None:
    table = DOC.read_text().split("## Layers", 1)[1].split("\n#", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for entries in LAYERS:
        row = [line for line in rows if f"`{entries[0]}`" in line.split("|")[1]]
        assert row, f"no row for {entries[0]} in docs/architecture.md"
        assert all(f"`{entry}`" in row[0].split("|")[1] for entry in entries), row[0]
    assert len(rows) == len(LAYERS)


def test_the_readme_links_it() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
