"""`make kafka`: an Apache Kafka broker on 127.0.0.1:9092 to try replicad by hand.

Starts a single KRaft broker from the cached jars (tools/kafka) in ./var/<name> (./var/kafka
by default), fresh each time, creates a sample topic `demo` with a few thousand mixed records,
prints what to run next, and serves until Ctrl-C (or SIGTERM), then shuts the broker down
cleanly. A second one, without the sample, is the mirror's destination:
`make kafka PORT=9093 NAME=dest`.

    python -m tools.localkafka [--port 9092] [--name kafka] [--no-sample] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path

from tools.peers.kafka import KafkaBroker
from tools.peers.produce import produce_mixed

ROOT = Path(__file__).resolve().parents[1]
VAR = ROOT / "var"
DEFAULT_NAME = "kafka"
DEFAULT_PORT = 9092
SAMPLE_TOPIC = "demo"
SAMPLE_PARTITIONS = 3
SAMPLE_RECORDS = 3_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port on 127.0.0.1")
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="names the broker's state directory, ./var/NAME; a second broker needs its own",
    )
    parser.add_argument(
        "--no-sample",
        action="store_true",
        help="no sample topic (a second broker: the default with a --name other than kafka)",
    )
    parser.add_argument("--workdir", type=Path, help="broker state, wiped (default: ./var/NAME)")
    args = parser.parse_args(argv)
    if args.workdir is None:
        args.workdir = VAR / args.name
    sample = not args.no_sample and args.name == DEFAULT_NAME

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    shutil.rmtree(args.workdir, ignore_errors=True)
    broker = KafkaBroker(args.workdir, port=args.port)
    print(
        f"starting Apache Kafka on 127.0.0.1:{args.port} (state in {args.workdir}) ...", flush=True
    )
    try:
        broker.start()
    except Exception as exc:  # a taken port, missing jars: one line, not a traceback
        print(f"make kafka: the broker did not start: {exc}", file=sys.stderr)
        broker.kill()
        return 1
    try:
        if sample:
            broker.create_topic(SAMPLE_TOPIC, SAMPLE_PARTITIONS)
            produce_mixed(
                broker.bootstrap,
                SAMPLE_TOPIC,
                partitions=SAMPLE_PARTITIONS,
                records=SAMPLE_RECORDS,
                seed=1,
            )
        print(next_steps(broker.bootstrap, sample=sample), flush=True)
        stop.wait()
    finally:
        print("stopping Kafka ...", flush=True)
        broker.stop()
    return 0


def next_steps(bootstrap: str, *, sample: bool) -> str:
    """What to run next: replicate the sample topic, or (no sample: a second broker) mirror
    into this one."""
    if sample:
        return (
            f"\nKafka is up at {bootstrap} with topic {SAMPLE_TOPIC!r}. In another terminal:\n\n"
            f"  .venv/bin/replicad run --bootstrap-servers {bootstrap} "
            f"--topics {SAMPLE_TOPIC} --data-dir var/try/data "
            "--control-socket var/try/control.sock\n"
            "  .venv/bin/replicad status --socket var/try/control.sock\n\n"
            "Ctrl-C here stops Kafka."
        )
    return (
        f"\nKafka is up at {bootstrap}, with no topics. To mirror into it, give a config a "
        f'mirror: section with bootstrap_servers: [{bootstrap!r}] (README: "Mirroring into a '
        'second Kafka"); to replicate from it, create a topic and run '
        f"`.venv/bin/replicad run --bootstrap-server {bootstrap} --topic TOPIC ...`.\n\n"
        "Ctrl-C here stops Kafka."
    )


if __name__ == "__main__":
    sys.exit(main())
