"""Hostile clients of `replicad serve`: raw-socket probes of what one unauthenticated client
can make a Kafka-protocol server do, each bounded in connections, bytes and time.

Each probe is a function of the server's address returning a `ProbeResult` (what was sent,
how the server answered); a `FetchLatency` runs beside it, a client doing ordinary Fetch
round trips on a connection of its own, so a test or `main()` can hold the server to
serving it while the probe runs. Frames are built by hand here (struct), not by kio: a
hostile client sends what no codec would write (6.5 million partitions, invalid UTF-8,
versions that do not exist).

Probes:
- `huge_fetch`: one well-formed Fetch v4 naming `partitions` unknown partitions.
- `stalled_frames`: connections that declare a large frame, send most of it, then stall.
- `connection_flood`: idle connections, as many as asked.
- `pipelining`: connections sending ApiVersions back to back without reading.
- `unknown_versions`: one connection asking ApiVersions v5 .. vN, and api keys no one has.
- `legacy_invalid_utf8`: Fetch v0 requests whose client id is not UTF-8.
- `sasl_plain_guesses`: SASL PLAIN attempts with a wrong password, one per connection.
- `sasl_scram_guesses`: the same with SCRAM (a wrong proof).
- `scram_replay`: a recorded SCRAM exchange sent again on a new connection.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from replicad.clock import wall_ms
from tools.peers.process import rss_mib
from tools.wait import DEADLINE_S, wait_until

FETCH, LIST_OFFSETS, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 1, 2, 17, 18, 36
NO_REPLICA = -1
_HEAD = struct.Struct(">hhi")
_I32 = struct.Struct(">i")
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: str
    connections: int
    bytes_sent: int
    # How the server ended it: "closed" (it hung up), "answered", or "open" (still was).
    outcome: str
    seconds: float


def request_frame(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: bytes = b"hostile"
) -> bytes:
    """A size-prefixed request with a v1 header (a legacy string client id)."""
    frame = (
        _HEAD.pack(api_key, version, correlation_id)
        + struct.pack(">h", len(client_id))
        + client_id
        + body
    )
    return _I32.pack(len(frame)) + frame


def fetch_v4_body(
    partitions: dict[str, list[int]] | int, *, offset: int = 0, max_wait_ms: int = 0
) -> bytes:
    """A Fetch v4 body; an int is that many partitions of made-up topics, 1,000 a topic."""
    if isinstance(partitions, int):
        per_topic = 1000
        partitions = {
            f"hostile-{t}": list(range(min(per_topic, partitions - t * per_topic)))
            for t in range((partitions + per_topic - 1) // per_topic)
        }
    parts = [struct.pack(">iiiib", NO_REPLICA, max_wait_ms, 1, 1 << 20, 0)]
    parts.append(_I32.pack(len(partitions)))
    entry = struct.Struct(">iqi")
    for topic, indexes in partitions.items():
        name = topic.encode()
        parts.append(struct.pack(">h", len(name)) + name + _I32.pack(len(indexes)))
        parts.extend(entry.pack(p, offset, 1 << 20) for p in indexes)
    return b"".join(parts)


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame (without its size), or None when the server closed."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = _I32.unpack(head)
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        try:
            chunk = sock.recv(min(count - len(chunks), 1 << 20))
        except (ConnectionResetError, BrokenPipeError):
            return None
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _outcome(sock: socket.socket, timeout_s: float) -> str:
    sock.settimeout(timeout_s)
    try:
        return "answered" if read_frame(sock) is not None else "closed"
    except TimeoutError:
        return "open"


# -- the probes --------------------------------------------------------------------------------


def huge_fetch(address: tuple[str, int], partitions: int, *, timeout_s: float = 60) -> ProbeResult:
    frame = request_frame(FETCH, 4, 1, fetch_v4_body(partitions))
    start = time.monotonic()
    with connect(address) as sock:
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            return ProbeResult("huge_fetch", 1, len(frame), "closed", time.monotonic() - start)
        outcome = _outcome(sock, timeout_s)
    return ProbeResult("huge_fetch", 1, len(frame), outcome, time.monotonic() - start)


@contextlib.contextmanager
def stalled_frames(
    address: tuple[str, int], connections: int, declared_bytes: int, sent_bytes: int
) -> Iterator[list[socket.socket]]:
    """`connections` connections each declaring a frame of `declared_bytes` and sending
    `sent_bytes` of it; held open (stalled) inside the block, closed after."""
    socks: list[socket.socket] = []
    payload = _HEAD.pack(FETCH, 4, 1) + bytes(max(0, sent_bytes - _HEAD.size))
    try:
        for _ in range(connections):
            sock = connect(address)
            socks.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(_I32.pack(declared_bytes) + payload[:sent_bytes])
        yield socks
    finally:
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def connection_flood(address: tuple[str, int], connections: int) -> Iterator[list[socket.socket]]:
    """`connections` idle connections (those the server refuses are closed by it)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(connections):
            try:
                socks.append(connect(address))
            except OSError:
                break
        yield socks
    finally:
        for sock in socks:
            sock.close()


