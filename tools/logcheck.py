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
- a dict display with the key "event", `dict(event=...)`, or `fields["event"] = ...`:
  fields are built in a core (a `Said`, a note) and splatted into a log call in the
  shell, far from here.

Name the field for what it is (`cause`, `step`, `kind`). A dict that never reaches a log
call (a status snapshot of a warning, a JSON document) carries the marker
`# log-fields-ok: why` on its line or in the comment lines right above it.

Exit status 0 when nothing is found, 1 otherwise, one line per finding.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tools.sourcecheck import ROOT, Finding, check_files, marked, run_command

DEFAULT_PATHS = tuple(ROOT / p for p in ("replicad", "tools", "tests"))
MARKER = re.compile(r"#\s*log-fields-ok:\s*\S")
FIELD = "event"


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
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == FIELD
        ):
            yield node.lineno, "the key 'event' set in a dict (fields reach a log call)"


def check_source(path: Path, source: str) -> list[Finding]:
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    found: dict[int, str] = {}
    for line, what in _findings(tree):
        if not marked(lines, line, MARKER):
            found.setdefault(line, what)
    return [Finding(path, line, what) for line, what in sorted(found.items())]


def check(paths: Iterable[Path]) -> list[Finding]:
    return check_files(paths, check_source)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, "python -m tools.logcheck", __doc__, DEFAULT_PATHS, check_source)


if __name__ == "__main__":
    sys.exit(main())
