"""What the source checks of tools/ share (`tools.clockcheck`, `tools.logcheck`,
`tools.subscribecheck`): a finding named by file and line, the marker comment that excuses
one, the Python files below the paths given, the command that prints the findings and fails
on any, the message a test of the whole tree fails with (`listed`), and what a check finds
in a test's snippet (`finding_lines`).

The checks read sources with `ast` and import nothing of what they read."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def listed(findings: Iterable[Finding], advice: str) -> str:
    """What a test of the whole tree fails with: each finding on a line, then `advice`."""
    return "".join(f"\n{f.text(ROOT)}" for f in findings) + f"\n{advice}"


def finding_lines(check_source: Callable[[Path, str], list[Finding]], source: str) -> list[str]:
    """What `check_source` finds in `source` (a test's indented snippet), as `line: what`."""
    findings = check_source(Path("t.py"), textwrap.dedent(source))
    return [f"{f.line}: {f.what}" for f in findings]


def marked(lines: Sequence[str], line: int, marker: re.Pattern[str]) -> bool:
    """Whether `line` (1-based) carries the marker, or the comment block right above it does."""
    if marker.search(lines[line - 1]):
        return True
    above = line - 2
    while above >= 0 and lines[above].lstrip().startswith("#"):
        if marker.search(lines[above]):
            return True
        above -= 1
    return False


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            yield path


def check_files(
    paths: Iterable[Path], check_source: Callable[[Path, str], list[Finding]]
) -> list[Finding]:
    return [f for p in python_files(paths) for f in check_source(p, p.read_text())]


def run_command(
    argv: Sequence[str] | None,
    prog: str,
    description: str | None,
    default: Sequence[Path],
    check_source: Callable[[Path, str], list[Finding]],
) -> int:
    """Print each finding as `path:line: what`; exit status 1 when there is any."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("paths", nargs="*", type=Path, default=list(default))
    args = parser.parse_args(argv)
    findings = check_files(args.paths, check_source)
    for finding in findings:
        print(finding.text(ROOT))
    return 1 if findings else 0
