"""`replicad serve`, measured; prints markdown tables.

    .venv/bin/python -m tools.bench.serve [--mib 512] [--partitions 4]
        [--downconvert-mib 256] [--idle-partitions 10000] [--idle-fetches 300] [--dir DIR]

1. replicad -> replicad on loopback: a data dir of MIB (1 KiB random values, 64 KiB
   batches) is served by `replicad serve` (a subprocess) and copied by `replicad run` as a
   privileged follower (replica id 7); MB/s of record batches, next to the loopback TCP
   limit measured in the same run (tools/bench/replicate.py's one-connection copy).
2. Down-conversion memory: one Fetch v3 (magic 1 client) of DOWNCONVERT_MIB over the same
   kind of data, answered by lazy, chunked down-conversion (KIP-283); the server's RSS is
   sampled every few milliseconds while the client drains the answer. Next to it the same
   fetch as v12 (zero-copy sendfile, no conversion).
3. Idle fetches at IDLE_PARTITIONS partitions with nothing new: server CPU per fetch with
   a fetch session (incremental fetches naming no partition) and without (every request
   lists every partition), plus the request and response sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from replicad.clock import wall_ms
from replicad.leader.legacy_codec import (
    LegacyFetchPartition,
    LegacyFetchRequest,
    LegacyFetchTopic,
    encode_fetch_request,
)
from replicad.log.config import LogConfig
from replicad.log.layout import partition_dir_name
from replicad.log.manager import LogManager
from replicad.protocol.codec import encode_request
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.requests import metadata_request
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.bench.replicate import loopback_mb_per_s, run_measured
from tools.logdata.batches import producer_batch
from tools.peers.process import free_port, port_accepts
from tools.peers.wire import read_exactly
from tools.replica import replicad_argv, wait_until

KIB = 1024
MIB = 1024 * KIB
MB = 1_000_000
FOLLOWER_ID = 7
BATCH_RECORDS = 64
VALUE_BYTES = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")
SIZE = struct.Struct(">i")

SERVE_SNIPPET = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from replicad.leader.server import serve_forever
    from replicad.leader.settings import ServeSettings
    from replicad.logs import configure_logging
    configure_logging("warning", "json")
    settings = ServeSettings(**json.loads(sys.argv[3]))
    sys.exit(asyncio.run(serve_forever(Path(sys.argv[1]), sys.argv[2], settings=settings,
                                       allowed_followers=frozenset({7}))))
    """
)


# -- data -------------------------------------------------------------------------------------


