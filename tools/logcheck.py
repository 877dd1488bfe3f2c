"""`python -m tools.logcheck [PATH ...]`: log fields named `event`, named by file and line.

structlog's logging methods take the message as their first parameter, named `event`
(`log.info(event, **fields)`), and so do the helpers that rate-limit a line and pass
`**fields` on (`_say_once`, `_warn`, `EventLog.note`). A field named `event` therefore
reaches a second value for that parameter: the call raises TypeError. Inside an asyncio task
nothing shows it; the task is dead (the mirror's group sync stopped so until 7ce1e4e, its
failed-over line given {"reason": ..., "event": ...}). This check reads the sources with
`ast` (imports nothing) and reports

- a call given a keyword argument `event` (`log.warning("x", event=e)`,
  `self._warn(key, "x", event=e)`), also through `**{"event": e}` or `**dict(event=e)`;
- a dict display with the key "event", or `dict(event=...)`: fields are built in a core
  (a `Said`, a note) and splatted into a log call in the shell, far from here.

Name the field for what it is (`cause`, `step`, `kind`). A dict that never reaches a log
call (a status snapshot of a warning, a JSON document) carries the marker
`# log-fields-ok: why` on its line or in the comment lines right above it.

Exit status 0 when nothing is found, 1 otherwise, one line per finding.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = ("replicad", "tools", "tests")
MARKER = re.compile(r"#\s*log-fields-ok:\s*\S")
FIELD = "event"


@dataclass(frozen=True, slots=True)
class Finding:
    path: Path
    line: int
    what: str

    def text(self, root: Path) -> str:
        try:
            shown = self.path.relative_to(root)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}: {self.what}"


def _is_dict_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"


def _has_event_key(node: ast.expr) -> bool:
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == FIELD for k in node.keys)
    if isinstance(node, ast.Call) and _is_dict_call(node):
        return any(kw.arg == FIELD for kw in node.keywords)
    return False


def _findings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not _is_dict_call(node):
            for kw in node.keywords:
                if kw.arg == FIELD:
                    yield kw.value.lineno, "a call given the keyword 'event'"
                elif kw.arg is None and _has_event_key(kw.value):
                    yield kw.value.lineno, "a call given the keyword 'event' through **"
        if _has_event_key(node):
            yield node.lineno, "a dict with the key 'event' (fields reach a log call)"


def check_source(path: Path, source: str) -> list[Finding]:
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    found: dict[int, str] = {}
    for line, what in _findings(tree):
        if not _marked(lines, line):
            found.setdefault(line, what)
    return [Finding(path, line, what) for line, what in sorted(found.items())]


def _marked(lines: Sequence[str], line: int) -> bool:
    """The marker on the line itself or in the comment lines right above it."""
    index = line - 1
    if MARKER.search(lines[index]):
        return True
    index -= 1
    while index >= 0 and lines[index].lstrip().startswith("#"):
        if MARKER.search(lines[index]):
            return True
        index -= 1
    return False


def _sources(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            yield path


def check(paths: Iterable[Path]) -> list[Finding]:
    findings: list[Finding] = []
    for path in _sources(paths):
        findings.extend(check_source(path, path.read_text(encoding="utf-8")))
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.logcheck", description=__doc__)
    parser.add_argument(
        "paths", nargs="*", type=Path, help="files or folders (replicad, tools, tests)"
    )
    args = parser.parse_args(argv)
    paths = args.paths or [ROOT / p for p in DEFAULT_PATHS]
    findings = check(paths)
    for finding in findings:
        print(finding.text(ROOT))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
