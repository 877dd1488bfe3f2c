"""Peak memory and open files of `replicad run` with thousands of lagging partitions.

The scenario of issue 9's memory target: a real Apache Kafka cluster of 3 KRaft
nodes (tools/peers/kafka_cluster.py), topics whose partitions (replication
factor 1) are led round-robin by the 3 nodes, every partition filled with
`bytes_per_partition` of incompressible records before replicad starts, so
every partition lags. Then one `replicad run` (a separate process, its
RLIMIT_NOFILE lowered with prlimit) replicates it all with a small
`fetch.buffer_memory` and `fetch.response_max_bytes` just below it: each of the
3 leaders may answer with nearly a whole pool's worth, so without the pool about
three times the bound would be in flight.

The daemon runs as installed for production: without the test extra's
hypothesis, which kio imports when it is present (tools/bench/replicate.py does
the same).

Measured on the daemon, from the kernel:
- peak RSS: VmHWM of /proc/<pid>/status, read just before the daemon is
  stopped (the kernel's high-water mark, exact, not sampled);
- open descriptors: /proc/<pid>/fd sampled every `SAMPLE_INTERVAL_S`, both all of
  them and those open on files under the data directory (segment files, which
  `log.max_open_files` bounds);
and from the daemon's own status: the memory pool's peak and waits, and the
leaders it fetched from.

    .venv/bin/python -m tools.bench.memory [--partitions 10000] [--buffer-mib 32]
        [--explain-steps] [--tracemalloc FILE]

`--explain-steps` says at each step of VmHWM what it was made of: the anonymous
mappings new since the last sample (the heap's growth apart) and py-spy's dump of every
thread of the daemon (the dump stops the daemon for a moment: figures of such a run are
for finding a step, not for the table).

prints a markdown table. tests/follower/test_memory_10k.py runs the same
scenario and asserts on the result.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from replicad.control.client import query
from replicad.errors import ControlError
from replicad.types import TopicPartition
from tools.bench import traced
from tools.bench.kafka_settings import kafka_settings
from tools.bench.measure import cpu_seconds
from tools.peers.admin import librdkafka_log
from tools.peers.kafka_cluster import KafkaCluster
from tools.peers.process import proc_status
from tools.peers.produce import produce_when_room
from tools.replica import ReplicadProcess, end_offsets, replicad_argv, wait_until

KIB = 1024
MIB = 1024 * KIB
# The target: peak RSS <= buffer.memory + this.
RSS_HEADROOM = 64 * MIB
RECORD_BYTES = 4 * KIB
# Distinct random values the records are drawn from: incompressible, and no two
# neighbouring batches alike, at the cost of generating only this many.
VALUE_POOL = 257
SAMPLE_INTERVAL_S = 0.05
# The daemon's VmHWM is said on stderr each time it rose by this much (FdSampler).
HWM_STEP = 4 * MIB
# How long the daemon's status is asked for (status_json).
STATUS_TIMEOUT_S = 600.0
# One ask's wait for the status reply (see status_json).
STATUS_ASK_S = 120.0
# Room left in the pool for a fetch response's non-record bytes (partition headers:
# about 40 bytes each, 3,334 partitions per leader here).
RESPONSE_FRAME_ALLOWANCE = 1 * MIB
PRODUCE_FLUSH_S = 300.0
# After catching up, how long before RSS is read again: past one checkpoint interval (5 s
# by default), when the follower frees the idle fetch buffers it no longer needs
# (memory_pool.py's trim).
SETTLE_S = 7.0
SHM = Path("/dev/shm")
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")
DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Scenario:
    """What is replicated and under which limits."""

    partitions: int = 10_000
    topics: int = 4
    bytes_per_partition: int = 32 * KIB
    buffer_memory: int = 32 * MIB
    partition_max_bytes: int = 1 * MIB
    max_open_files: int = 256
    nofile_limit: int = 1024
    timeout_s: float = 600.0

    @property
    def response_max_bytes(self) -> int:
        # Nearly the whole pool: each leader alone could fill it. Not all of it: a
        # response's frame is max_bytes of records plus every partition's header, and
        # a frame larger than the pool is refused, which stalls that leader for good
        # (seen here with response_max_bytes == buffer_memory: a 33,672,571-byte
        # response against a 33,554,432-byte pool, 3,334 partitions on that leader).
        return self.buffer_memory - RESPONSE_FRAME_ALLOWANCE

    @property
    def partitions_per_topic(self) -> int:
        if self.partitions % self.topics:
            raise ValueError(f"{self.partitions} partitions do not split into {self.topics} topics")
        return self.partitions // self.topics


@dataclass(frozen=True, slots=True)
class FdSamples:
    """Descriptor counts seen while the daemon ran."""

    samples: int
    max_open: int  # all descriptors
    max_segment_files: int  # on .log/.index/.timeindex files: what log.max_open_files bounds
    max_other_data_files: int  # on other files under the data dir (its .lock, checkpoints)


@dataclass(frozen=True, slots=True)
class MemoryRun:
    """One run's figures; `mismatched` lists partitions whose replica end differs."""

    scenario: Scenario
    leaders: dict[int, int]  # node id -> partitions replicad fetched from it
    sessionful_leaders: int
    source_bytes: int
    peak_rss: int  # VmHWM, after a status reply too
    peak_rss_replicating: int  # VmHWM when replication had finished, before status
    rss_at_end: int  # VmRSS when replication had finished
    rss_settled: int  # VmRSS SETTLE_S later (idle buffers trimmed), before status
    pool_capacity: int
    pool_peak: int
    pool_waits: int
    fds: FdSamples
    replicate_s: float
    setup_s: float
    mismatched: tuple[TopicPartition, ...] = field(default=())
    # Bytes of idle pool buffers freed while something still held them (memory_pool.py):
    # each is memory over fetch.buffer_memory while the buffer made in its place lives.
    pool_freed_in_use: int = 0
    # The daemon's CPU seconds (user + system) when the peak was read, and the machine's
    # 1-minute load average when it started and then: on a shared machine its wall
    # seconds say little, these say how loaded the run was.
    cpu_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def rss_bound(self) -> int:
        return self.scenario.buffer_memory + RSS_HEADROOM


