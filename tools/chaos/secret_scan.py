"""No secret in any log: every password file under a directory gives a secret, and every log
file under it is searched for each (the suite runs it over its temporary directory when it
ends, so every log a daemon of the suite wrote there is covered).

`python -m tools.chaos.secret_scan DIR` prints what it searched and each leak; exit 1 on any.
A secret is the stripped text of a file whose name holds "password" (as the tests name the
files that `password_file` keys point at), at least MIN_SECRET characters long; a log is a
file whose name ends in .log. Each leak names the file and line, never the secret itself.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

MIN_SECRET = 6
MAX_SECRET_FILE = 4096


@dataclass(frozen=True, slots=True)
class Leak:
    log: Path
    line: int
    secret_file: Path


@dataclass
class SecretScan:
    secrets: int = 0
    logs: int = 0
    lines: int = 0
    leaks: list[Leak] = field(default_factory=list)


def scan(root: Path) -> SecretScan:
    secrets: dict[str, Path] = {}
    logs: list[Path] = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            if name.endswith(".log"):
                logs.append(path)
            elif "password" in name.lower():
                try:
                    if path.stat().st_size <= MAX_SECRET_FILE:
                        text = path.read_text(errors="replace").strip()
                        if len(text) >= MIN_SECRET:
                            secrets.setdefault(text, path)
                except OSError:
                    continue
    result = SecretScan(secrets=len(secrets))
    needles = _needles(secrets)
    for log in logs:
        try:
            data = log.read_bytes()
        except OSError:
            continue
        result.logs += 1
        result.lines += _line_count(data)
        if needles is not None and not any(needle in data for needle in needles):
            continue  # none of the secrets' bytes: no line can hold one
        with open(log, errors="replace") as lines:  # the numbers of the lines that hold one
            for number, line in enumerate(lines, 1):
                for secret, source in secrets.items():
                    if secret in line:
                        result.leaks.append(Leak(log, number, source))
    return result


def _needles(secrets: dict[str, Path]) -> list[bytes] | None:
    """Each secret's UTF-8 bytes, searched in a log's raw bytes first (a whole file at C
    speed; line by line in Python the suite's 2.6 million lines took 10 CPU-s): a secret a
    decoded line holds is there as those bytes, since every character but U+FFFD decodes
    from exactly its own encoding. None when a secret holds U+FFFD or a line break, which
    only the decoded lines can match."""
    if any(c in secret for secret in secrets for c in "\ufffd\r\n"):
        return None
    return [secret.encode() for secret in secrets]


def _line_count(data: bytes) -> int:
    """The lines a text-mode read yields (universal newlines: \\n, \\r\\n or \\r)."""
    breaks = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    return breaks + (1 if data and data[-1:] not in (b"\n", b"\r") else 0)


def describe(result: SecretScan) -> list[str]:
    lines = [
        f"secret scan: {result.secrets} secrets, {result.logs} logs, "
        f"{result.lines:,} lines, {len(result.leaks)} leaks"
    ]
    lines += [
        f"  secret of {leak.secret_file.name} in {leak.log}:{leak.line}" for leak in result.leaks
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools.chaos.secret_scan")
    parser.add_argument("directory", type=Path)
    result = scan(parser.parse_args(argv).directory)
    print("\n".join(describe(result)))
    return 1 if result.leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
