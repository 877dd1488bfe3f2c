"""`replicad serve`'s memory for TLS connections that never finish their handshake.

`replicad serve` (the CLI, as shipped) listens with TLS on an empty data directory. Then,
ROUNDS times, CONNECTIONS clients connect at once and never finish a handshake -- either
silent (they send nothing) or stalled (they send the first bytes of a ClientHello and
nothing more) -- and serve closes them at its handshake deadline
(`authentication_timeout_ms`, 10 s by default). The server's RSS is taken before, at
its peak during the rounds (sampled every 50 ms), and after the last round. Last, one
real client completes a handshake, to show the listener still serves.

    .venv/bin/python -m tools.bench.tls_handshakes [--connections 1000] [--rounds 2]
        [--kind silent,stalled]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.peers.pki import make_test_pki
from tools.peers.process import free_port, port_accepts, rss_mib
from tools.replica import replicad_argv, wait_until

MIB = 1024 * 1024
# A TLS handshake record's header and the start of a ClientHello: a client that stalls
# after these has begun its handshake, and the server must hold TLS state for it.
CLIENT_HELLO_START = bytes.fromhex("160301020001")
# Longer than serve's handshake deadline (10 s): every connection is closed within it.
ROUND_TIMEOUT_S = 60.0
TARGET_GROWTH_MIB = 64


@dataclass(frozen=True, slots=True)
class Result:
    kind: str
    connections: int
    rounds: int
    before_mib: float
    peak_mib: float
    after_mib: float
    served_after: bool


@contextlib.contextmanager
def tls_serve(work: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    pki = make_test_pki(work / "pki")
    data = work / "data"
    data.mkdir()
    port = free_port()
    with (work / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            replicad_argv(
                "serve",
                "--data-dir",
                str(data),
                "--listen",
                f"127.0.0.1:{port}",
                "--tls-cert-file",
                str(pki.broker_cert),
                "--tls-key-file",
                str(pki.broker_key),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(
                lambda: port_accepts(port) or proc.poll() is not None,
                timeout_s=120,
                interval_s=0.1,
            )
            if proc.poll() is not None:
                raise RuntimeError(f"replicad serve exited: {(work / 'serve.log').read_text()}")
            yield proc, port, pki.ca
        finally:
            proc.terminate()
            proc.wait(60)


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def one_round(port: int, connections: int, kind: str) -> None:
    socks: list[socket.socket] = []
    try:
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if kind == "stalled":
                sock.sendall(CLIENT_HELLO_START)
            socks.append(sock)
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(closed_by_server(s) for s in socks):
                return
            time.sleep(0.5)
        raise RuntimeError(f"serve left {connections} unfinished handshakes open")
    finally:
        for sock in socks:
            sock.close()


def handshake_completes(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.version() is not None


def measure(kind: str, connections: int, rounds: int) -> Result:
    with (
        tempfile.TemporaryDirectory(prefix="replicad-tls-bench-") as tmp,
        tls_serve(Path(tmp)) as (proc, port, ca),
    ):
        handshake_completes(port, ca)  # TLS's own start-up costs are not the clients'
        time.sleep(1)
        before = rss_mib(proc.pid)
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.05):
                peak.append(rss_mib(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            for _ in range(rounds):
                one_round(port, connections, kind)
        finally:
            stop.set()
            sampler.join()
        time.sleep(2)  # connections closed at the deadline finish closing
        after = rss_mib(proc.pid)
        return Result(
            kind, connections, rounds, before, max(peak), after, handshake_completes(port, ca)
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kind", default="silent,stalled")
    args = parser.parse_args(argv)
    results = [measure(k, args.connections, args.rounds) for k in args.kind.split(",")]
    print(
        "| clients | rounds x connections | RSS before MiB | peak MiB | after MiB "
        "| after - before MiB | a real handshake after |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r.kind} | {r.rounds} x {r.connections:,} | {r.before_mib:.0f} | "
            f"{r.peak_mib:.0f} | {r.after_mib:.0f} | {r.after_mib - r.before_mib:+.0f} "
            f"(target <= +{TARGET_GROWTH_MIB}) | {'completes' if r.served_after else 'FAILS'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
