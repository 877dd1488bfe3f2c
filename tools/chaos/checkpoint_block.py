"""How long a checkpoint blocks the follower's event loop, on a slow disk, as a table.

    .venv/bin/python -m tools.chaos.checkpoint_block [--partitions 10000] [--sync-us 500]
        [--write-us 100] [--code LABEL=DIR ...] [--dir DIR]

For each code tree (default: this one; `--code main=/tmp/main` adds a checkout of another
commit, e.g. from `git archive main | tar -x -C /tmp/main`), a child process:
1. creates PARTITIONS partition logs in a fresh data directory (on tmpfs when /dev/shm is
   writable, so the real disk adds nothing) and appends one batch to each, so every
   partition has files written and not yet synced, as after a busy checkpoint interval;
2. switches the slow disk on (tools/chaos/slowdisk.c, LD_PRELOAD: every fsync under the data
   directory sleeps SYNC_US first, every write WRITE_US);
3. runs one checkpoint of `replicad run` (Replicator._checkpoint: flush every partition, the
   three checkpoint files, time-based flushes, retention) inside an asyncio loop where a
   ticker asks to wake every millisecond, and records the longest time the loop could not
   run it.
The table gives per code tree: the fsyncs and writes the shim delayed, the checkpoint's wall
time, the loop's longest block, the same ticker's longest block right after with nothing
else running (as long as the checkpoint took, 10 s at most: the machine's own share, since
other processes use the same cores) and the longest garbage-collector pause meanwhile.
The code under test is driven through Replicator._checkpoint whether it is a plain function
(before the durability thread) or a coroutine, so the same tool measures both.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK_S = 0.001
IDLE_MAX_S = 10.0
REPO = Path(__file__).resolve().parents[2]


def _child(
    data_dir: Path, partitions: int, batch_file: Path, switch: Path, idle_max_s: float
) -> dict[str, float]:
    """Runs in the measured process (its PYTHONPATH picks the code tree)."""
    import gc
    import logging

    import structlog

    from replicad.follower.replicator import Replicator, ReplicatorSettings
    from replicad.log.config import LogConfig
    from replicad.log.manager import LogManager
    from replicad.records.batch import scan_batches
    from replicad.types import TopicPartition

    try:
        from replicad.protocol.metadata import TopicSelection
    except ImportError:  # a tree from before f3e9d58 (the "before" row of the docs)
        from replicad.follower.metadata import TopicSelection  # type: ignore[no-redef]

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    raw = batch_file.read_bytes()
    headers = scan_batches(raw).batches
    started = time.monotonic()
    logs = LogManager.open(data_dir, LogConfig(), now_ms=0)
    for p in range(partitions):
        logs.get_or_create(TopicPartition("t", p)).append(raw, headers, now_ms=0)
    setup_s = time.monotonic() - started
    settings = ReplicatorSettings(
        bootstrap_servers=("127.0.0.1:9",), data_dir=data_dir, selection=TopicSelection(("t",))
    )

    async def measure() -> dict[str, float]:
        replicator = Replicator(settings)
        replicator.logs = logs
        longest = 0.0
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal longest, ticks
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(TICK_S)
                now = time.perf_counter()
                longest = max(longest, now - last - TICK_S)
                ticks += 1
                last = now

        gc_started = 0.0
        gc_longest = 0.0

        def gc_pause(phase: str, info: dict[str, int]) -> None:
            nonlocal gc_started, gc_longest
            if phase == "start":
                gc_started = time.perf_counter()
            else:
                gc_longest = max(gc_longest, time.perf_counter() - gc_started)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.2)
        longest, ticks = 0.0, 0
        gc.callbacks.append(gc_pause)
        switch.touch()
        began = time.perf_counter()
        step = replicator._checkpoint()
        if inspect.isawaitable(step):
            await step
        took = time.perf_counter() - began
        switch.unlink()
        gc.callbacks.remove(gc_pause)
        await asyncio.sleep(10 * TICK_S)  # the ticker sees a block only when it wakes
        busy = longest
        # The same ticker with nothing else to do, for as long (10 s at most): what this
        # machine's scheduler alone costs the loop now (other processes share the cores).
        longest = 0.0
        await asyncio.sleep(min(took, idle_max_s))
        idle = longest
        done.set()
        await task
        durability = getattr(replicator, "durability", None)
        if durability is not None:
            durability.close()
        return {
            "checkpoint_s": took,
            "longest_block_ms": busy * 1000,
            "idle_block_ms": idle * 1000,
            "ticks": ticks,
            "longest_gc_ms": gc_longest * 1000,
        }

    result = asyncio.run(measure())
    logs.close()
    return {"setup_s": setup_s, **result}


def _run(label: str, code: Path, args: argparse.Namespace, base: Path) -> dict[str, object]:
    from tools.chaos.disk import SlowDisk
    from tools.logdata.batches import producer_batch

    with tempfile.TemporaryDirectory(prefix="checkpoint-block-", dir=base) as work_dir:
        work = Path(work_dir)
        data_dir = work / "data"
        data_dir.mkdir()
        batch_file = work / "batch"
        batch_file.write_bytes(producer_batch(0, [b"x" * 200] * 5))
        slow = SlowDisk(data_dir, work, write_us=args.write_us, sync_us=args.sync_us)
        env = {**os.environ, **slow.env(), "PYTHONPATH": str(code)}
        done = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                str(data_dir),
                str(args.partitions),
                str(batch_file),
                str(slow.switch),
                str(getattr(args, "idle_max_s", IDLE_MAX_S)),
            ],
            env=env,
            cwd=code,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{label}: the child failed:\n{done.stderr[-3000:]}")
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return {"code": label, "delayed_calls": slow.delayed_calls(), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--sync-us", type=int, default=500)
    parser.add_argument("--write-us", type=int, default=100)
    parser.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="another code tree to measure (this one is always measured, as 'this')",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where data directories go")
    args = parser.parse_args(argv)
    shm = Path("/dev/shm")
    base = args.dir or (shm if shm.is_dir() and os.access(shm, os.W_OK) else None)
    trees = [("this", REPO)] + [
        (label, Path(path).resolve()) for label, _, path in (c.partition("=") for c in args.code)
    ]
    rows = [_run(label, code, args, base) for label, code in trees]
    print(
        "| code | partitions | delayed fsyncs+writes | checkpoint s | loop longest block ms "
        "| same, no checkpoint | longest GC pause ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['code']} | {args.partitions:,} | {row['delayed_calls']:,} | "
            f"{row['checkpoint_s']:.2f} | {row['longest_block_ms']:.1f} "
            f"| {row['idle_block_ms']:.1f} | {row['longest_gc_ms']:.1f} |"
        )
    print(
        f"\nslow disk: {args.sync_us} us before each fsync, {args.write_us} us before each "
        f"write (tools/chaos/slowdisk.c); data on {base or tempfile.gettempdir()}; one batch "
        f"of 5 records appended to each partition before the checkpoint; the loop's ticker "
        f"asks to wake every {TICK_S * 1000:g} ms"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.pop(0)  # this file's directory: its modules are not the code under test
        data, count, batch, switch_file, idle = sys.argv[2:7]
        figures = _child(Path(data), int(count), Path(batch), Path(switch_file), float(idle))
        print(json.dumps(figures))
    else:
        raise SystemExit(main())
