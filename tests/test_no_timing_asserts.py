"""The suite waits for events, never by the clock (tools/clockcheck.py): no test asserts how
long something took or sleeps to let something happen; the check names file and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.clockcheck import ROOT, check, check_source
from tools.sourcecheck import finding_lines, listed, python_files


def test_no_test_waits_by_the_clock() -> None:
    findings = check([ROOT / "tests"])
    assert findings == [], listed(
        findings,
        "wait for the event instead (tools/wait.py); a figure belongs to tools/bench or"
        " tools/chaos; a sleep that is the behaviour under test says so: # timing-ok: why",
    )


def test_an_elapsed_time_assertion_is_named_by_line() -> None:
    source = """
        import time

        def test_fast():
            started = time.monotonic()
            work()
            took = time.monotonic() - started
            assert took < 2.0
            assert time.perf_counter() - started > 0  # a direct reading too
    """
    assert finding_lines(check_source, source) == [
        "8: asserts on elapsed time",
        "9: asserts on elapsed time",
    ]


def test_the_clock_is_followed_through_names_and_into_nested_functions() -> None:
    source = """
        import asyncio
        from time import monotonic as now

        async def test_nested():
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            gaps = []
            def tick():
                gaps.append(loop.time() - t0)
            stall = max(gaps)
            assert stall < 0.1
            begin = now()
            def inner():
                assert now() - begin < 1
    """
    assert finding_lines(check_source, source) == [
        "12: asserts on elapsed time",
        "15: asserts on elapsed time",
    ]


def test_a_name_that_says_duration_is_flagged_when_ordered() -> None:
    source = """
        def test_bench(result):
            steady_s = result.steady_s
            assert 0.7 <= steady_s <= 1.5
            assert result.elapsed_ms > 10
            assert result.took == 3  # equality: a count or a value, not a duration bound
            assert result.timeout_s >= 1  # a setting, not a measurement
            assert float(row["checkpoint_s"]) * 1000 >= 180
            assert len(samples) >= SOAK_S // 4  # a count that grows with the time taken
            assert probe.seconds < 5
            assert _timed_write(path) >= 0.3
            assert m.cpu_s >= 0.3 and outcome.retry_in_ms <= 120  # CPU; a fake clock's backoff
            assert core.next_wakeup_ms(now) - now <= 2_000  # a core's wake-up on a fake clock
            assert statistics.median(gaps) < 0.2
            assert hot_end < 16000 * 0.9  # a share of a count
    """
    lines = (4, 5, 8, 9, 10, 11, 14)
    assert finding_lines(check_source, source) == [
        f"{line}: asserts on elapsed time" for line in lines
    ]


def test_sleeps_are_flagged_except_a_yield_and_a_marked_one() -> None:
    source = """
        import asyncio
        import time
        from time import sleep

        async def test_waits():
            time.sleep(0.5)
            await asyncio.sleep(0.1)
            sleep(1)
            await asyncio.sleep(0)  # lets ready callbacks run: no time passes
            # a slow peer is what this test plays
            # timing-ok: the leader answers late on purpose
            await asyncio.sleep(2)
            time.sleep(0.01)  # timing-ok: pacing a reader that must still be reading
            time.sleep(0.01)  # timing-ok:
    """
    assert finding_lines(check_source, source) == [
        "7: sleeps to wait (time.sleep(0.5))",
        "8: sleeps to wait (asyncio.sleep(0.1))",
        "9: sleeps to wait (sleep(1))",
        "15: sleeps to wait (time.sleep(0.01))",  # a marker with no reason is no marker
    ]


def test_waiting_on_a_deadline_is_not_flagged() -> None:
    source = """
        import time

        def test_consume(consumer):
            deadline = time.monotonic() + 60
            got = []
            while len(got) < 10 and time.monotonic() < deadline:
                got += consumer.poll(timeout_ms=200)
            assert len(got) == 10
            while not done():
                assert time.monotonic() < deadline, "a hang"
    """
    assert finding_lines(check_source, source) == []


def test_the_command_names_file_and_line_and_fails(tmp_path: Path) -> None:
    # Planted two folders down, as tests/<area>/test_*.py are.
    planted = tmp_path / "area" / "deeper" / "test_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "import time\n\n\ndef test_x():\n    time.sleep(1)\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 2.0\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tools.clockcheck", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == (
        f"{planted}:5: sleeps to wait (time.sleep(1))\n{planted}:7: asserts on elapsed time\n"
    )


def test_the_suite_check_reads_every_python_file_under_tests() -> None:
    """test_no_test_waits_by_the_clock covers the whole of tests/: every area's files, their
    helpers and conftest.py, not only the top folder."""
    read = set(python_files([ROOT / "tests"]))
    on_disk = {p for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts}
    assert read == on_disk
    assert ROOT / "tests" / "conftest.py" in read
    assert ROOT / "tests" / "leader" / "test_serve_hostile.py" in read
