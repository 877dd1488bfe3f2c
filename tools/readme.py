"""The README's code blocks and shell commands, as the tests that hold the README to the code
read them (tests/test_readme.py, test_install.py, peers/test_localkafka.py).

A shell command is one line of an `sh` block (a backslash joins lines). It may end with
`# needs: WHAT`: what it needs that the suite cannot always give (a cluster, systemd, root);
the tests decide which of those they run anyway, and in what stand-in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS = re.compile(r"\s+#\s*needs:\s*(?P<what>.+)$")


@dataclass(frozen=True, slots=True)
class Block:
    language: str
    line: int  # of the opening fence, 1-based
    section: str  # the `## ` heading it is under ("" before the first)
    text: str


@dataclass(frozen=True, slots=True)
class ShellCommand:
    command: str  # without its `# needs:` marker
    needs: str | None
    section: str


def blocks(text: str | None = None) -> list[Block]:
    found = []
    lines = (README.read_text() if text is None else text).splitlines()
    section = ""
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
        match = re.match(r"^```(\S*)\s*$", lines[i])
        if match:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(match.group(1), i + 1, section, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return found


def shell_commands(text: str | None = None) -> list[ShellCommand]:
    """Every command of every `sh` block, in the README's order."""
    commands = []
    for block in blocks(text):
        if block.language != "sh":
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            needs = NEEDS.search(line)
            command = NEEDS.sub("", line).strip() if needs else line
            what = needs.group("what").strip() if needs else None
            commands.append(ShellCommand(command, what, block.section))
    return commands