# -- data ------------------------------------------------------------------------------


def fill(bootstrap: str, topics: list[str], partitions: int, bytes_per_partition: int) -> None:
    """Produce `bytes_per_partition` of incompressible records into every partition."""
    rng = random.Random(9)
    values = [rng.randbytes(RECORD_BYTES) for _ in range(VALUE_POOL)]
    per_partition = max(1, bytes_per_partition // RECORD_BYTES)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "none",
            "acks": "1",
            "linger.ms": 100,
            "batch.size": 1 * MIB,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "queue.buffering.max.messages": 2_000_000,
            "logger": librdkafka_log,
        }
    )
    errors: list[str] = []

    def report(error: object, _message: object) -> None:
        if error is not None:
            errors.append(str(error))

    n = 0
    for i in range(per_partition):
        for topic in topics:
            for p in range(partitions):
                produce_when_room(
                    producer, topic, value=values[n % VALUE_POOL], partition=p, on_delivery=report
                )
                n += 1
        producer.poll(0)
        del i
    left = producer.flush(PRODUCE_FLUSH_S)
    if left or errors:
        raise RuntimeError(f"producing: {left} unsent, errors {errors[:3]}")


def source_log_bytes(cluster: KafkaCluster, topics: list[str]) -> int:
    """Bytes of .log segments the cluster holds for `topics` (what the replica must equal)."""
    total = 0
    for node in cluster.nodes:
        for topic in topics:
            for d in node.log_dir.glob(f"{topic}-*"):
                total += sum(f.stat().st_size for f in d.glob("*.log"))
    return total