def fill_data_dir(directory: Path, partitions: int, total_bytes: int) -> int:
    """`partitions` partitions of 64-record batches, `total_bytes` in all; returns the bytes."""
    template = producer_batch(0, [os.urandom(VALUE_BYTES) for _ in range(BATCH_RECORDS)])
    per_partition = max(total_bytes // partitions // len(template), 1)
    chunk_batches = max(4 * MIB // len(template), 1)
    logs = LogManager.open(directory, LogConfig(), now_ms=wall_ms())
    written = 0
    try:
        for p in range(partitions):
            tp = TopicPartition("bench", p)
            plog = logs.get_or_create(tp)
            done = 0
            while done < per_partition:
                n = min(chunk_batches, per_partition - done)
                data = bytearray(template * n)
                for i in range(n):  # consecutive offsets; the base offset is outside the CRC
                    struct.pack_into(">q", data, i * len(template), (done + i) * BATCH_RECORDS)
                plog.append(data, scan_batches(data, verify_crc=False).batches, now_ms=0)
                written += len(data)
                done += n
        logs.checkpoint({tp: p.log_end_offset for tp, p in logs.partitions().items()})
    finally:
        logs.close()
    return written


def many_idle_partitions(directory: Path, count: int) -> None:
    """`count` partitions with one small batch each. The first is written by the log store;
    the rest are copies of its files (no fsync per partition: this is a benchmark's set-up)."""
    logs = LogManager.open(directory, LogConfig(segment_index_bytes=64 * KIB), now_ms=0)
    template_tp = TopicPartition("idle", 0)
    plog = logs.get_or_create(template_tp, topic_id=uuid.uuid4())
    data = producer_batch(0, [b"idle"])
    plog.append(data, scan_batches(data).batches, now_ms=0)
    logs.close()
    template = directory / partition_dir_name(template_tp)
    for p in range(1, count):
        shutil.copytree(template, directory / partition_dir_name(TopicPartition("idle", p)))
    checkpoint = ["0", str(count)] + [f"idle {p} 1" for p in range(count)]
    for name in ("replication-offset-checkpoint", "recovery-point-offset-checkpoint"):
        (directory / name).write_text("\n".join(checkpoint) + "\n")


# -- processes --------------------------------------------------------------------------------


class Serve:
    """`replicad serve` in a subprocess (serve_forever, as the CLI will call it)."""

    def __init__(self, data_dir: Path, log_path: Path, **settings: object) -> None:
        self.port = free_port()
        self.log_path = log_path
        self._out = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SERVE_SNIPPET,
                str(data_dir),
                f"127.0.0.1:{self.port}",
                json.dumps(settings),
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        wait_until(
            lambda: port_accepts(self.port) or self.proc.poll() is not None,
            timeout_s=300,
            interval_s=0.1,
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"replicad serve exited: {log_path.read_text()[-2000:]}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self._out.close()


def _log_bytes(data_dir: Path) -> int:
    """Bytes of segments under `data_dir` (the follower writes whole batches only)."""
    return sum(p.stat().st_size for p in data_dir.glob("*/*.log")) if data_dir.exists() else 0


# -- 1. replicad -> replicad ----------------------------------------------------------------------


@dataclasses.dataclass
class ChainResult:
    bytes: int
    seconds: float
    follower_cpu_s: float
    follower_peak_mib: float
    serve_cpu_s: float


def bench_chain(work: Path, total_bytes: int, partitions: int) -> ChainResult:
    source = work / "a"
    written = fill_data_dir(source, partitions, total_bytes)
    serve = Serve(source, work / "serve-a.log")
    try:
        cpu_before = serve.cpu_s()
        config = work / "b.yaml"
        config.write_text(
            f"source:\n  bootstrap_servers: ['{serve.bootstrap}']\ntopics:\n  include: [bench]\n"
            f"fetch:\n  replica_id: {FOLLOWER_ID}\n"
            f"data_dir: '{work / 'b'}'\ncontrol:\n  socket: '{work / 'b.sock'}'\n"
            "logging:\n  level: warning\n"
        )
        seconds, cpu, peak = run_measured(
            replicad_argv("run", "-c", str(config)),
            until=lambda: _log_bytes(work / "b") >= written,
        )
        serve_cpu = serve.cpu_s() - cpu_before
    finally:
        serve.stop()
    return ChainResult(written, seconds, cpu, peak, serve_cpu)


# -- 2. down-conversion memory ---------------------------------------------------------------


@dataclasses.dataclass
class FetchMemory:
    label: str
    response_bytes: int
    seconds: float
    rss_before_mib: float
    rss_peak_mib: float


def legacy_fetch_frame(partitions: int, per_partition: int, total: int) -> bytes:
    request = LegacyFetchRequest(
        3,
        -1,
        0,
        1,
        total,
        (
            LegacyFetchTopic(
                "bench", tuple(LegacyFetchPartition(p, 0, per_partition) for p in range(partitions))
            ),
        ),
    )
    body = encode_fetch_request(request)
    client_id = b"bench"
    header = struct.pack(">hhih", 1, 3, 1, len(client_id)) + client_id
    return SIZE.pack(len(header) + len(body)) + header + body


def modern_fetch_frame(partitions: int, per_partition: int, total: int) -> bytes:
    spec = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=total,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        partitions=tuple(
            RequestedPartition.of(TopicPartition("bench", p), 0, per_partition)
            for p in range(partitions)
        ),
    )
    return encode_request(fetch_request(12, spec), correlation_id=1, client_id="bench")


def drain_one_response(serve: Serve, frame: bytes, label: str) -> FetchMemory:
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(serve.rss_mib())
            time.sleep(0.003)

    before = serve.rss_mib()
    sampler = threading.Thread(target=sample)
    with socket.create_connection(("127.0.0.1", serve.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MIB)
        started = time.monotonic()
        sampler.start()
        sock.sendall(frame)
        head = read_exactly(sock, SIZE.size)
        (size,) = SIZE.unpack(head)
        buf = bytearray(MIB)
        got = 0
        while got < size:
            n = sock.recv_into(buf, min(len(buf), size - got))
            if not n:
                raise RuntimeError("server closed the connection mid-response")
            got += n
        seconds = time.monotonic() - started
    stop.set()
    sampler.join()
    return FetchMemory(label, size, seconds, before, max(samples, default=before))


def bench_downconversion(work: Path, total_bytes: int, partitions: int) -> list[FetchMemory]:
    data_dir = work / "c"
    fill_data_dir(data_dir, partitions, total_bytes)
    per_partition = total_bytes // partitions + MIB
    serve = Serve(data_dir, work / "serve-c.log", fetch_max_bytes=2**31 - 1)
    try:
        return [
            drain_one_response(
                serve,
                modern_fetch_frame(partitions, per_partition, 2**31 - 1),
                "Fetch v12 (sendfile)",
            ),
            drain_one_response(
                serve,
                legacy_fetch_frame(partitions, per_partition, 2**31 - 1),
                "Fetch v3 (down-converted to magic 1)",
            ),
        ]
    finally:
        serve.stop()


# -- 3. idle fetches ----------------------------------------------------------------------------


@dataclasses.dataclass
class IdleResult:
    label: str
    fetches: int
    cpu_us_per_fetch: float
    request_bytes: int
    response_bytes: int


async def idle_fetches(
    serve: Serve, partitions: int, fetches: int, *, sessions: bool
) -> IdleResult:
    conn = BrokerConnection(
        BrokerAddress(0, "127.0.0.1", serve.port),
        client_id="bench",
        connect_timeout_s=10,
        request_timeout_s=120,
    )
    await conn.connect()
    try:
        meta = await conn.request(metadata_request(12, ["idle"]))
        topic_id = meta.topics[0].topic_id
        everything = tuple(
            RequestedPartition.of(TopicPartition("idle", p), 1, MIB, topic_id=topic_id)
            for p in range(partitions)
        )

        def request(session_id: int, epoch: int, parts: tuple[RequestedPartition, ...]) -> object:
            spec = FetchRequest(0, 1, 50 * MIB, 0, session_id, epoch, parts)
            return fetch_request(17, spec)

        session_id, epoch = 0, -1
        if sessions:
            created = await conn.request(request(0, 0, everything))
            session_id, epoch = created.session_id, 1
            assert session_id != 0, "the server created no session"
        requests = [
            request(session_id, epoch + i if sessions else -1, () if sessions else everything)
            for i in range(fetches)
        ]
        sent_before, received_before = conn.bytes_sent, conn.bytes_received
        cpu_before = serve.cpu_s()
        for r in requests:
            await conn.request(r)
        cpu = serve.cpu_s() - cpu_before
        return IdleResult(
            "sessions on (incremental, no partition named)"
            if sessions
            else "sessions off (every partition, every fetch)",
            fetches,
            cpu / fetches * 1e6,
            (conn.bytes_sent - sent_before) // fetches,
            (conn.bytes_received - received_before) // fetches,
        )
    finally:
        await conn.close()


def bench_idle(work: Path, partitions: int, fetches: int) -> list[IdleResult]:
    data_dir = work / "idle"
    many_idle_partitions(data_dir, partitions)
    serve = Serve(data_dir, work / "serve-idle.log")
    try:
        return [
            asyncio.run(idle_fetches(serve, partitions, fetches, sessions=True)),
            asyncio.run(idle_fetches(serve, partitions, max(fetches // 10, 3), sessions=False)),
        ]
    finally:
        serve.stop()


# -- report ---------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="replicad -> replicad volume")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--downconvert-mib", type=int, default=256)
    parser.add_argument("--idle-partitions", type=int, default=10_000)
    parser.add_argument("--idle-fetches", type=int, default=300)
    parser.add_argument(
        "--dir", type=Path, default=None, help="work directory (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    work = Path(tempfile.mkdtemp(prefix="replicad-serve-bench-", dir=args.dir))
    report: list[str] = []
    try:
        loop = loopback_mb_per_s(min(2 * 1024 * MIB, max(args.mib, 64) * MIB))
        chain = bench_chain(work, args.mib * MIB, args.partitions)
        report.append("### replicad -> replicad on loopback\n")
        report.append(
            table(
                [
                    "what",
                    "MB",
                    "seconds",
                    "MB/s",
                    "follower CPU s",
                    "follower peak RSS MiB",
                    "serve CPU s",
                ],
                [
                    [
                        "replicad run <- replicad serve",
                        f"{chain.bytes / MB:,.0f}",
                        f"{chain.seconds:.1f}",
                        f"{chain.bytes / MB / chain.seconds:,.0f}",
                        f"{chain.follower_cpu_s:.1f}",
                        f"{chain.follower_peak_mib:.0f}",
                        f"{chain.serve_cpu_s:.1f}",
                    ],
                    ["loopback TCP limit (same run)", "", "", f"{loop:,.0f}", "", "", ""],
                ],
            )
        )
        memory = bench_downconversion(work, args.downconvert_mib * MIB, args.partitions)
        report.append("\n### One large fetch: server memory\n")
        report.append(
            table(
                [
                    "fetch",
                    "response MB",
                    "seconds",
                    "server RSS before MiB",
                    "peak MiB",
                    "growth MiB",
                ],
                [
                    [
                        m.label,
                        f"{m.response_bytes / MB:,.0f}",
                        f"{m.seconds:.1f}",
                        f"{m.rss_before_mib:.1f}",
                        f"{m.rss_peak_mib:.1f}",
                        f"{m.rss_peak_mib - m.rss_before_mib:.1f}",
                    ]
                    for m in memory
                ],
            )
        )
        idle = bench_idle(work, args.idle_partitions, args.idle_fetches)
        report.append(f"\n### Idle fetches at {args.idle_partitions:,} partitions\n")
        report.append(
            table(
                ["fetches", "server CPU µs per fetch", "request bytes", "response bytes", "count"],
                [
                    [
                        r.label,
                        f"{r.cpu_us_per_fetch:,.0f}",
                        f"{r.request_bytes:,}",
                        f"{r.response_bytes:,}",
                        r.fetches,
                    ]
                    for r in idle
                ],
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
