"""`make demo`: a local Kafka with sample data, replicated by replicad into ./var/data.

Starts a single-node Apache Kafka (KRaft) on 127.0.0.1, creates a topic and
produces mixed data into it (every codec, headers, transactions), runs
`replicad run` into ./var/data until the replica has caught up, shows what was
replicated, checks it with `replicad verify`, and stops everything.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.peers.kafka import KafkaBroker
from tools.peers.produce import produce_mixed
from tools.replica import ReplicadProcess, end_offsets, log_end_offset, run_args, wait_until

ROOT = Path(__file__).resolve().parents[1]
VAR = ROOT / "var"
DATA_DIR = VAR / "data"
TOPIC = "demo-events"
PARTITIONS = 4
RECORDS = 20_000
CONTROL = VAR / "demo" / "control.sock"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    shutil.rmtree(VAR / "demo", ignore_errors=True)
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    say("starting a local Apache Kafka broker (KRaft, 127.0.0.1)")
    broker = KafkaBroker(VAR / "demo" / "kafka")
    broker.start()
    replicad: ReplicadProcess | None = None
    try:
        print(f"   broker at {broker.bootstrap}")
        say(f"producing {RECORDS:,} records into {TOPIC!r} ({PARTITIONS} partitions)")
        broker.create_topic(TOPIC, PARTITIONS)
        produce_mixed(broker.bootstrap, TOPIC, partitions=PARTITIONS, records=RECORDS, seed=1)
        source_ends = {p: log_end_offset(broker.partition_dir(TOPIC, p)) for p in range(PARTITIONS)}

        args = run_args(broker.bootstrap, TOPIC, DATA_DIR, control_socket=CONTROL, log_format=None)
        say("replicad " + " ".join(args))
        replicad = ReplicadProcess(args, log_path=VAR / "demo" / "replicad.log").start()
        started = time.monotonic()

        def caught_up() -> bool:
            got = {tp.partition: end for tp, end in end_offsets(DATA_DIR).items()}
            return all(got.get(p) == end for p, end in source_ends.items())

        wait_until(caught_up, timeout_s=120, what="the replica to catch up")
        elapsed = time.monotonic() - started
        say(f"replicated in {elapsed:.1f}s (including start-up)")
        print(f"   {'partition':<20} {'source end':>10} {'replica end':>11} {'bytes':>10}")
        for p in range(PARTITIONS):
            pdir = DATA_DIR / f"{TOPIC}-{p}"
            size = sum(f.stat().st_size for f in pdir.glob("*.log"))
            replica_end = log_end_offset(pdir)
            print(
                f"   {TOPIC + '-' + str(p):<20} {source_ends[p]:>10} {replica_end:>11} {size:>10}"
            )
        time.sleep(1.5)  # one status refresh, so the rates shown are current
        say(f"replicad status --socket {CONTROL}")
        subprocess.run([sys.executable, "-m", "replicad.cli", "status", "--socket", str(CONTROL)])
        rc = replicad.stop()
        replicad = None
        print(f"   replicad stopped cleanly (exit {rc}); log: {VAR / 'demo' / 'replicad.log'}")

        say(f"replicad verify {DATA_DIR}")
        verify = subprocess.run([sys.executable, "-m", "replicad.cli", "verify", str(DATA_DIR)])
        say(f"done: the replica is in {DATA_DIR} (Kafka's own segment format)")
        print(f"   try: .venv/bin/replicad dump-log {DATA_DIR / (TOPIC + '-0')}")
        return verify.returncode
    finally:
        if replicad is not None:
            replicad.kill()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