def replica_log_bytes(data_dir: Path) -> int:
    total = 0
    if not data_dir.is_dir():
        return 0
    with os.scandir(data_dir) as partitions:
        for entry in partitions:
            if entry.is_dir():
                with os.scandir(entry.path) as files:
                    total += sum(f.stat().st_size for f in files if f.name.endswith(".log"))
    return total


# -- the daemon ------------------------------------------------------------------------


def daemon_config(
    scenario: Scenario, bootstrap: str, topics: list[str], data_dir: Path, socket_path: Path
) -> str:
    """The YAML config `replicad run -c` reads (JSON is YAML)."""
    return json.dumps(
        {
            "source": {"bootstrap_servers": bootstrap},
            "topics": {"include": topics},
            "data_dir": str(data_dir),
            "fetch": {
                "buffer_memory": scenario.buffer_memory,
                "response_max_bytes": scenario.response_max_bytes,
                "partition_max_bytes": scenario.partition_max_bytes,
            },
            "log": {"max_open_files": scenario.max_open_files},
            "control": {"socket": str(socket_path)},
            "logging": {"format": "json"},
        },
        indent=2,
    )


def status_bytes(pid: int) -> dict[str, int]:
    """The sizes of /proc/<pid>/status (VmHWM, VmRSS, RssAnon, ...) in bytes."""
    return {key: kib * KIB for key, kib in proc_status(pid).items()}


