"""secret_scan: password files give the secrets, .log files are searched, a leak is named by
file and line (never by the secret)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.chaos.secret_scan import describe, main, scan


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the session's temporary one: the leak planted here must not fail
    the suite's own scan at its end (tests/conftest.py)."""
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def test_a_secret_in_a_log_is_found_and_named_without_itself(outside: Path) -> None:
    tmp_path = outside
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "replica.password").write_text("s3cret-value\n")
    (tmp_path / "short-password").write_text("abc\n")  # too short to search for
    (tmp_path / "serve.log").write_text('{"event": "ok"}\n{"event": "x", "pw": "s3cret-value"}\n')
    (tmp_path / "other.log").write_text("abc abc\n")
    result = scan(tmp_path)
    assert (result.secrets, result.logs, result.lines) == (1, 2, 3)
    assert [(leak.log.name, leak.line) for leak in result.leaks] == [("serve.log", 2)]
    assert "s3cret-value" not in "\n".join(describe(result))
    assert main([str(tmp_path)]) == 1


def test_no_secret_no_leak(tmp_path: Path) -> None:
    (tmp_path / "a.password").write_text("another-secret")
    (tmp_path / "run.log").write_text("nothing to see\n")
    assert scan(tmp_path).leaks == []
    assert main([str(tmp_path)]) == 0


def test_lines_and_leaks_are_counted_as_a_text_read_sees_them(outside: Path) -> None:
    """Raw bytes are searched first (the suite's logs are millions of lines): line breaks of
    every kind, invalid UTF-8 and a secret of non-ASCII characters count as text mode reads
    them."""
    (outside / "a.password").write_text("pässwörd-1\n")
    (outside / "crlf.log").write_bytes(b"one\r\ntwo\rthree\n\xff\xfe p\xc3\xa4ssw\xc3\xb6rd-1 \xff")
    (outside / "segment.log").write_bytes(bytes(range(256)) * 4)  # binary, no secret
    (outside / "empty.log").write_bytes(b"")
    result = scan(outside)
    expected = 0
    for log in outside.glob("*.log"):
        with open(log, errors="replace") as f:
            expected += sum(1 for _ in f)
    assert (result.logs, result.lines) == (3, expected)
    assert [(leak.log.name, leak.line) for leak in result.leaks] == [("crlf.log", 4)]
