"""CPU seconds of the mirror's own path for one-record batches, in one process, no network.

A local log of BATCHES one-record LZ4 batches (1 KiB values, half random, half zeros: the
`tools.bench.mirror` tiny workload's records) is mirrored as the shell mirrors it, minus
asyncio and the destination: the local log read ahead (`shell.read_entries`, the read-ahead
budget and read size of the shell's defaults), the partition's core fed, every send it
hands out taken (`next_send`), its runs coalesced (`shell.coalesced_runs`, the coalescing
thread's work) and restamped (`shell.produced_batch`), and each send acknowledged where it
was expected (`acked`). Only that work is timed, in CPU seconds of this process
(time.process_time), so the figure holds on a shared machine where wall time does not; it
leaves out what the bench's destination, sockets and event loop add.

    .venv/bin/python -m tools.bench.mirror_path [--batches 100000] [--coalesce-bytes 262144]
        [--repeat 3] [--baseline DIR] [--profile OUT.svg]

`--baseline DIR` runs another checkout (this module's file, with that checkout's replicad
first on the path) in turn with this one, pass after pass, each in a fresh process.
`--profile OUT` records one pass of this checkout with py-spy (a flame graph, or with a
`.txt` name py-spy's raw collapsed stacks).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from inspect import signature
from pathlib import Path
from typing import Any

KIB = 1024
VALUE_BYTES = 1024
TOPIC = "bench-tiny"
# The shell's defaults (MirrorSettings): a read's bytes, the read-ahead budget.
READ_BYTES = 1 << 20
BUFFER_BYTES = 4 << 20


def write_log(directory: Path, batches: int) -> object:
    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.records.batch import Compression, scan_batches

    LZ4 = Compression.LZ4
    from replicad.types import TopicPartition
    from tools.logdata.batches import producer_batch

    rng = random.Random(9)
    # One batch per distinct value, made once; each stored batch is a copy with its own
    # base offset (outside the CRC, which starts at the attributes).
    templates = [
        producer_batch(0, [rng.randbytes(VALUE_BYTES // 2) + bytes(VALUE_BYTES // 2)], codec=LZ4)
        for _ in range(256)
    ]
    plog = PartitionLog.create(
        directory / f"{TOPIC}-0", TopicPartition(TOPIC, 0), LogConfig(), now_ms=0
    )
    chunk = 1000
    for start in range(0, batches, chunk):
        data = bytearray()
        for i in range(start, min(start + chunk, batches)):
            at = len(data)
            data += templates[i % len(templates)]
            data[at : at + 8] = i.to_bytes(8, "big")
        plog.append(bytes(data), scan_batches(data).batches, now_ms=0)
    plog.high_watermark = plog.log_end_offset
    return plog


def mirror_all(plog: object, batches: int, coalesce_bytes: int) -> tuple[int, int]:
    """Mirror the whole log through the core; (sends, records mirrored)."""
    from replicad.mirror import shell
    from replicad.mirror.partition_mirror import MirrorTiming, PartitionMirror
    from replicad.mirror.restamp import ProducerStamp

    core = PartitionMirror(position=0, timing=MirrorTiming(coalesce_bytes=coalesce_bytes))
    stamp = ProducerStamp(1000, 0)
    now = 1
    wall = 1_700_000_000_000
    assert core.log_end_wanted(now)
    core.on_log_end(stamp, 0, 0, now)
    if core.first_save_wanted:
        core.first_progress_saved()
    hw = plog.high_watermark  # type: ignore[attr-defined]
    # Older checkouts (a --baseline): read_entries decompressing at read time (with
    # coalesce_bytes), runs coalesced without a bound, or by produced_batch itself.
    extra = (
        (coalesce_bytes,) if "coalesce_bytes" in signature(shell.read_entries).parameters else ()
    )
    when = (wall,) if "wall_ms" in signature(core.next_send).parameters else ()
    runs_of = getattr(shell, "coalesced_runs", None)
    if runs_of is None:
        coalesced_runs: Any = lambda sends: {}  # noqa: E731
    elif len(signature(runs_of).parameters) == 2:
        coalesced_runs = lambda sends: runs_of(sends, 4 * coalesce_bytes)  # noqa: E731
    else:
        coalesced_runs = runs_of
    sends = 0
    while core.position < hw:
        core.expire(now)  # as the shell's step does, before reading and sending
        while core.scanned_to < hw and core.wants_more(BUFFER_BYTES):
            keep = core.buffered_bytes < BUFFER_BYTES
            entries = shell.read_entries(plog, core.scanned_to, hw, READ_BYTES, keep, *extra)
            core.feed(entries)
        out = []
        while (send := core.next_send(now, stamp, *when)) is not None:
            out.append(send)
        # The send loop asks whether each send is still current before and after the
        # coalescing thread (shell._current).
        assert all(core.current(s) for s in out)
        made = coalesced_runs([s for s in out if s.more])
        assert all(core.current(s) for s in out)
        for send in out:
            run = made.get(send)
            assert run is None or isinstance(run, bytes), run  # no run cut, no error
            shell.produced_batch(send, run) if run is not None else shell.produced_batch(send)
        for send in out:
            core.acked(send, -1, now)
        sends += len(out)
        assert out or core.position >= hw, "the core handed out nothing"
    assert core.records_mirrored == batches
    return sends, core.records_mirrored


def one_pass(args: argparse.Namespace) -> tuple[float, int, float]:
    """This checkout's path in this process: (CPU seconds, sends, wall seconds)."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    work = Path(tempfile.mkdtemp(prefix="replicad-mirror-path-", dir=args.dir))
    plog = write_log(work, args.batches)
    import replicad.mirror.shell  # noqa: F401  (its imports are not timed)

    try:
        c0, w0 = time.process_time(), time.perf_counter()
        sends, _ = mirror_all(plog, args.batches, args.coalesce_bytes)
        return time.process_time() - c0, sends, time.perf_counter() - w0
    finally:
        plog.close()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)


