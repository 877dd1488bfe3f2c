"""No log field is named `event` (tools/logcheck.py): structlog takes the message as `event`,
so such a field raises TypeError, and inside an asyncio task that kills the task unseen."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from tools.logcheck import DEFAULT_PATHS, ROOT, check, check_source, main
from tools.sourcecheck import finding_lines, listed


def test_no_log_field_is_named_event() -> None:
    findings = check(DEFAULT_PATHS)
    assert findings == [], listed(
        findings,
        "name the field for what it is (cause, step, kind); a dict that is never logged"
        " says so: # log-fields-ok: why",
    )


def test_the_pitfall_is_real() -> None:
    # What the check guards against: the logger's own parameter is named `event`.
    log = structlog.get_logger("logcheck-test")
    with pytest.raises(TypeError):
        # log-fields-ok: the pitfall itself, planted
        log.warning("group failed over", **{"reason": "live", "event": "joined"})


def test_keywords_splats_and_field_dicts_are_named_by_line() -> None:
    source = """
        import structlog

        log = structlog.get_logger()

        def shell(self, e):
            log.warning("failed over", event=e)
            self._warn("key", "failed over", **{"event": e})
            log.info("x", **dict(event=e))
            return Said("failed over", "g", {"reason": "live", "event": e})

        def core():
            fields = dict(reason="live", event="joined")
            fields["event"] = "joined"
            return fields
    """
    assert finding_lines(check_source, source) == [
        "7: a call given the keyword 'event'",
        "8: a call given the keyword 'event' through **",
        "9: a call given the keyword 'event' through **",
        "10: a dict with the key 'event' (fields reach a log call)",
        "13: a dict with the key 'event' (fields reach a log call)",
        "14: the key 'event' set in a dict (fields reach a log call)",
    ]


def test_other_names_and_marked_dicts_pass() -> None:
    source = """
        def shell(log, e, event_dict):
            log.warning("failed over", cause=e, **{"reason": "live"})
            message = event_dict.get("event")
            # log-fields-ok: a status document, never logged
            view = {"event": message}
            other = {"event": message}  # log-fields-ok: a JSON line the test reads
            return view, other
    """
    assert finding_lines(check_source, source) == []


def test_the_command_names_file_and_line_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('log.info("x", event=1)\n')
    assert main([str(bad)]) == 1
    assert capsys.readouterr().out == f"{bad}:1: a call given the keyword 'event'\n"
    assert main([str(ROOT / "tools" / "logcheck.py")]) == 0
