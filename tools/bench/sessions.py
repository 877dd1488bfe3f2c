"""Fetch sessions (KIP-227) on vs off: what an idle follower costs, by partition count.

Starts a local Apache Kafka broker, creates topics of idle partitions, and runs
`replicad run` against them twice per size -- sessions on and off. Once every
partition is fetching with no lag, it samples the daemon's own figures over an
idle window: bytes per fetch request and response (frames as written to and read
from the socket), and follower CPU per round trip (from /proc).

    .venv/bin/python -m tools.bench.sessions [--sizes 100,1000,10000] [--window 10]

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.measure import cpu_seconds
from tools.peers.kafka import KafkaBroker
from tools.replica import replicad_run, status_json, wait_until


def status(sock: Path) -> dict | None:
    return status_json(sock, timeout_s=120)


def measure(
    broker: KafkaBroker, prefix: str, partitions: int, sessions: bool, window_s: float, work: Path
) -> dict:
    run_dir = work / f"{partitions}-{'on' if sessions else 'off'}"
    run_dir.mkdir()
    sock = run_dir / "c.sock"
    proc = replicad_run(
        broker.bootstrap,
        None,
        run_dir / "data",
        config={"fetch": {"sessions": sessions}},
        control_socket=sock,
        extra=["--topics-regex", f"{prefix}-.*"],
    )
    try:

        def steady() -> bool:
            snap = status(sock)
            return (
                bool(snap)
                and snap["totals"]["partitions_by_state"] == {"fetching": partitions}
                and snap["totals"]["lag"] == 0
            )

        wait_until(steady, timeout_s=600, interval_s=1, what=f"{partitions} partitions steady")
        time.sleep(2)
        assert proc.proc is not None
        first = status(sock)["leaders"][0]
        cpu0 = cpu_seconds(proc.proc.pid)
        time.sleep(window_s)
        cpu1 = cpu_seconds(proc.proc.pid)
        last = status(sock)["leaders"][0]
    finally:
        proc.stop(timeout_s=120)
    trips = max(1, last["requests"] - first["requests"])
    return {
        "request_bytes": (last["request_bytes_total"] - first["request_bytes_total"]) / trips,
        "response_bytes": (last["response_bytes_total"] - first["response_bytes_total"]) / trips,
        "cpu_ms_per_trip": (cpu1 - cpu0) * 1000 / trips,
        "trips_per_s": trips / window_s,
        "incremental": last["incremental_requests"] > first["incremental_requests"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--window", type=float, default=10.0, help="idle seconds sampled")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="replicad-bench-") as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="2g")
        broker.start()
        try:
            created = 0
            prefix = f"idle{os.getpid()}"
            for n in sizes:
                broker.create_topic(f"{prefix}-{len(rows)}", n - created, timeout_s=600)
                created = n
                for sessions in (True, False):
                    m = measure(broker, prefix, n, sessions, args.window, work)
                    rows.append((n, sessions, m))
                    print(
                        f"  measured {n} partitions, sessions {'on' if sessions else 'off'}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            broker.stop()
    print(
        "| partitions | sessions | request bytes | response bytes | follower CPU ms / round trip "
        "| round trips/s |"
    )
    print("|---:|:---:|---:|---:|---:|---:|")
    for n, sessions, m in rows:
        print(
            f"| {n:,} | {'on' if sessions else 'off'} | {m['request_bytes']:,.0f} "
            f"| {m['response_bytes']:,.0f} | {m['cpu_ms_per_trip']:.2f} "
            f"| {m['trips_per_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