def child_pass(args: argparse.Namespace, checkout: Path | None) -> tuple[float, int, float]:
    """One pass in a fresh process, with this checkout's or `checkout`'s replicad."""
    here = Path(__file__).resolve().parents[2]
    root = checkout or here
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        f"--batches={args.batches}",
        f"--coalesce-bytes={args.coalesce_bytes}",
    ]
    if args.dir is not None:
        argv.append(f"--dir={args.dir}")
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{here}"}
    out = subprocess.run(argv, env=env, cwd=here, capture_output=True, text=True, check=True)
    row = out.stdout.strip().splitlines()[-1].strip("|").split("|")
    cpu, sends, wall = (cell.strip() for cell in row[1:4])
    return float(cpu), int(sends.replace(",", "")), float(wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--coalesce-bytes", type=int, default=256 * KIB)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="passes of each checkout")
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    parser.add_argument("--profile", type=Path, help="py-spy output of one pass")
    args = parser.parse_args(argv)
    shape = f"{args.batches:,} one-record LZ4 batches, coalesce_bytes {args.coalesce_bytes:,}"
    if args.profile is not None:
        spy = Path(sys.executable).with_name("py-spy")
        fmt = ["--format", "raw"] if args.profile.suffix == ".txt" else []
        root = Path(__file__).resolve().parents[2]
        cmd = [str(spy), "record", "-r", "250", "-o", str(args.profile), *fmt, "--"]
        cmd += [sys.executable, "-m", "tools.bench.mirror_path", f"--batches={args.batches}"]
        cmd.append(f"--coalesce-bytes={args.coalesce_bytes}")
        # As a module from the checkout's root: run as a script, `tools` was not importable.
        return subprocess.run(cmd, cwd=root, check=False).returncode
    if args.repeat == 1 and args.baseline is None:
        cpu, sends, wall = one_pass(args)
        print(f"| {shape} | {cpu:.2f} | {sends:,} | {wall:.2f} |")
        return 0
    checkouts: list[tuple[str, Path | None]] = [("this checkout", None)]
    if args.baseline is not None:
        checkouts.append((f"baseline ({args.baseline})", args.baseline.resolve()))
    print(f"{shape}; load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| checkout | pass | CPU s | sends | wall s | load |")
    print("|---|---:|---:|---:|---:|---:|")
    cpus: dict[str, list[float]] = {label: [] for label, _ in checkouts}
    for i in range(args.repeat):
        for label, checkout in checkouts:
            load = os.getloadavg()[0]
            cpu, sends, wall = child_pass(args, checkout)
            cpus[label].append(cpu)
            print(f"| {label} | {i + 1} | {cpu:.2f} | {sends:,} | {wall:.2f} | {load:.1f} |")
    print()
    for label, values in cpus.items():
        print(f"- {label}: median {statistics.median(values):.2f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