def anonymous_mappings(pid: int) -> dict[str, int]:
    """A process's anonymous writable mappings (its heap included) by address range, with
    their sizes: glibc maps each allocation above its mmap threshold on its own (the daemon
    pins it at 128 KiB), so a new one is one large buffer."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) < 5 or not parts[1].startswith("rw"):
                continue
            name = parts[5] if len(parts) > 5 else ""
            if name and name != "[heap]":
                continue
            start, _, end = parts[0].partition("-")
            found[f"{parts[0]} {name}".strip()] = int(end, 16) - int(start, 16)
    return found


def explain_step(pid: int, before: dict[str, int], dump: bool) -> tuple[dict[str, int], str]:
    """What changed in the anonymous mappings since `before` (new and grown ones, largest
    first), and with `dump` what every thread of the daemon is doing (py-spy dump, when
    installed): where a step of VmHWM came from."""
    now = anonymous_mappings(pid)
    heap_before = sum(v for k, v in before.items() if k.endswith("[heap]"))
    heap_now = sum(v for k, v in now.items() if k.endswith("[heap]"))
    new = sorted(
        (size for key, size in now.items() if key not in before and not key.endswith("[heap]")),
        reverse=True,
    )
    gone = sum(size for key, size in before.items() if key not in now)
    mapped = (sum(now.values()) - heap_now - (sum(before.values()) - heap_before)) / MIB
    # (The kernel merges neighbouring mappings: a new one may show merged with an old.)
    lines = [
        f"    heap {heap_before / MIB:.1f} -> {heap_now / MIB:.1f} MiB; other anonymous "
        f"mappings {mapped:+.1f} MiB: "
        f"{len(new)} new mappings, {sum(new) / MIB:.1f} MiB "
        f"(largest: {', '.join(f'{n / MIB:.2f}' for n in new[:8])} MiB); "
        f"{gone / MIB:.1f} MiB unmapped"
    ]
    spy = Path(sys.executable).with_name("py-spy")
    if dump and spy.exists():
        out = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        lines += [f"    | {line}" for line in out.stdout.splitlines()]
    return now, "\n".join(lines)


class FdSampler:
    """Counts a process's descriptors in a thread until stopped."""

    def __init__(self, pid: int, data_dir: Path, *, explain: bool = False) -> None:
        self._pid = pid
        # Say what each VmHWM step was made of (explain_step), with py-spy's stacks.
        self._explain = explain
        self._maps: dict[str, int] = {}
        self._started = time.monotonic()
        self._hwm_said = 0
        self._fd_dir = Path(f"/proc/{pid}/fd")
        self._data_prefix = f"{data_dir.resolve()}/"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fd-sampler", daemon=True)
        self.samples = 0
        self.max_open = 0
        self.max_segment_files = 0
        self.max_other_data_files = 0

    def __enter__(self) -> FdSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _say_hwm_steps(self) -> None:
        """Each rise of the daemon's VmHWM by HWM_STEP, with when: where the peak comes from
        (session 9: one step of 31 MiB at the first stall report of 9,804 partitions)."""
        try:
            status = status_bytes(self._pid)
        except OSError:  # the process is gone
            return
        hwm = status.get("VmHWM", 0)
        rose = hwm >= self._hwm_said + HWM_STEP
        if self._explain:
            try:
                if rose and self._maps:
                    self._maps, said = explain_step(self._pid, self._maps, dump=True)
                    print(said, file=sys.stderr, flush=True)
                else:
                    self._maps = anonymous_mappings(self._pid)
            except (OSError, subprocess.SubprocessError):  # the process is gone
                return
        if rose:
            self._hwm_said = hwm
            rss, anon = status.get("VmRSS", 0) / MIB, status.get("RssAnon", 0) / MIB
            print(
                f"  {time.monotonic() - self._started:7.1f} s: VmHWM {hwm / MIB:6.1f} MiB "
                f"(RSS {rss:.1f}, anonymous {anon:.1f})",
                file=sys.stderr,
                flush=True,
            )

    def result(self) -> FdSamples:
        return FdSamples(
            self.samples, self.max_open, self.max_segment_files, self.max_other_data_files
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_INTERVAL_S)

    def sample(self) -> None:
        self._say_hwm_steps()
        try:
            names = os.listdir(self._fd_dir)
        except OSError:  # the process is gone
            return
        segment_files = other_data_files = 0
        for name in names:
            try:
                target = os.readlink(self._fd_dir / name)
            except OSError:  # closed between listdir and readlink
                continue
            if target.startswith(self._data_prefix):
                # A file unlinked while open reads "<path> (deleted)".
                if target.removesuffix(DELETED).endswith(SEGMENT_SUFFIXES):
                    segment_files += 1
                else:
                    other_data_files += 1
        self.samples += 1
        self.max_open = max(self.max_open, len(names))
        self.max_segment_files = max(self.max_segment_files, segment_files)
        self.max_other_data_files = max(self.max_other_data_files, other_data_files)


def status_json(socket_path: Path) -> dict:
    """The daemon's status, each ask waiting STATUS_ASK_S, asked again until
    STATUS_TIMEOUT_S: `replicad status`'s own 5 s was too short for 10,000 partitions on a
    loaded machine (session 9, load 26; session 14 at load 28-33: 115 asks in 600 s, none
    answered), and the daemon builds no reply for a client that gave up (control/server.py)."""
    deadline = time.monotonic() + STATUS_TIMEOUT_S
    while True:
        try:
            return query(socket_path, timeout_s=STATUS_ASK_S)
        except ControlError:  # not answering (yet)
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"replicad status: no daemon answers on {socket_path}")
        print("replicad status: no answer yet, asking again", file=sys.stderr)


