"""`python -m tools.subscribecheck [PATH ...]`: kafka-python consumers that subscribe to a
group by hand, named by file and line.

kafka-python 3.0.12 strands a group leader whose rejoin began from a metadata change: if a
poll gives up while its SyncGroup is answered, the answer is never applied (no assignment,
no heartbeat; expelled at its session timeout). A member that subscribes before its
metadata names its topics meets that rejoin (tools/peers/rejoin_race.py reproduces it), so
every kafka-python group member of the suite and the tools subscribes through
`tools.peers.group_member.subscribe_knowing`. This check reads the sources with `ast`
(imports nothing) and reports a call `c.subscribe(...)` where `c` was assigned
`KafkaConsumer(...)` in the same function (or module body). A consumer that only `assign()`s
partitions joins no group and is not concerned; neither is confluent-kafka's `Consumer`.

A subscription by hand that is the point of the code (the race's own reproduction) carries
the marker `# subscribe-ok: why` on its line or in the comment lines right above it.

Exit status 0 when nothing is found, 1 otherwise, one line per finding.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tools.sourcecheck import ROOT, Finding, check_files, marked, run_command

DEFAULT_PATHS = tuple(ROOT / p for p in ("tests", "tools"))
MARKER = re.compile(r"#\s*subscribe-ok:\s*\S")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one function (or module) body, not those of the scopes nested in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _is_kafka_consumer(node: ast.expr | None) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name == "KafkaConsumer"


def _consumers(scope: ast.AST) -> set[str]:
    """What `KafkaConsumer(...)` is assigned to in `scope`, as source text."""
    names: set[str] = set()
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign) and _is_kafka_consumer(node.value):
            names.update(ast.unparse(t) for t in node.targets)
        elif isinstance(node, ast.AnnAssign) and _is_kafka_consumer(node.value):
            names.add(ast.unparse(node.target))
        elif (
            isinstance(node, ast.withitem)
            and _is_kafka_consumer(node.context_expr)
            and node.optional_vars is not None
        ):
            names.add(ast.unparse(node.optional_vars))
    return names


def check_source(path: Path, source: str) -> list[Finding]:
    tree = ast.parse(source, str(path))
    lines = source.splitlines()
    findings = []
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in scopes:
        consumers = _consumers(scope)
        for node in _own_nodes(scope):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "subscribe"
                and ast.unparse(node.func.value) in consumers
                and not marked(lines, node.lineno, MARKER)
            ):
                what = f"a kafka-python consumer subscribes by hand ({ast.unparse(node.func)})"
                findings.append(Finding(path, node.lineno, what))
    return sorted(findings, key=lambda f: f.line)


def check(paths: Iterable[Path]) -> list[Finding]:
    return check_files(paths, check_source)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, "python -m tools.subscribecheck", __doc__, DEFAULT_PATHS, check_source)


if __name__ == "__main__":
    sys.exit(main())