def still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed `sock` (a peek that does not wait)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


# ListOffsets v1 naming no topic: 20 bytes asked, 12 answered. The answers being small,
# the server never waits to write them (a server that does not yield between requests
# then never yields at all while requests are buffered).
EMPTY_LIST_OFFSETS = (LIST_OFFSETS, 1, struct.pack(">ii", NO_REPLICA, 0))


@dataclass
class Pipelining:
    """Connections sending requests back to back (ListOffsets v1 naming no topic) and
    draining the answers: the most work a client can ask for per byte, all of it
    buffered at the server."""

    address: tuple[str, int]
    connections: int
    # Requests per send: a large batch fills the server's buffers in one go.
    batch: int = 200_000
    requests: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _socks: list[socket.socket] = field(default_factory=list)

    def __enter__(self) -> Pipelining:
        for _ in range(self.connections):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
        for thread in self._threads:
            thread.join(10)
        for sock in self._socks:
            sock.close()

    def _run(self) -> None:
        api_key, version, body = EMPTY_LIST_OFFSETS
        burst = request_frame(api_key, version, 7, body) * self.batch
        sock = connect(self.address)
        sock.settimeout(None)  # shared by both threads; __exit__ shuts it down
        self._socks.append(sock)
        drain = threading.Thread(target=_drain, args=(sock, self._stop), daemon=True)
        drain.start()
        while not self._stop.is_set():
            try:
                sock.sendall(burst)
            except OSError:
                return
            self.requests += self.batch


