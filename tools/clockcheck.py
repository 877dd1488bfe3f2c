"""`python -m tools.clockcheck [PATH ...]`: tests that wait by the clock, named by file and line.

The suite's rule: a test waits for an event (a status field, an offset, a log line, a port)
under a generous deadline that only a hang reaches, and asserts behaviour, never a
duration. A test that sleeps to let something happen, or asserts how long something took,
tests the machine: it fails when the machine is busy. This check reads the test sources
with `ast` (imports nothing) and reports

- an `assert` on the clock: an ordered comparison (`<`, `<=`, `>`, `>=`) that reads
  `time.monotonic()`, `time.perf_counter()`, `time.time()` (and their `_ns` forms), an
  event loop's `.time()`, or a name computed from one of those in the same function
  (`started = time.monotonic()`, `took = time.monotonic() - started`, `assert took < 2`);
  or that holds a name saying it is a duration (`elapsed`, `took`, `latency`, `stall`,
  `_timed_write(...)`, a name in seconds or milliseconds such as `checkpoint_ms` or
  `SOAK_S` that is not a setting), or a bare fraction (`median(gaps) < 0.2`);
- a sleep: `time.sleep(...)`, `asyncio.sleep(...)` (or `sleep` imported from either), other
  than `asyncio.sleep(0)`, which only lets the loop run its ready callbacks.

A loop's `assert time.monotonic() < deadline` is a wait's bound, not a duration, and is
not reported (prefer tools/wait.py, whose deadline only a hang reaches).

A sleep that *is* the behaviour under test (a slow peer the test plays, a reader paced on
purpose) carries the marker `# timing-ok: why` on its line or in the comment lines right
above it; the reason is required. So does an assertion the check mistakes for a duration
(a figure no clock gave), saying so. Keep them rare: `grep -rn "timing-ok" tests` lists
them all.

Exit status 0 when nothing is found, 1 otherwise, one line per finding.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tools.sourcecheck import ROOT, Finding, check_files, marked, run_command

MARKER = re.compile(r"#\s*timing-ok:\s*\S")

# module.function calls that read a clock.
_CLOCK_CALLS = {
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter"),
    ("time", "perf_counter_ns"),
    ("time", "time"),
    ("time", "time_ns"),
}
_CLOCK_NAMES = {name for _, name in _CLOCK_CALLS}
_SLEEPERS = {("time", "sleep"), ("asyncio", "sleep"), ("anyio", "sleep"), ("trio", "sleep")}
# A name that says it holds a duration, compared by order, is a duration assertion
# whatever it was computed from (a benchmark's result, a helper's return value).
_DURATION_WORDS = re.compile(
    r"(^|_)(elapsed|took|duration|durations|latency|latencies|stall|stalls|steady_s|wall_s|"
    r"seconds|seconds_taken|time_taken|spent|timed)($|_)"
)
# So does a name in seconds or milliseconds (`checkpoint_ms`, `row["longest_block_ms"]`,
# `SOAK_S`), unless it names a setting or a figure no busy machine changes: a timeout, an
# interval, a core's backoff or next wake-up computed from a fake clock, CPU seconds.
_TIME_UNIT = re.compile(r"(_s|_ms|_us|_ns|_seconds|_secs)$")
_NOT_ELAPSED = re.compile(
    r"cpu|timeout|interval|backoff|retry|linger|wait|deadline|delay|lifetime|ttl|period|wakeup"
)
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# Builtins a clock reading goes through and stays a time.
_NUMERIC = frozenset({"abs", "float", "int", "max", "min", "round", "sum"})


def _dotted(node: ast.expr) -> tuple[str, ...] | None:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else (*inner, node.attr)
    return None


def _names_one_of(
    name: tuple[str, ...] | None, imported: set[str], calls: set[tuple[str, str]]
) -> bool:
    """Whether a called name is one of `calls` (`module.attr`, the last two parts of a
    dotted name) or a bare name imported as one of them (`imported`)."""
    if name is None:
        return False
    if len(name) == 1:
        return name[0] in imported
    return name[-2:] in calls


class _Imports:
    """Which bare names stand for a clock or a sleep (`from time import monotonic`)."""

    def __init__(self, tree: ast.Module) -> None:
        self.clocks: set[str] = set()
        self.sleeps: set[str] = set()
        for node in tree.body:  # the module's own imports: a test file's are at the top
            if isinstance(node, ast.ImportFrom) and node.module in {"time", "asyncio", "anyio"}:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if (node.module, alias.name) in _CLOCK_CALLS:
                        self.clocks.add(local)
                    if (node.module, alias.name) in _SLEEPERS:
                        self.sleeps.add(local)

    def is_clock(self, call: ast.Call) -> bool:
        name = _dotted(call.func)
        # time.monotonic(), and an event loop's own clock: loop.time(),
        # asyncio.get_running_loop().time() (its func is an Attribute on a Call).
        loop_clock = name is not None and name[-2:] == ("loop", "time")
        return loop_clock or _names_one_of(name, self.clocks, _CLOCK_CALLS)

    def is_loop_time(self, call: ast.Call) -> bool:
        func = call.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "time"
            and isinstance(func.value, ast.Call)
            and (_dotted(func.value.func) or ("",))[-1] in {"get_running_loop", "get_event_loop"}
        )

    def is_sleep(self, call: ast.Call) -> bool:
        return _names_one_of(_dotted(call.func), self.sleeps, _SLEEPERS)


def _assigned_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _assigned_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _assigned_names(target.value)


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one function (or module) body, not those of functions nested in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


class _Scope:
    """One function: the names that hold a clock reading or something computed from one."""

    def __init__(self, nodes: list[ast.AST], imports: _Imports, outer: frozenset[str]) -> None:
        self.imports = imports
        self.timed: set[str] = set(outer)
        assignments: list[tuple[list[str], ast.expr]] = []
        for node in nodes:
            if isinstance(node, ast.Assign):
                names = [n for t in node.targets for n in _assigned_names(t)]
                assignments.append((names, node.value))
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                assignments.append((list(_assigned_names(node.target)), node.value))
            elif isinstance(node, ast.NamedExpr):
                assignments.append(([node.target.id], node.value))
        changed = True
        while changed:
            changed = False
            for names, value in assignments:
                if self.reads_clock(value):
                    for name in names:
                        if name not in self.timed:
                            self.timed.add(name)
                            changed = True

    def reads_clock(self, expr: ast.AST) -> bool:
        """Whether `expr` computes with a clock reading. Through arithmetic and the numeric
        builtins only: a reading passed to anything else (a unique name made of it, a
        topic named after it) is not a time any more."""
        todo = [expr]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Call):
                if self.imports.is_clock(node) or self.imports.is_loop_time(node):
                    return True
                if not (isinstance(node.func, ast.Name) and node.func.id in _NUMERIC):
                    continue
                todo.extend(node.args)
                continue
            if isinstance(node, ast.JoinedStr):
                continue
            if isinstance(node, ast.Name) and node.id in self.timed:
                return True
            todo.extend(ast.iter_child_nodes(node))
        return False


def _is_duration_name(name: str) -> bool:
    name = name.lower()
    if _DURATION_WORDS.search(name):
        return True
    return bool(_TIME_UNIT.search(name)) and not _NOT_ELAPSED.search(name)


def _says_duration(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value  # a key: row["checkpoint_s"]
        else:
            continue
        if _is_duration_name(name):
            return True
    return False


def _fraction_bound(compare: ast.Compare) -> bool:
    """Ordered against a bare fraction (`median(gaps) < 0.2`): seconds, in a test, unless a
    name in it says otherwise (`cpu_s >= 0.3`)."""
    operands = [compare.left, *compare.comparators]
    if not any(
        isinstance(o, ast.Constant) and isinstance(o.value, float) and not o.value.is_integer()
        for o in operands
    ):
        return False
    names = [n.id for n in ast.walk(compare) if isinstance(n, ast.Name)]
    names += [n.attr for n in ast.walk(compare) if isinstance(n, ast.Attribute)]
    return not any(_NOT_ELAPSED.search(name.lower()) for name in names)


def _against_a_deadline(compare: ast.Compare) -> bool:
    """`assert time.monotonic() < deadline` in a polling loop: a wait's bound (a hang's
    report), not a duration the test holds the machine to."""
    operands = [compare.left, *compare.comparators]
    return any(
        isinstance(o, ast.Name | ast.Attribute)
        and "deadline" in (o.id if isinstance(o, ast.Name) else o.attr).lower()
        for o in operands
    )


def _clock_assertion(test: ast.expr, scope: _Scope) -> bool:
    for node in ast.walk(test):
        # A bound is ordered: a timestamp compared for equality is data, not a duration.
        if not isinstance(node, ast.Compare) or not any(isinstance(op, _ORDER) for op in node.ops):
            continue
        if _against_a_deadline(node):
            continue
        if scope.reads_clock(node) or _says_duration(node) or _fraction_bound(node):
            return True
    return False


def _is_zero(call: ast.Call) -> bool:
    args = [*call.args, *(k.value for k in call.keywords)]
    return (
        len(args) == 1
        and isinstance(args[0], ast.Constant)
        and args[0].value == 0
        and not isinstance(args[0].value, bool)
    )


def check_source(path: Path, source: str) -> list[Finding]:
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    imports = _Imports(tree)
    findings: list[Finding] = []

    def visit(scope: ast.AST, outer: frozenset[str]) -> None:
        nodes = list(_own_nodes(scope))
        names = _Scope(nodes, imports, outer)
        for node in nodes:
            what = ""
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                # A nested function sees its enclosing function's clock readings.
                visit(node, frozenset(names.timed))
            elif isinstance(node, ast.Assert) and _clock_assertion(node.test, names):
                what = "asserts on elapsed time"
            elif isinstance(node, ast.Call) and imports.is_sleep(node) and not _is_zero(node):
                what = f"sleeps to wait ({ast.unparse(node)})"
            if what and not marked(lines, node.lineno, MARKER):
                findings.append(Finding(path, node.lineno, what))

    visit(tree, frozenset())
    return sorted(findings, key=lambda f: f.line)


def check(paths: Iterable[Path]) -> list[Finding]:
    return check_files(paths, check_source)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, "python -m tools.clockcheck", __doc__, [ROOT / "tests"], check_source)


if __name__ == "__main__":
    sys.exit(main())