def run(
    cluster: KafkaCluster,
    workdir: Path,
    scenario: Scenario,
    *,
    prefix: str = "mem",
    explain: bool = False,
    trace_out: Path | None = None,
) -> MemoryRun:
    """Fill topics on the running `cluster`, replicate them with one `replicad run`, measure."""
    setup_started = time.monotonic()
    topics = [f"{prefix}-{i}" for i in range(scenario.topics)]
    cluster.create_topics(topics, scenario.partitions_per_topic, timeout_s=scenario.timeout_s)
    fill(cluster.bootstrap, topics, scenario.partitions_per_topic, scenario.bytes_per_partition)
    source_ends = cluster.end_offsets(topics)
    source_bytes = source_log_bytes(cluster, topics)
    setup_s = time.monotonic() - setup_started

    data_dir = workdir / "replica"
    socket_path = workdir / "c.sock"
    config = workdir / "replicad.yaml"
    config.write_text(daemon_config(scenario, cluster.bootstrap, topics, data_dir, socket_path))
    daemon = ReplicadProcess(["run", "-c", str(config)], log_path=workdir / "replicad.log")
    # prlimit sets the limit and execs the daemon: the pid stays the daemon's, and the
    # daemon cannot raise its soft limit above this hard one. The daemon runs as
    # installed for production, without the test extra's hypothesis (kio imports it
    # when present: 8 MiB of RSS that no production replicad has).
    limit = f"--nofile={scenario.nofile_limit}:{scenario.nofile_limit}"
    program = replicad_argv("run", "-c", str(config), as_installed=True)
    if trace_out is not None:
        # The same daemon under tracemalloc (tools/bench/traced.py), from this checkout.
        program = [sys.executable, "-c", traced.PROGRAM, "run", "-c", str(config)]
        root = str(Path(__file__).resolve().parents[2])
        daemon.env[traced.ENV] = str(trace_out)
        daemon.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, daemon.env.get("PYTHONPATH")) if p
        )
    daemon.args = ["prlimit", limit, "--", *program]
    load_at_start = os.getloadavg()[0]
    started = time.monotonic()
    daemon.start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    try:
        with FdSampler(pid, data_dir, explain=explain) as sampler:

            def replicated() -> bool:
                if not daemon.running:
                    raise RuntimeError(f"replicad exited: {daemon.output()[-3000:]}")
                return replica_log_bytes(data_dir) >= source_bytes

            wait_until(
                replicated,
                timeout_s=scenario.timeout_s,
                interval_s=0.5,
                what=f"{source_bytes:,} bytes replicated",
            )
            replicate_s = time.monotonic() - started
            caught_up = status_bytes(pid)
            # Said now: a status reply that never comes (a loaded machine) must not lose them.
            print(
                f"caught up in {replicate_s:.1f} s: VmHWM {caught_up['VmHWM'] / MIB:.1f} MiB, "
                f"VmRSS {caught_up['VmRSS'] / MIB:.1f} MiB, daemon CPU {cpu_seconds(pid):.1f} s, "
                f"load {load_at_start:.1f}-{os.getloadavg()[0]:.1f}",
                file=sys.stderr,
            )
            time.sleep(SETTLE_S)
            settled = status_bytes(pid)
            print(
                f"{SETTLE_S:.0f} s later: VmHWM {settled['VmHWM'] / MIB:.1f} MiB, "
                f"VmRSS {settled['VmRSS'] / MIB:.1f} MiB",
                file=sys.stderr,
            )
            asked = time.monotonic()
            snap = status_json(socket_path)
            print(f"status answered in {time.monotonic() - asked:.1f} s", file=sys.stderr)
            sampler.sample()
            # The high-water mark over the daemon's whole life so far, status reply included.
            peak_rss = status_bytes(pid)["VmHWM"]
            cpu_s, load_at_end = cpu_seconds(pid), os.getloadavg()[0]
    finally:
        code = daemon.stop(timeout_s=120)
    if code != 0:
        raise RuntimeError(f"replicad exited with {code}: {daemon.output()[-3000:]}")
    replica_ends = end_offsets(data_dir)
    mismatched = tuple(sorted(tp for tp, end in source_ends.items() if replica_ends.get(tp) != end))
    pool = snap["memory_pool"]
    return MemoryRun(
        scenario=scenario,
        leaders={leader["node_id"]: leader["partitions"] for leader in snap["leaders"]},
        sessionful_leaders=sum(1 for leader in snap["leaders"] if leader["sessionful"]),
        source_bytes=source_bytes,
        peak_rss=peak_rss,
        peak_rss_replicating=caught_up["VmHWM"],
        rss_at_end=caught_up["VmRSS"],
        rss_settled=settled["VmRSS"],
        pool_capacity=pool["capacity"],
        pool_peak=pool["peak"],
        pool_waits=pool["waits"],
        pool_freed_in_use=pool.get("freed_in_use", 0),
        fds=sampler.result(),
        replicate_s=replicate_s,
        setup_s=setup_s,
        mismatched=mismatched,
        cpu_s=cpu_s,
        load=(load_at_start, load_at_end),
    )