def _drain(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            if not sock.recv(1 << 16):
                return
        except OSError:
            return


def unknown_versions(
    address: tuple[str, int], last_version: int = 32767, *, api_keys: range = range(0)
) -> ProbeResult:
    """ApiVersions v5 .. `last_version` on one connection (each answered with v0's error),
    then one request of each of `api_keys` at a version no one serves."""
    start = time.monotonic()
    sent = 0
    with connect(address) as sock:
        sock.settimeout(30)
        outcome = "answered"
        for version in range(5, last_version + 1):
            frame = request_frame(API_VERSIONS, version, version, b"")
            sock.sendall(frame)
            sent += len(frame)
            if read_frame(sock) is None:
                outcome = "closed"
                break
        for api_key in api_keys:
            with connect(address) as other:
                frame = request_frame(api_key, 32767, 1, b"")
                other.sendall(frame)
                sent += len(frame)
                _outcome(other, 10)
    elapsed = time.monotonic() - start
    return ProbeResult("unknown_versions", 1 + len(api_keys), sent, outcome, elapsed)


def legacy_invalid_utf8(address: tuple[str, int], requests: int = 1) -> ProbeResult:
    """Fetch v0 requests whose client id is not UTF-8 (each on a connection of its own)."""
    start = time.monotonic()
    sent = 0
    outcome = "closed"
    for i in range(requests):
        body = struct.pack(">iiii", NO_REPLICA, 0, 1, 0)  # no topics
        frame = request_frame(FETCH, 0, i, body, client_id=b"\xff\xfe\xfd")
        with connect(address) as sock:
            sock.sendall(frame)
            sent += len(frame)
            outcome = _outcome(sock, 10)
    return ProbeResult("legacy_invalid_utf8", requests, sent, outcome, time.monotonic() - start)


@dataclass(frozen=True, slots=True)
class Guesses:
    attempts: int
    refused: int  # answered with an error (then closed)
    seconds: float
    slowest_answer_s: float

    @property
    def per_second(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0


def sasl_plain_guesses(
    address: tuple[str, int], user: str, attempts: int, *, password: str = "guess"
) -> Guesses:
    """`attempts` SASL PLAIN logins with a wrong password, one after the other, each on a
    connection of its own (SaslHandshake v1, then SaslAuthenticate v1)."""
    start = time.monotonic()
    refused = 0
    slowest = 0.0
    token = b"\0" + user.encode() + b"\0" + password.encode()
    for i in range(attempts):
        with connect(address) as sock:
            sock.settimeout(30)
            mechanism = b"PLAIN"
            sock.sendall(
                request_frame(SASL_HANDSHAKE, 1, i, struct.pack(">h", len(mechanism)) + mechanism)
            )
            if read_frame(sock) is None:
                continue
            asked = time.monotonic()
            sock.sendall(request_frame(SASL_AUTHENTICATE, 1, i, _I32.pack(len(token)) + token))
            answer = read_frame(sock)
            slowest = max(slowest, time.monotonic() - asked)
            if answer is not None and struct.unpack_from(">h", answer, 4)[0] != 0:
                refused += 1
    return Guesses(attempts, refused, time.monotonic() - start, slowest)


@dataclass(frozen=True, slots=True)
class Replay:
    recorded_error: int  # SaslAuthenticate's error code for the honest exchange (0 = ok)
    replayed_error: int  # ... for the recorded client-final sent again on a new connection
    closed_after_replay: bool


def _sasl_step(sock: socket.socket, correlation_id: int, token: bytes) -> tuple[int, bytes]:
    """One SaslAuthenticate v1 round trip: (error code, the server's auth bytes)."""
    sock.sendall(request_frame(SASL_AUTHENTICATE, 1, correlation_id, _I32.pack(len(token)) + token))
    answer = read_frame(sock)
    if answer is None:
        return -1, b""
    (error,) = struct.unpack_from(">h", answer, 4)
    (message_len,) = struct.unpack_from(">h", answer, 6)
    at = 8 + max(message_len, 0)
    (size,) = _I32.unpack_from(answer, at)
    return error, answer[at + 4 : at + 4 + max(size, 0)]


def _sasl_handshake(sock: socket.socket, mechanism: str) -> None:
    name = mechanism.encode()
    sock.sendall(request_frame(SASL_HANDSHAKE, 1, 1, struct.pack(">h", len(name)) + name))
    read_frame(sock)


def scram_replay(
    address: tuple[str, int], user: str, password: str, mechanism: str = "SCRAM-SHA-256"
) -> Replay:
    """An honest SCRAM exchange, recorded; then its client-first and client-final sent
    again on a new connection (the server's nonce differs there, so the proof must fail)."""
    from scramp import ScramClient

    client = ScramClient([mechanism], user, password)
    with connect(address) as sock:
        sock.settimeout(10)
        _sasl_handshake(sock, mechanism)
        first = client.get_client_first().encode()
        _, server_first = _sasl_step(sock, 2, first)
        client.set_server_first(server_first.decode())
        final = client.get_client_final().encode()
        recorded_error, _ = _sasl_step(sock, 3, final)
    with connect(address) as sock:
        sock.settimeout(10)
        _sasl_handshake(sock, mechanism)
        _sasl_step(sock, 2, first)
        replayed_error, _ = _sasl_step(sock, 3, final)
        closed = read_frame(sock) is None
    return Replay(recorded_error, replayed_error, closed)


def sasl_scram_guesses(
    address: tuple[str, int],
    user: str,
    attempts: int,
    *,
    password: str = "guess",
    mechanism: str = "SCRAM-SHA-512",
) -> Guesses:
    """`attempts` SCRAM logins with a wrong password, one after the other, each on a
    connection of its own (client-first, then a client-final whose proof is wrong)."""
    from scramp import ScramClient

    start = time.monotonic()
    refused = 0
    slowest = 0.0
    for _ in range(attempts):
        client = ScramClient([mechanism], user, password)
        with connect(address) as sock:
            sock.settimeout(30)
            _sasl_handshake(sock, mechanism)
            error, server_first = _sasl_step(sock, 2, client.get_client_first().encode())
            if error:
                refused += 1
                continue
            client.set_server_first(server_first.decode())
            asked = time.monotonic()
            error, _ = _sasl_step(sock, 3, client.get_client_final().encode())
            slowest = max(slowest, time.monotonic() - asked)
            refused += error != 0
    return Guesses(attempts, refused, time.monotonic() - start, slowest)


# -- the client that must keep being served ----------------------------------------------------


class FetchLatency:
    """Fetch v4 round trips (topic `topic`, partition 0, offset 0) on a connection of its
    own, back to back with `pause_s` between, until stopped; `latencies_s` holds each."""

    def __init__(self, address: tuple[str, int], topic: str, *, pause_s: float = 0.01) -> None:
        self.address = address
        self.frame = request_frame(FETCH, 4, 1, fetch_v4_body({topic: [0]}))
        self.pause_s = pause_s
        self.latencies_s: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FetchLatency:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with connect(self.address) as sock:
            sock.settimeout(60)
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    sock.sendall(self.frame)
                    answer = read_frame(sock)
                except OSError as exc:
                    self.failures.append(repr(exc))
                    return
                if answer is None:
                    self.failures.append("closed by the server")
                    return
                self.latencies_s.append(time.monotonic() - start)
                time.sleep(self.pause_s)

    def wait_answered(self, more: int = 1, *, timeout_s: float = DEADLINE_S) -> FetchLatency:
        """Until `more` further round trips have been answered from now: the server still
        serves this client. Raises at once when the server failed it."""
        target = len(self.latencies_s) + more

        def answered() -> bool:
            if self.failures:
                raise RuntimeError(f"the plain Fetch client failed: {self.failures}")
            return len(self.latencies_s) >= target

        wait_until(answered, timeout_s=timeout_s, what=f"{more} more plain Fetches answered")
        return self

    @property
    def max_ms(self) -> float:
        return 1000 * max(self.latencies_s, default=0.0)

    def quantile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return 0.0
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the table: every probe against `replicad serve`, a plain Fetch timed beside it -----------


@dataclass(frozen=True, slots=True)
class TableRow:
    probe: str
    connections: int
    bytes_sent: int
    rss_before_mb: float
    rss_after_mb: float
    fetch_p50_ms: float
    fetch_max_ms: float
    fetches: int
    lines_logged: int
    outcome: str


def _probes(address: tuple[str, int]) -> list[tuple[str, Callable[[], ProbeResult]]]:
    def flood() -> ProbeResult:
        start = time.monotonic()
        with connection_flood(address, 2000) as socks:
            time.sleep(1.0)
            left_open = sum(still_open(s) for s in socks)
        return ProbeResult(
            "connection_flood", len(socks), 0, f"{left_open} left open", time.monotonic() - start
        )

    def stalled() -> ProbeResult:
        start = time.monotonic()
        with stalled_frames(address, 40, 1 << 20, (1 << 20) - 1):
            time.sleep(2.0)
        return ProbeResult(
            "stalled_frames", 40, 40 * ((1 << 20) - 1), "held", time.monotonic() - start
        )

    def pipelining() -> ProbeResult:
        start = time.monotonic()
        with Pipelining(address, 4) as flood:
            time.sleep(3.0)
        return ProbeResult(
            "pipelining", 4, 20 * flood.requests, "answered", time.monotonic() - start
        )

    return [
        ("huge_fetch 500k partitions (8 MiB)", lambda: huge_fetch(address, 500_000)),
        ("huge_fetch 65k partitions (1 MiB)", lambda: huge_fetch(address, 65_000)),
        ("stalled_frames 40 x 1 MiB", stalled),
        ("connection_flood 2,000", flood),
        ("pipelining 4 connections, 3 s", pipelining),
        ("unknown_versions v5..v32767", lambda: unknown_versions(address, 32767)),
        ("legacy_invalid_utf8 x 1,000", lambda: legacy_invalid_utf8(address, 1000)),
    ]


def run_table(work: Path, topic: str = "t") -> list[TableRow]:
    """Every probe in turn against a `replicad serve` of a small replica (defaults), a
    FetchLatency timing a plain Fetch beside each."""
    from replicad.log.config import LogConfig
    from replicad.log.manager import LogManager
    from replicad.records.batch import scan_batches
    from replicad.types import TopicPartition
    from tools.logdata.batches import producer_batch
    from tools.peers.process import free_port
    from tools.replica import replicad_serve

    data_dir = work / "data"
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())
    try:
        plog = logs.get_or_create(TopicPartition(topic, 0))
        data = b"".join(producer_batch(i * 10, [b"v%d" % i] * 10) for i in range(200))
        plog.append(data, scan_batches(data).batches, now_ms=wall_ms())
        logs.checkpoint({TopicPartition(topic, 0): plog.log_end_offset})
    finally:
        logs.close()
    port = free_port()
    log_path = work / "serve.log"
    rows = []
    with replicad_serve(data_dir, port, log_path=log_path) as served:
        assert served.proc is not None
        pid = served.proc.pid
        address = ("127.0.0.1", port)
        for name, probe in _probes(address):
            lines_before = len(log_path.read_text().splitlines())
            rss_before = rss_mib(pid)
            with FetchLatency(address, topic) as normal:
                time.sleep(0.2)
                result = probe()
                time.sleep(0.2)
            time.sleep(0.5)
            rows.append(
                TableRow(
                    name,
                    result.connections,
                    result.bytes_sent,
                    rss_before,
                    rss_mib(pid),
                    normal.quantile_ms(0.5),
                    normal.max_ms,
                    len(normal.latencies_s),
                    len(log_path.read_text().splitlines()) - lines_before,
                    result.outcome,
                )
            )
    return rows


def render_table(rows: list[TableRow]) -> str:
    head = (
        "| probe | connections | bytes sent | RSS before MB | RSS after MB "
        "| plain Fetch p50 / max ms (n) | lines logged | outcome |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r.probe} | {r.connections:,} | {r.bytes_sent:,} | {r.rss_before_mb:.0f} "
            f"| {r.rss_after_mb:.0f} | {r.fetch_p50_ms:.1f} / {r.fetch_max_ms:.0f} ({r.fetches}) "
            f"| {r.lines_logged} | {r.outcome} |"
        )
    return "\n".join(lines)


# -- from a process of its own ---------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.chaos.hostile pipelining HOST:PORT --connections 4 --seconds 10`:
    a probe from a process of its own, so its threads do not share the GIL with whoever
    measures the server (prints what it sent, as JSON, when it ends).
    `python -m tools.chaos.hostile table`: every probe against a `replicad serve` of its
    own, as the Markdown table of docs/reliability.md."""
    parser = argparse.ArgumentParser(prog="tools.chaos.hostile")
    parser.add_argument("probe", choices=["pipelining", "table"])
    parser.add_argument("address", nargs="?", help="HOST:PORT (pipelining)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.probe == "table":
        with tempfile.TemporaryDirectory() as work:
            print(render_table(run_table(Path(work))), flush=True)
        return 0
    host, _, port = args.address.rpartition(":")
    with Pipelining((host, int(port)), args.connections, batch=args.batch) as flood:
        time.sleep(args.seconds)
    print(json.dumps({"probe": args.probe, "requests_sent": flood.requests}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
