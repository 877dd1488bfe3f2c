"""What the driver JVM ran during each read of `tools.bench.spark_stream_cost --jfr FILE`:
Java Flight Recorder's execution samples cut by the bench's windows (FILE.windows.json).

    .venv/bin/python -m tools.bench.spark_jfr FILE [--top 25] [--frames PREFIX ...]

For each window (a batch read, a stream), from `jfr print --json --events
jdk.ExecutionSample,jdk.NativeMethodSample FILE`: the samples by thread (digits as #), the
methods at the top of the stacks (self), and the methods anywhere in the stacks (counted
once a sample: inclusive), those whose class starts with a `--frames` prefix only when
given. JFR samples threads running Java code (ExecutionSample, every 10 ms with the
`profile` settings) and threads in native methods (NativeMethodSample, every 20 ms); the
JIT's compiler threads and the GC are not sampled: the bench's per-thread CPU shows them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

EVENTS = "jdk.ExecutionSample,jdk.NativeMethodSample,jdk.Compilation"


@dataclass(slots=True)
class Window:
    name: str
    start: float
    end: float
    threads: Counter[str] = field(default_factory=Counter)
    self_frames: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    compiled: Counter[str] = field(default_factory=Counter)  # milliseconds by kind
    compilations: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    native: int = 0


def epoch(stamp: str) -> float:
    """JFR's ISO stamp (nanoseconds or none, a zone) as epoch seconds."""
    match = re.fullmatch(r"([^.Z+]+)(?:\.([0-9]+))?(Z|[+-][0-9:]+)", stamp)
    if match is None:
        raise ValueError(f"not a JFR time stamp: {stamp}")
    head, fraction, zone = match.groups()
    whole = datetime.fromisoformat(head + zone.replace("Z", "+00:00")).timestamp()
    return whole + (float(f"0.{fraction}") if fraction else 0.0)


def duration_ms(text: str | float) -> float:
    """JFR's duration as `jfr print --json` writes it (ISO 8601, "PT0.012S"), in ms."""
    if isinstance(text, int | float):
        return float(text) / 1e6
    match = re.fullmatch(r"PT(?:([0-9.]+)M)?(?:([0-9.]+)S)?", text)
    if not match:
        return 0.0
    return (float(match.group(1) or 0) * 60 + float(match.group(2) or 0)) * 1000


def frame_name(frame: dict) -> str:
    method = frame["method"]
    return f"{method['type']['name']}.{method['name']}"


def thread_name(thread: dict | None) -> str:
    if not thread:
        return "?"
    return re.sub(r"[0-9]+", "#", thread.get("javaName") or thread.get("osName") or "?")


def compile_kind(method: dict) -> str:
    """Spark's code generated for a query, or the package of the method compiled (its
    first four parts: org/apache/spark/sql, java/util/concurrent...)."""
    name = method["type"]["name"]
    if "GeneratedClass" in name:
        return "generated (a query's codegen)"
    return "/".join(name.split("/")[:4][:-1] or [name])


def summarize(
    events: list[dict],
    windows: list[Window],
    prefixes: tuple[str, ...],
    *,
    native: bool = False,
) -> None:
    for event in events:
        values = event["values"]
        at = epoch(values["startTime"])
        window = next((w for w in windows if w.start <= at <= w.end), None)
        if window is None:
            continue
        if event["type"] == "jdk.Compilation":
            kind = compile_kind(values["method"])
            tier = f"tier {values.get('compileLevel')} {kind}"
            window.compiled[tier] += duration_ms(values.get("duration", "0"))
            window.compilations[tier] += 1
            continue
        if event["type"] == "jdk.NativeMethodSample" and not native:
            continue  # a thread in a native method: mostly blocked in a read or a wait
        frames = [frame_name(f) for f in (values.get("stackTrace") or {}).get("frames", [])]
        window.samples += 1
        window.native += event["type"] == "jdk.NativeMethodSample"
        window.threads[thread_name(values.get("sampledThread"))] += 1
        if frames:
            window.self_frames[frames[0]] += 1
        for name in set(frames):
            if not prefixes or name.startswith(prefixes):
                window.inclusive[name] += 1


def report(window: Window, top: int) -> None:
    print(
        f"\n## {window.name}: {window.end - window.start:.1f} s of wall, "
        f"{window.samples} samples ({window.native} in native methods)"
    )
    print("### JIT compilations (count, ms of compiling)")
    total = sum(window.compiled.values())
    print(f"{sum(window.compilations.values()):6d} {total:9.0f} ms  all")
    for tier, ms in window.compiled.most_common(top // 2):
        print(f"{window.compilations[tier]:6d} {ms:9.0f} ms  {tier}")
    for title, counter in (
        ("threads", window.threads),
        ("self", window.self_frames),
        ("inclusive", window.inclusive),
    ):
        print(f"### {title}")
        for name, n in counter.most_common(top):
            print(f"{n:6d} {100 * n / max(1, window.samples):5.1f}%  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("jfr")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--frames", nargs="*", default=[], help="class prefixes (inclusive)")
    parser.add_argument("--native", action="store_true", help="count native method samples")
    args = parser.parse_args()
    spans = json.loads(Path(f"{args.jfr}.windows.json").read_text())
    windows = [Window(f"{s['run']} {s['read']}", s["start"], s["end"]) for s in spans]
    printed = subprocess.run(
        ["jfr", "print", "--json", "--events", EVENTS, args.jfr],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    events = json.loads(printed)["recording"]["events"]
    summarize(events, windows, tuple(args.frames), native=args.native)
    for window in windows:
        report(window, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
