"""tools/bench/spark_jfr.py: JFR's events cut by the windows of each read, as
`jfr print --json` writes them (the recording itself comes from the bench)."""

from __future__ import annotations

import pytest

from tools.bench.spark_jfr import Window, duration_ms, epoch, summarize


def sample(at: str, thread: str, *frames: str, native: bool = False) -> dict:
    kind = "jdk.NativeMethodSample" if native else "jdk.ExecutionSample"
    stack = [{"method": {"type": {"name": f.rsplit(".", 1)[0]}, "name": f.rsplit(".", 1)[1]}}
             for f in frames]  # fmt: skip
    return {
        "type": kind,
        "values": {
            "startTime": at,
            "sampledThread": {"javaName": thread},
            "stackTrace": {"frames": stack},
        },
    }


def compiled(at: str, cls: str, level: int, duration: str) -> dict:
    method = {"type": {"name": cls}, "name": "apply"}
    values = {"startTime": at, "duration": duration, "method": method, "compileLevel": level}
    return {"type": "jdk.Compilation", "values": values}


def test_stamps_and_durations_as_jfr_prints_them():
    assert epoch("2026-11-27T07:59:35.429200799Z") == pytest.approx(1_795_766_375.4292008)
    assert epoch("2026-11-27T07:59:35Z") == pytest.approx(1_795_766_375.0)
    assert duration_ms("PT0.100337749S") == pytest.approx(100.337749)
    assert duration_ms("PT1M2.5S") == pytest.approx(62_500.0)


def test_events_go_to_the_read_they_happened_in():
    start = epoch("2026-11-27T08:00:00Z")
    batch, stream = Window("batch", start, start + 10), Window("stream", start + 20, start + 30)
    events = [
        sample("2026-11-27T08:00:01Z", "Executor task launch worker-12", "a/Leaf.f", "a/Root.g"),
        sample("2026-11-27T08:00:02Z", "Executor task launch worker-13", "a/Leaf.f", "a/Root.g"),
        sample("2026-11-27T08:00:03Z", "reader", "java/io/FileInputStream.readBytes", native=True),
        sample("2026-11-27T08:00:15Z", "between reads", "a/Leaf.f"),
        sample("2026-11-27T08:00:21Z", "stream execution thread 7", "b/Plan.h", "a/Root.g"),
        compiled(
            "2026-11-27T08:00:22Z", "org/apache/spark/sql/GeneratedClass$Specific", 4, "PT0.5S"
        ),
        compiled("2026-11-27T08:00:23Z", "scala/collection/immutable/Vector", 4, "PT0.25S"),
        compiled("2026-11-27T08:00:24Z", "scala/collection/immutable/List", 4, "PT0.25S"),
    ]
    summarize(events, [batch, stream], ())
    assert batch.samples == 2  # the native method sample is left out unless asked for
    assert batch.threads == {"Executor task launch worker-#": 2}
    assert batch.self_frames == {"a/Leaf.f": 2}
    assert batch.inclusive == {"a/Leaf.f": 2, "a/Root.g": 2}
    assert stream.threads == {"stream execution thread #": 1}
    assert stream.compilations == {
        "tier 4 generated (a query's codegen)": 1,
        "tier 4 scala/collection/immutable": 2,
    }
    assert stream.compiled["tier 4 scala/collection/immutable"] == pytest.approx(500.0)

    with_native = Window("batch", start, start + 10)
    summarize(events, [with_native], ("java/",), native=True)
    assert with_native.samples == 3 and with_native.native == 1
    assert with_native.inclusive == {"java/io/FileInputStream.readBytes": 1}
