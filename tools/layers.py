"""`python -m tools.layers`: replicad's layers, and a check that no module imports above its own.

LAYERS below is the one place the intended order is written: lowest first, one row a
layer, each entry of a row a package or module of replicad. A module belongs to the most
specific entry that names it or a package above it. A module may import its own entry
and anything in a lower layer. It fails the check when it imports
- a higher layer (upward: the lower layer could no longer be read or tested alone);
- another entry of its own row (sideways: entries of one row are siblings that stand
  side by side, such as the follower and the leader, and share only what lies below);
- back into a cycle of modules, even within one package (two modules that cannot be read,
  or tested, one without the other).
Every import counts, also those inside functions and under TYPE_CHECKING: a dependency is
a dependency wherever it is written. A module in no entry fails too, so a new package is
placed on purpose.

CORES names the sans-I/O cores (docs/architecture.md, "Sans-I/O cores and their shells",
plus the mirror's core): each fails the check when it imports asyncio, socket, selectors,
threading, time, replicad.clock or a connection or client module of replicad.protocol, or
reads a clock through `.now()`, `.utcnow()` or `.today()`. Time is passed in (`now_ms`).

The check reads the source with `ast` and imports nothing. Exit status 0 when the graph
keeps the order, 1 otherwise, with one line per violation.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "replicad"

# Lowest first; one row a layer, its entries siblings that may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Names everything may use ("replicad" is the package's own __init__: its version);
    # Kafka's shared wire constants; the clocks shells read.
    ("replicad", "replicad.types", "replicad.wire", "replicad.clock"),
    ("replicad.errors", "replicad.exits"),
    # Small shared services: rate-limited logging, the recent-warnings ring, early signals,
    # the one memory pool (its rules and the queue the follower's and serve's shells wait in).
    # The one lookup of every state machine's table of moves.
    (
        "replicad.ratelimit",
        "replicad.recent_warnings",
        "replicad.startup",
        "replicad.pool",
        "replicad.transitions",
    ),
    # Record batches and message sets: bytes in, views out (sans-I/O).
    ("replicad.records",),
    # The local log store: segments, indexes, checkpoints.
    ("replicad.log",),
    # The configuration: read once, typed; the TLS files it names.
    ("replicad.config",),
    # The archive: rolled segments uploaded to an S3-compatible bucket (its settings are
    # the config's `archive:`); Spark and serve read the bucket through it.
    ("replicad.archive",),
    # Kafka's wire protocol: framing for both sides, the client, connections, metadata.
    ("replicad.protocol",),
    # Fetch sessions (KIP-227), client and server (sans-I/O).
    ("replicad.session",),
    # Consumer groups: reading a cluster's groups, the group protocol, the coordinator.
    ("replicad.groups",),
    # What uses the layers below, each on its own: the follower (`replicad run`), the
    # leader (`replicad serve`), Spark's data source over the segments, the replica
    # compared with its source (`replicad verify --against-source`).
    ("replicad.follower", "replicad.leader", "replicad.spark", "replicad.verify"),
    # Mirroring a cluster: topics through the follower, groups through replicad.groups.
    ("replicad.mirror",),
    # Operators' view: health, status, the control socket; metrics; logging.
    ("replicad.control", "replicad.metrics", "replicad.logs"),
    # The daemon, then its command line, then `python -m replicad` (which is the CLI).
    ("replicad.daemon",),
    ("replicad.cli",),
    ("replicad.__main__",),
)

# The sans-I/O cores: a package names every module below it. They decide; their shells
# wait, read and write (docs/architecture.md keeps the same list, tested).
CORES: tuple[str, ...] = (
    "replicad.pool.rules",
    "replicad.records.batch",
    "replicad.log.policy",
    "replicad.archive.uploads",
    "replicad.archive.manifest",
    "replicad.session",
    "replicad.follower.actions",
    "replicad.follower.assignment",
    "replicad.follower.disk_queue",
    "replicad.follower.fetch_response",
    "replicad.follower.fetch_settings",
    "replicad.follower.fetcher_stats",
    "replicad.follower.partition_phase",
    "replicad.follower.partition_state",
    "replicad.follower.partition_table",
    "replicad.follower.perform",
    "replicad.follower.truncation",
    "replicad.follower.validate",
    "replicad.leader.fetch",
    "replicad.leader.security",
    "replicad.protocol.security",
    "replicad.groups.assignors",
    "replicad.groups.classic_group",
    "replicad.groups.consumer_group",
    "replicad.groups.coordinator",
    "replicad.groups.offset_sync",
    "replicad.mirror.chore",
    "replicad.mirror.partition_mirror",
    "replicad.mirror.producer_session",
    "replicad.mirror.group_sync",
    "replicad.mirror.promotion",
    "replicad.verify.compare",
    "replicad.verify.progress",
)
# What a core may not import (a module or anything below it).
CORE_FORBIDDEN = (
    "asyncio",
    "socket",
    "selectors",
    "threading",
    "time",
    "replicad.clock",
    "replicad.protocol.connection",
    "replicad.protocol.client",
)
# Calls that read a clock (datetime.now(), date.today(), ...).
CLOCK_CALLS = frozenset({"now", "utcnow", "today"})


@dataclass(frozen=True, slots=True)
class Import:
    """`importer` imports `imported` at `line`."""

    importer: str
    imported: str
    line: int


@dataclass(frozen=True, slots=True)
class Violation:
    text: str


@dataclass(frozen=True, slots=True)
class Place:
    """Where a module sits: its layer (row of LAYERS) and the entry of that row."""

    layer: int
    entry: str


def place_of(module: str, layers: Sequence[tuple[str, ...]] = LAYERS) -> Place | None:
    """`module`'s place: its most specific entry wins (None: not placed). The package
    itself names only its own __init__, never the modules below it."""
    best: tuple[int, Place] | None = None
    for index, entries in enumerate(layers):
        for entry in entries:
            below = entry != PACKAGE and module.startswith(f"{entry}.")
            if module == entry or below:
                depth = entry.count(".")
                if best is None or depth > best[0]:
                    best = (depth, Place(index, entry))
    return None if best is None else best[1]


def layer_of(module: str, layers: Sequence[tuple[str, ...]] = LAYERS) -> int | None:
    place = place_of(module, layers)
    return None if place is None else place.layer


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True, slots=True)
class _Node:
    """What the checks read of one node of a module's tree: an import (`kind` "import":
    `names`), a from-import ("from": `module`, `level`, `names`) or a call of a CLOCK_CALLS
    attribute ("clock": its name in `names`)."""

    kind: str
    line: int
    names: tuple[str, ...]
    module: str | None = None
    level: int = 0


# A source text's nodes, by the text: the tests check copies of the tree with a file or two
# changed, and parsing and walking every module is nearly all of a check's time.
_NODES: dict[str, tuple[_Node, ...]] = {}


def _nodes(path: Path) -> tuple[_Node, ...]:
    """The imports and clock calls of the module at `path`, in `ast.walk` order."""
    text = path.read_text()
    found = _NODES.get(text)
    if found is not None:
        return found
    nodes: list[_Node] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            nodes.append(_Node("import", node.lineno, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            nodes.append(_Node("from", node.lineno, names, node.module, node.level))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLOCK_CALLS
        ):
            nodes.append(_Node("clock", node.lineno, (node.func.attr,)))
    _NODES[text] = found = tuple(nodes)
    return found


def imports_of(path: Path, module: str, known: set[str]) -> Iterator[Import]:
    """The replicad modules `module` (source at `path`) imports, wherever in the file."""
    is_package = path.name == "__init__.py"
    for node in _nodes(path):
        if node.kind == "import":
            for name in node.names:
                yield from _known(module, name, node.line, known)
        elif node.kind == "from":
            base = _absolute(module, is_package, node.module, node.level)
            for name in node.names:
                # `from replicad.records import legacy` imports a module, not a name.
                candidate = f"{base}.{name}"
                target = candidate if candidate in known else base
                yield from _known(module, target, node.line, known)


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    keep = len(parts) - level + (1 if is_package else 0)
    base = ".".join(parts[:keep])
    return f"{base}.{name}" if name else base


def _known(importer: str, target: str, line: int, known: set[str]) -> Iterator[Import]:
    # The nearest module that exists: `replicad.config.model.Config` -> its module.
    while target and target not in known:
        target = target.rpartition(".")[0]
    if target and target != importer:
        yield Import(importer, target, line)


def graph(root: Path = ROOT, package: str = PACKAGE) -> list[Import]:
    files = sorted((root / package).rglob("*.py"))
    modules = {module_name(path, root): path for path in files}
    known = set(modules)
    return [edge for name, path in modules.items() for edge in imports_of(path, name, known)]


def check(edges: Iterable[Import], layers: Sequence[tuple[str, ...]] = LAYERS) -> list[Violation]:
    edges = list(edges)
    violations: list[Violation] = []
    for module in sorted({e.importer for e in edges} | {e.imported for e in edges}):
        if layer_of(module, layers) is None:
            violations.append(Violation(f"{module}: in no layer (add it to LAYERS)"))
    for edge in edges:
        own, other = place_of(edge.importer, layers), place_of(edge.imported, layers)
        if own is None or other is None:
            continue
        if other.layer > own.layer:
            where = f"{', '.join(layers[other.layer])} above {', '.join(layers[own.layer])}"
            violations.append(
                Violation(
                    f"{edge.importer}:{edge.line} imports {edge.imported}, a higher layer ({where})"
                )
            )
        elif other.layer == own.layer and other.entry != own.entry:
            violations.append(
                Violation(
                    f"{edge.importer}:{edge.line} imports {edge.imported}, sideways "
                    f"({other.entry} and {own.entry} are siblings: share what lies below)"
                )
            )
    violations += [Violation(f"import cycle: {' -> '.join(c)}") for c in cycles(edges)]
    return violations


def is_core(module: str, cores: Sequence[str] = CORES) -> bool:
    return any(module == c or module.startswith(f"{c}.") for c in cores)


def core_violations(
    root: Path = ROOT, package: str = PACKAGE, cores: Sequence[str] = CORES
) -> list[Violation]:
    """Every import of I/O or a clock, and every clock read, in a sans-I/O core."""
    found: list[Violation] = []
    for path in sorted((root / package).rglob("*.py")):
        module = module_name(path, root)
        if not is_core(module, cores):
            continue
        is_package = path.name == "__init__.py"
        for node in _nodes(path):
            names: list[str] = []
            if node.kind == "import":
                names = list(node.names)
            elif node.kind == "from":
                base = _absolute(module, is_package, node.module, node.level)
                names = [base, *(f"{base}.{name}" for name in node.names)]
            else:
                found.append(
                    Violation(
                        f"{module}:{node.line} reads a clock (.{node.names[0]}()), "
                        "a sans-I/O core: take now_ms"
                    )
                )
            for name in dict.fromkeys(names):
                bad = next(
                    (f for f in CORE_FORBIDDEN if name == f or name.startswith(f"{f}.")), None
                )
                if bad is not None:
                    found.append(
                        Violation(
                            f"{module}:{node.line} imports {bad}, a sans-I/O core "
                            "(no asyncio, socket, thread or clock: time is passed in)"
                        )
                    )
                    break
    return found


def cycles(edges: Iterable[Import]) -> list[tuple[str, ...]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm)."""
    succ: dict[str, set[str]] = {}
    for edge in edges:
        succ.setdefault(edge.importer, set()).add(edge.imported)
        succ.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(succ[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(_cycle_through(sorted(group), succ))

    for node in sorted(succ):
        if node not in index:
            visit(node)
    return found


def _cycle_through(group: list[str], succ: dict[str, set[str]]) -> tuple[str, ...]:
    """A shortest path from the group's first module back to itself, inside the group."""
    members = set(group)
    start = group[0]
    paths = {start: (start,)}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(succ[node] & members):
            if nxt == start:
                return (*paths[node], start)
            if nxt not in paths:
                paths[nxt] = (*paths[node], nxt)
                queue.append(nxt)
    return tuple(group)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository's root")
    args = parser.parse_args(argv)
    edges = graph(args.root)
    violations = check(edges) + core_violations(args.root)
    for violation in violations:
        print(violation.text)
    modules = len({e.importer for e in edges})
    print(f"{modules} modules, {len(edges)} imports: ", end="")
    print(f"{len(violations)} violation(s)" if violations else "every import keeps the layers")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