# -- command line ----------------------------------------------------------------------


def table(runs: list[MemoryRun]) -> str:
    head = (
        "| partitions | leaders | buffer.memory | peak RSS (VmHWM) "
        f"| VmHWM before status | RSS when caught up | RSS {SETTLE_S:.0f} s later "
        "| bound | pool peak | "
        "pool waits | pool buffers freed while held "
        "| max open fds (RLIMIT) | max segment fds (log.max_open_files) | "
        "replicated | replicate s | daemon CPU s | load (1 min) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {r.scenario.partitions:,} | {len(r.leaders)} "
        f"| {r.scenario.buffer_memory / MIB:.0f} MiB "
        f"| {r.peak_rss / MIB:.1f} MiB | {r.peak_rss_replicating / MIB:.1f} MiB "
        f"| {r.rss_at_end / MIB:.1f} MiB | {r.rss_settled / MIB:.1f} MiB "
        f"| {r.rss_bound / MIB:.0f} MiB "
        f"| {r.pool_peak / MIB:.1f} MiB | {r.pool_waits} | {r.pool_freed_in_use / MIB:.1f} MiB "
        f"| {r.fds.max_open} ({r.scenario.nofile_limit}) "
        f"| {r.fds.max_segment_files} ({r.scenario.max_open_files}) "
        f"| {r.source_bytes / MIB:.0f} MiB{'' if not r.mismatched else ' MISMATCH'} "
        f"| {r.replicate_s:.1f} | {r.cpu_s:.1f} | {r.load[0]:.1f}-{r.load[1]:.1f} |"
        for r in runs
    ]
    return "\n".join([head, *rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--kib-per-partition", type=int, default=32)
    parser.add_argument("--buffer-mib", type=int, default=32)
    parser.add_argument("--max-open-files", type=int, default=256)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument(
        "--explain-steps",
        action="store_true",
        help="at each VmHWM step, the new anonymous mappings and py-spy's dump of the daemon",
    )
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        metavar="FILE",
        help="run the daemon under tracemalloc and write where each rise of its Python "
        "memory was allocated to FILE (tools/bench/traced.py; slows the daemon: "
        "for a quiet machine)",
    )
    args = parser.parse_args()
    scenario = Scenario(
        partitions=args.partitions,
        topics=args.topics,
        bytes_per_partition=args.kib_per_partition * KIB,
        buffer_memory=args.buffer_mib * MIB,
        max_open_files=args.max_open_files,
        nofile_limit=args.nofile,
    )
    workdir = Path(tempfile.mkdtemp(prefix="replicad-mem-", dir=SHM if SHM.is_dir() else None))
    try:
        started = time.monotonic()
        with KafkaCluster(workdir / "kafka") as cluster:
            print(
                f"cluster of {len(cluster.nodes)} up in {time.monotonic() - started:.1f} s",
                file=sys.stderr,
            )
            result = run(
                cluster, workdir, scenario, explain=args.explain_steps, trace_out=args.tracemalloc
            )
        print(
            f"setup {result.setup_s:.1f} s, replication {result.replicate_s:.1f} s", file=sys.stderr
        )
        print(table([result]))
        print(f"\n{kafka_settings(nodes=len(cluster.nodes))}")
        return 0 if not result.mismatched else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
