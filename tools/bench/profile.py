"""Where replicad's CPU goes while it replicates: py-spy samples, summed by function.

The scenario of tools/bench/replicate (a local Apache Kafka topic of 1 KiB lz4 records),
with one process sampled by py-spy (the `bench` extra installs it) from its start to the
moment the replica is complete:

- `--target run` (default): `replicad run` copying from Kafka, or with `--source serve`
  from `replicad serve` (itself not sampled);
- `--target serve`: `replicad serve`, while a `replicad run` copies from it.

Prints the top functions by own samples (where the time is spent) and by total samples
(what it is spent for), as a share of all samples. `--native` adds C frames (the CRC,
memset, the kernel's copies show as the C function that called them).

    .venv/bin/python -m tools.bench.profile [--gib 1] [--target run|serve]
        [--source kafka|serve] [--native] [--top 25] [--raw FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tools.bench.replicate import (
    RECORD,
    chained_run_argv,
    child_env,
    log_bytes,
    prepare_topic,
    run_replicad,
    serve_argv,
)
from tools.peers.kafka import KafkaBroker
from tools.peers.process import free_port, port_accepts
from tools.replica import replicad_argv, run_args

SAMPLES_PER_S = 250
# "function (path/to/file.py:123)" -> "function (path/to/file.py)": lines of one function
# are summed.
_LINE = re.compile(r":\d+\)$")


@dataclass(frozen=True, slots=True)
class Profile:
    samples: int
    own: Counter[str]
    total: Counter[str]


def read_collapsed(text: str) -> Profile:
    """py-spy's raw output: one `frame;frame;...;leaf count` line per distinct stack."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    return Profile(samples, own, total)


def _short(frame: str) -> str:
    frame = _LINE.sub(")", frame)
    # Paths below site-packages or the checkout are shown from there.
    for marker in ("site-packages/", "/replicad/", "/lib/python3."):
        i = frame.find(marker)
        if i >= 0:
            head = frame[: frame.index("(") + 1]
            tail = frame[i + len(marker) :] if marker != "/replicad/" else frame[i + 1 :]
            if marker == "/lib/python3.":
                tail = "stdlib " + tail.split("/", 1)[-1]
            return head + tail
    return frame


def top_table(profile: Profile, top: int) -> str:
    lines = [
        f"{profile.samples:,} samples",
        "",
        "| own % | total % | function |",
        "|---:|---:|---|",
    ]
    for frame, n in profile.own.most_common(top):
        own = 100 * n / profile.samples
        total = 100 * profile.total[frame] / profile.samples
        lines.append(f"| {own:.1f} | {total:.1f} | `{frame}` |")
    lines += ["", "By total (own and callees), replicad's own code:", ""]
    lines += ["| total % | function |", "|---:|---|"]
    ours = [(f, n) for f, n in profile.total.most_common() if "replicad/" in f]
    for frame, n in ours[:top]:
        lines.append(f"| {100 * n / profile.samples:.1f} | `{frame}` |")
    return "\n".join(lines)


def _child_of(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def sampled(
    argv: list[str],
    out: Path,
    *,
    native: bool,
    done,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """Run `argv` under py-spy until `done()`, then SIGTERM it; py-spy writes `out`.
    `env`: added to the child's environment (replicate.child_env: compiled as installed);
    `cwd`: where it runs (see replicate.child_env)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [spy, "record", "--format", "raw", "-o", str(out), "-r", str(SAMPLES_PER_S)]
    if native:
        command.append("--native")
    proc = subprocess.Popen(
        [*command, "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    try:
        while not done():
            if proc.poll() is not None:
                raise RuntimeError(f"py-spy exited with {proc.returncode}")
            time.sleep(0.02)
        child = _child_of(proc.pid)
        if child is not None:
            os.kill(child, signal.SIGTERM)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--target", choices=("run", "serve"), default="run")
    parser.add_argument("--source", choices=("kafka", "serve"), default="kafka")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw output here")
    args = parser.parse_args()
    records = int(args.gib * 1024 * 1024 * 1024 / RECORD)
    with tempfile.TemporaryDirectory(prefix="replicad-bench-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        out = work / "profile.txt"
        broker = KafkaBroker(work / "kafka", heap="2g")
        broker.start()
        try:
            topic = prepare_topic(broker, "bench", args.partitions, records)
            if args.target == "run" and args.source == "kafka":
                data_dir = work / "replica"
                argv = replicad_argv(
                    *run_args(broker.bootstrap, topic.name, data_dir),
                    as_installed=True,
                )
                sampled(
                    argv,
                    out,
                    native=args.native,
                    done=lambda: log_bytes(data_dir) >= topic.stored,
                    env=child_env(work),
                )
            else:
                _, source = run_replicad(work, topic)
                broker.stop()
                port = free_port()
                target = work / "replica-of-replica"
                run = chained_run_argv(work, port, topic.name, target)
                if args.target == "run":
                    serve = subprocess.Popen(serve_argv(source, port))
                    try:
                        while not port_accepts(port):
                            time.sleep(0.05)
                        sampled(
                            run,
                            out,
                            native=args.native,
                            done=lambda: log_bytes(target) >= topic.stored,
                        )
                    finally:
                        serve.terminate()
                        serve.wait(60)
                else:
                    follower: subprocess.Popen[bytes] | None = None

                    def done() -> bool:
                        nonlocal follower
                        if follower is None and port_accepts(port):
                            follower = subprocess.Popen(run)
                        return log_bytes(target) >= topic.stored

                    try:
                        sampled(serve_argv(source, port), out, native=args.native, done=done)
                    finally:
                        if follower is not None:
                            follower.terminate()
                            follower.wait(60)
        finally:
            broker.stop()
        text = out.read_text()
        if args.raw:
            args.raw.write_text(text)
    print(f"replicad {args.target} (source: {args.source}), {args.gib:g} GiB of 1 KiB lz4 records")
    print()
    print(top_table(read_collapsed(text), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
