"""`replicad serve` under hostile clients (tools/chaos/hostile.py's probes), with ordinary
clients beside them: a raw Fetch loop that must keep being answered, and kafka-python
consumers that must get every record while the probe runs.

The tests hold the server to behaviour (refused, closed, counted, served, memory bounded),
never to how long anything took: how long a plain Fetch waits beside each probe is a figure
of `python -m tools.chaos.hostile table` (docs/reliability.md), not an assertion a busy
machine could fail."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import gc
import os
import resource
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from replicad.clock import wall_ms
from replicad.leader.security import ServerSecurity
from replicad.leader.server import TLS_HANDSHAKES_AT_ONCE
from replicad.leader.settings import ServeSettings, serve_security_from_options
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.types import TopicPartition
from tools.chaos.hostile import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    FetchLatency,
    Pipelining,
    connect,
    connection_flood,
    huge_fetch,
    legacy_invalid_utf8,
    read_frame,
    request_frame,
    sasl_plain_guesses,
    sasl_scram_guesses,
    scram_replay,
    stalled_frames,
    still_open,
    unknown_versions,
)
from tools.logdata.batches import producer_batch
from tools.peers.pki import make_test_pki
from tools.peers.process import free_port, port_accepts
from tools.replica import replicad_argv
from tools.wait import DEADLINE_S, wait_until

TOPIC = "t"
T0 = TopicPartition(TOPIC, 0)
BATCHES = 200
PER_BATCH = 10
RECORDS = BATCHES * PER_BATCH
MIB = 1024 * 1024
# A reader that has not read everything by then is starved, not slow: only a hang reaches it.
READ_DEADLINE_S = 120


def batches() -> list[bytes]:
    return [
        producer_batch(i * PER_BATCH, [b"v%d" % (i * PER_BATCH + j) for j in range(PER_BATCH)])
        for i in range(BATCHES)
    ]


@pytest.fixture
def replica(logs: LogManager, fill: Callable[..., Any]) -> LogManager:
    fill(logs, T0, batches())
    return logs


@dataclass
class KafkaPythonReader:
    """A kafka-python consumer reading every record of T0 on a thread, in small fetches."""

    bootstrap: str
    # Records per poll and a pause after each: a reader that is still reading while a
    # probe starts (after `wait_reading`).
    max_poll_records: int = 500
    pause_s: float = 0.0
    values: list[bytes] = field(default_factory=list)
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> KafkaPythonReader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def wait_reading(self) -> KafkaPythonReader:
        wait_until(lambda: self.values or self.error, what="the reader to read something")
        assert self.error is None, self.error
        return self

    def join(self) -> KafkaPythonReader:
        assert self._thread is not None
        self._thread.join(READ_DEADLINE_S + 60)
        return self

    def _run(self) -> None:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTP

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=50,
                max_partition_fetch_bytes=2048,  # many round trips
                max_poll_records=self.max_poll_records,
            )
            try:
                consumer.assign([KTP(TOPIC, 0)])
                deadline = time.monotonic() + READ_DEADLINE_S
                while len(self.values) < RECORDS and time.monotonic() < deadline:
                    for messages in consumer.poll(timeout_ms=200).values():
                        self.values += [m.value for m in messages]
                    if self.pause_s:
                        time.sleep(self.pause_s)  # timing-ok: a slow reader, still reading later
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def assert_read_everything(self) -> None:
        assert self.error is None, self.error
        assert self.values == [b"v%d" % i for i in range(RECORDS)]


def address(served: Any) -> tuple[str, int]:
    return ("127.0.0.1", served.server.port)


def test_a_huge_fetch_is_refused_before_it_is_read_and_others_stay_served(
    replica, serve_in_thread
) -> None:
    served = serve_in_thread(replica)
    with FetchLatency(address(served), TOPIC) as normal:
        normal.wait_answered()
        reader = KafkaPythonReader(served.bootstrap).start()
        # 8 MiB naming 500,000 partitions: legal by Kafka's 100 MiB request limit, about
        # 8 s of the loop to answer before; refused at its size prefix now.
        big = huge_fetch(address(served), 500_000, timeout_s=60)
        # 1 MiB naming 65,000: small enough to read, refused once decoded (~1 s before).
        medium = huge_fetch(address(served), 65_000, timeout_s=60)
        reader.join()
        normal.wait_answered(3)
    # Refused, not answered: the server hung up on both (a timeout would say "open").
    assert big.outcome == "closed", big
    assert medium.outcome == "closed", medium
    reader.assert_read_everything()
    assert not normal.failures, normal.failures
    # How long a plain Fetch waits meanwhile (~15-60 ms measured, 16 s before) is a
    # figure of `python -m tools.chaos.hostile table`.
    assert served.metrics()["implausible_requests_total"] == 2


def test_a_fetch_naming_what_the_replica_holds_is_still_answered(replica, serve_in_thread) -> None:
    served = serve_in_thread(replica)
    # 1,024 + 2 per partition held: 1,000 unknown partitions are plausible, and answered.
    answered = huge_fetch(address(served), 1_000, timeout_s=30)
    assert answered.outcome == "answered", answered
    assert served.metrics().get("implausible_requests_total", 0) == 0


def test_pipelining_clients_leave_a_normal_consumer_its_turns(replica, serve_in_thread) -> None:
    served = serve_in_thread(replica)
    alone = KafkaPythonReader(served.bootstrap).start().join()
    alone.assert_read_everything()
    with FetchLatency(address(served), TOPIC) as normal:
        normal.wait_answered()

        def pipelined() -> int:
            return served.metrics()["requests_total"].get("LIST_OFFSETS v1", 0)

        # Two connections each sending 200,000 requests in one go (4 MB) and reading the
        # answers as fast as they come.
        with Pipelining(address(served), connections=2):
            wait_until(lambda: pipelined() >= 1000, what="the pipelining clients to get going")
            shared = KafkaPythonReader(served.bootstrap).start().join()
            normal.wait_answered(3)
            # Still flooding: the reader and the plain Fetch were served beside it, not
            # after it.
            after_reader = pipelined()
            wait_until(lambda: pipelined() > after_reader, what="the flood to go on")
    shared.assert_read_everything()
    assert not normal.failures, normal.failures
    # Each connection answers for at most TURN_MS (5 ms) before the others' turn, so a
    # plain Fetch waits a few turns at most (measured: p90 50 ms, max 80-190 ms; before,
    # p90 3,170 ms): figures of `python -m tools.chaos.hostile table`, not asserted here.


def test_unknown_versions_are_counted_under_one_label(replica, serve_in_thread) -> None:
    served = serve_in_thread(replica)
    probe = unknown_versions(address(served), 3000, api_keys=range(100, 140))
    assert probe.outcome == "answered", probe
    requests = served.metrics()["requests_total"]
    assert requests["unsupported"] == 3000 - 4 + 40
    # API_VERSIONS v0-v4 are the only other labels: nothing per value a client chose.
    assert set(requests) == {"unsupported"}


def test_a_legacy_request_with_invalid_utf8_is_one_counted_warning(
    replica, serve_in_thread
) -> None:
    served = serve_in_thread(replica)
    with structlog.testing.capture_logs() as lines:
        probe = legacy_invalid_utf8(address(served), requests=20)
    assert probe.outcome == "closed", probe
    assert served.metrics()["protocol_errors_total"] == 20
    said = [line for line in lines if line.get("log_level") in ("warning", "error")]
    assert [line["event"] for line in said] == ["client broke the protocol; connection closed"]
    assert not any("exc_info" in line for line in lines)


# -- memory, time and connections a client can take ---------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_stalled_near_limit_frames_stay_within_the_pool_and_are_closed_in_time(
    replica, serve_in_thread
) -> None:
    pool_bytes = 8 * MIB
    settings = ServeSettings(queued_max_request_bytes=pool_bytes, request_frame_timeout_ms=3000)
    served = serve_in_thread(replica, settings)
    # 1 MiB is the largest frame a replica this small makes plausible.
    declared = MIB
    before = rss_bytes()
    with FetchLatency(address(served), TOPIC) as normal:
        reader = KafkaPythonReader(served.bootstrap).start()
        with stalled_frames(address(served), 40, declared, declared - 1) as socks:
            # All 40 frames taken in: those past the pool's 8 MiB wait for it.
            metrics = wait_until(
                lambda: (
                    (m := served.metrics())["request_pool_waits_total"]
                    >= 40 - pool_bytes // declared
                    and m
                ),
                what="the stalled frames to fill the request pool",
            )
            during = rss_bytes()
            reader.join()
            normal.wait_answered(3)
            wait_until(
                lambda: not any(still_open(s) for s in socks),
                what="the stalled frames to be closed at request_frame_timeout_ms",
            )
    reader.assert_read_everything()
    assert not normal.failures, normal.failures
    assert metrics["request_pool_used_bytes"] <= pool_bytes
    # Before: every frame held (40 MiB and growing with the count); now the pool and the
    # buffers of the connections waiting for it (~128 KiB each), plus allocator slack.
    assert during - before < pool_bytes + 24 * MIB, (during - before) / MIB
    assert served.metrics()["frame_timeouts_total"] == 40


def test_an_idle_connection_is_closed(replica, serve_in_thread) -> None:
    served = serve_in_thread(replica, ServeSettings(connections_max_idle_ms=300))
    with connection_flood(address(served), 3) as socks:
        wait_until(lambda: not any(still_open(s) for s in socks), what="idle connections closed")
    wait_until(lambda: served.metrics()["idle_closed_total"] == 3, what="3 idle closes counted")


@pytest.fixture
def closed_replica(tmp_path: Path, fill: Callable[..., Any]) -> Path:
    """The replica's data directory, closed, for a `replicad serve` of its own."""
    data_dir = tmp_path / "served"
    logs = LogManager.open(data_dir, LogConfig(), now_ms=wall_ms())
    try:
        fill(
            logs,
            T0,
            [
                producer_batch(
                    i * PER_BATCH, [b"v%d" % (i * PER_BATCH + j) for j in range(PER_BATCH)]
                )
                for i in range(BATCHES)
            ],
        )
    finally:
        logs.close()
    return data_dir


def test_a_connection_flood_past_the_open_file_limit_leaves_consumers_served(
    closed_replica, tmp_path
) -> None:
    """`replicad serve` with a hard limit of 400 descriptors: it keeps its connections under
    the limit, so accept() never fails, and a flood of 600 logs a line, not thousands."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    limit = 400

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with open(log_path, "wb") as out:
        listen = ["--listen", f"127.0.0.1:{port}", "--log-format", "json"]
        proc = subprocess.Popen(
            [*replicad_argv("serve", "--data-dir", str(closed_replica)), *listen],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=low_limit,
        )
    try:
        wait_until(lambda: port_accepts(port), what=f"replicad serve to listen on {port}")
        bootstrap = f"127.0.0.1:{port}"
        with FetchLatency(("127.0.0.1", port), TOPIC) as normal:
            # An established consumer, still reading when the flood comes.
            reader = KafkaPythonReader(bootstrap, max_poll_records=10, pause_s=0.01)
            reader.start().wait_reading()
            with connection_flood(("127.0.0.1", port), 600) as socks:
                # Connections still in the listen backlog look open from this side until
                # serve accepts and refuses them (a loaded machine takes seconds): wait
                # for serve to drain its backlog down to what it keeps. Room for the log's
                # files and 256 more, at least half the limit: 200 here.
                wait_until(
                    lambda: sum(still_open(s) for s in socks) <= limit // 2,
                    what=f"serve to keep at most {limit // 2} of the flood open",
                )
                reader.join()
                normal.wait_answered(3)
    finally:
        proc.terminate()
        proc.wait(10)
    lines = log_path.read_text().splitlines()
    reader.assert_read_everything()
    assert not normal.failures, normal.failures
    assert not any("Traceback" in line or "out of system resource" in line for line in lines)
    refused = [line for line in lines if "connection refused" in line]
    assert 1 <= len(refused) <= 2, refused
    assert len(lines) < 20, lines


def test_per_ip_limit_closes_new_connections_and_keeps_the_established(
    replica, serve_in_thread
) -> None:
    # An override for this address, as Kafka's max.connections.per.ip.overrides.
    limits = ServeSettings(
        max_connections_per_ip=1000, max_connections_per_ip_overrides={"127.0.0.1": 20}
    )
    served = serve_in_thread(replica, limits)
    with FetchLatency(address(served), TOPIC) as normal:
        normal.wait_answered()
        with connection_flood(address(served), 60) as socks:
            wait_until(
                lambda: served.metrics().get("refused_connections_per_ip_total") == 41,
                what="41 connections refused",
            )
            # The 20th is the FetchLatency connection; the refused are closed by serve.
            wait_until(
                lambda: sum(still_open(s) for s in socks) == 19,
                what="the 41 refused connections closed",
            )
            normal.wait_answered(3)
    assert served.metrics()["refused_connections_per_ip_total"] == 41
    assert not normal.failures, normal.failures


# -- authentication ---------------------------------------------------------------------------


@pytest.fixture
def plain_users(tmp_path: Path) -> Path:
    secret = tmp_path / "reader.password"
    secret.write_text("right-password\n")
    secret.chmod(0o600)
    users = tmp_path / "users.yaml"
    users.write_text(f"reader:\n  password_file: {secret}\n")
    return users


def sasl_listener(users: Path, mechanism: str = "plain") -> ServerSecurity:
    config = serve_security_from_options(
        {
            "serve.security.sasl.mechanisms": [mechanism],
            "serve.security.sasl.users_file": str(users),
        }
    )
    return ServerSecurity.from_config(config, frozenset())


@pytest.mark.parametrize(
    ("mechanism", "guess"),
    [
        ("plain", sasl_plain_guesses),
        ("scram-sha-512", sasl_scram_guesses),
    ],
)
def test_failed_authentications_are_delayed_and_hashed_off_the_loop(
    replica, serve_in_thread, plain_users, mechanism, guess
) -> None:
    settings = ServeSettings(failed_authentication_delay_ms=200)
    served = serve_in_thread(replica, settings, security=sasl_listener(plain_users, mechanism))
    with structlog.testing.capture_logs() as lines:
        guesses = guess(address(served), "reader", 10)
    assert guesses.refused == 10
    assert served.metrics()["authentication_failures_total"] == 10
    assert len([line for line in lines if line["event"].startswith("SASL")]) == 1


def _plain_handshake(address: tuple[str, int]) -> socket.socket:
    sock = connect(address)
    sock.settimeout(60)
    sock.sendall(request_frame(SASL_HANDSHAKE, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
    assert read_frame(sock) is not None
    return sock


def test_a_failed_authentication_is_answered_after_the_delay_and_others_are_served_meanwhile(
    replica, serve_in_thread, plain_users
) -> None:
    """With a delay far longer than the test, a wrong password is not answered while the
    guesser waits (a busy machine can only make that more certain), and the loop serves
    another client meanwhile: the delay is a wait, not a block. That ten guesses take ten
    delays follows; it is not timed here."""
    settings = ServeSettings(failed_authentication_delay_ms=3_600_000)
    served = serve_in_thread(replica, settings, security=sasl_listener(plain_users))
    token = b"\0reader\0guess"
    with _plain_handshake(address(served)) as guesser:
        guesser.sendall(
            request_frame(SASL_AUTHENTICATE, 1, 2, struct.pack(">i", len(token)) + token)
        )
        guesser.settimeout(1)
        with pytest.raises(TimeoutError):
            read_frame(guesser)
        # Another client's SASL handshake is answered while the guess waits out its delay.
        _plain_handshake(address(served)).close()
    assert served.metrics().get("authentication_failures_total", 0) == 0  # still delayed


def test_a_connection_that_never_authenticates_is_closed_in_time(
    replica, serve_in_thread, plain_users
) -> None:
    settings = ServeSettings(authentication_timeout_ms=500)
    served = serve_in_thread(replica, settings, security=sasl_listener(plain_users))
    with connection_flood(address(served), 20) as socks:
        wait_until(
            lambda: not any(still_open(s) for s in socks),
            what="unauthenticated connections closed at authentication_timeout_ms",
        )
    wait_until(
        lambda: served.metrics()["authentication_timeouts_total"] == 20,
        what="20 authentication timeouts counted",
    )


def connection_tasks(loop: asyncio.AbstractEventLoop) -> int:
    return sum("_accept" in repr(task.get_coro()) for task in asyncio.all_tasks(loop))


def tls_protocols_alive() -> int:
    """asyncio's TLS connection objects still alive (after a full collection)."""
    gc.collect()
    return sum(isinstance(o, asyncio.sslproto.SSLProtocol) for o in gc.get_objects())


def test_silent_tls_clients_are_closed_at_the_handshake_deadline_and_leave_nothing(
    replica, serve_in_thread, tmp_path
) -> None:
    pki = make_test_pki(tmp_path / "pki")
    config = serve_security_from_options(
        {
            "serve.security.tls.cert_file": str(pki.broker_cert),
            "serve.security.tls.key_file": str(pki.broker_key),
        }
    )
    settings = ServeSettings(authentication_timeout_ms=500)
    served = serve_in_thread(
        replica, settings, security=ServerSecurity.from_config(config, frozenset())
    )
    for _ in range(3):  # rounds: what one leaves behind would add up
        with connection_flood(address(served), 500) as socks:
            wait_until(
                lambda: not any(still_open(s) for s in socks),
                what="silent TLS clients closed at the handshake deadline",
            )
        # Before: asyncio's timeout closed the socket, but the connection's task waited
        # in start_tls() for good.
        wait_until(lambda: served.metrics()["connections"] == 0, what="no connection left")
        wait_until(
            lambda: served.call(connection_tasks, served.loop) == 0,
            what="no connection task left",
        )
        # Nor a TLS connection's state (~120 KB each): what the allocator keeps of the
        # round's peak is its own business (RSS after the rounds measured +60, +3..37 and
        # +1..42 MiB, depending on what ran before in this process), so the test counts
        # the objects themselves.
        assert served.call(tls_protocols_alive) == 0
    assert served.metrics()["tls_handshake_failures_total"] == 1500


def test_tls_state_is_held_only_by_clients_that_spoke_and_by_a_bounded_number(
    replica, serve_in_thread, tmp_path
) -> None:
    """Silent clients hold no TLS state; clients that send the start of a ClientHello and
    stall hold it, at most TLS_HANDSHAKES_AT_ONCE at a time; a real client still gets
    through once the stalled ones reach their deadline."""
    pki = make_test_pki(tmp_path / "pki")
    config = serve_security_from_options(
        {
            "serve.security.tls.cert_file": str(pki.broker_cert),
            "serve.security.tls.key_file": str(pki.broker_key),
        }
    )
    served = serve_in_thread(
        replica,
        ServeSettings(authentication_timeout_ms=2000),
        security=ServerSecurity.from_config(config, frozenset()),
    )

    def wait_for(what: str, check: Callable[[], bool]) -> None:
        wait_until(check, what=what)

    metrics = served.metrics
    with connection_flood(address(served), 100):
        wait_for("100 silent connections", lambda: metrics()["connections"] == 100)
        assert metrics()["tls_handshakes_in_progress"] == 0
    wait_for("silent ones closed", lambda: metrics()["connections"] == 0)
    failed_before = metrics()["tls_handshake_failures_total"]  # the silent ones may count
    with connection_flood(address(served), TLS_HANDSHAKES_AT_ONCE + 36) as socks:
        for sock in socks:
            sock.sendall(bytes.fromhex("160301020001"))  # a ClientHello begun, never ended
        wait_for(
            "the bound reached",
            lambda: metrics()["tls_handshakes_in_progress"] == TLS_HANDSHAKES_AT_ONCE,
        )
        # Every one of them accepted, and still no more handshakes than the bound.
        wait_for(
            "every stalled client accepted",
            lambda: metrics()["connections"] == TLS_HANDSHAKES_AT_ONCE + 36,
        )
        assert metrics()["tls_handshakes_in_progress"] == TLS_HANDSHAKES_AT_ONCE
        # The real client connects once the stalled ones have begun to reach their
        # deadline (all were accepted at about the same time): its own deadline, from its
        # accept, then outlasts theirs by however long the machine took to get here, not
        # by the few hundred ms of the waits above (a busy machine ate that margin).
        wait_for(
            "the stalled handshakes timing out",
            lambda: metrics()["tls_handshake_failures_total"] > failed_before,
        )
        context = ssl.create_default_context(cafile=str(pki.ca))
        with (
            socket.create_connection(address(served), timeout=DEADLINE_S) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.version() is not None
    wait_for("all closed", lambda: metrics()["connections"] == 0)
    assert metrics()["tls_handshakes_in_progress"] == 0


def test_a_replayed_scram_exchange_is_refused(replica, serve_in_thread, plain_users) -> None:
    config = serve_security_from_options(
        {
            "serve.security.sasl.mechanisms": ["scram-sha-256"],
            "serve.security.sasl.users_file": str(plain_users),
        }
    )
    served = serve_in_thread(
        replica, ServeSettings(), security=ServerSecurity.from_config(config, frozenset())
    )
    replay = scram_replay(address(served), "reader", "right-password")
    assert replay.recorded_error == 0  # the honest exchange authenticated
    assert replay.replayed_error != 0 and replay.closed_after_replay, replay
    assert served.metrics()["authentication_failures_total"] == 1


# -- quotas -----------------------------------------------------------------------------------


def test_a_client_over_its_request_quota_is_told_to_wait_and_muted(
    replica, serve_in_thread
) -> None:
    served = serve_in_thread(replica, ServeSettings(request_quota_percentage=1))
    list_offsets_v2 = request_frame(2, 2, 1, struct.pack(">ibi", -1, 0, 0))  # no topics
    throttles: list[int] = []
    # The greedy client from another address of the loopback: quotas are per address.
    with (
        FetchLatency(address(served), TOPIC) as normal,
        socket.create_connection(address(served), 5, ("127.0.0.2", 0)) as greedy,
    ):
        greedy.settimeout(60)
        sender = threading.Thread(
            target=greedy.sendall, args=(list_offsets_v2 * 50_000,), daemon=True
        )
        sender.start()
        normal.wait_answered()
        # Reads until a long throttle; the deadline only stops a server that never throttles.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answer = read_frame(greedy)
            if answer is None:
                break
            (throttle,) = struct.unpack_from(">i", answer, 4)  # after the correlation id
            throttles.append(throttle)
            # A throttle of a few ms cannot be told from scheduling noise: wait for one
            # long enough to see the mute (they grow while the client keeps asking).
            if throttle >= 200:
                greedy.settimeout(throttle / 1000 / 2)
                with pytest.raises(TimeoutError):
                    read_frame(greedy)  # nothing more while the throttle lasts
                break
        # The plain Fetch, from its own address, is not held back by the greedy one's quota.
        normal.wait_answered(3)
    assert throttles and throttles[-1] >= 200, f"not throttled in {len(throttles)} answers"
    assert served.metrics()["throttled_responses_total"] >= 1
    # 1% of the loop over at least 10 s is 100 ms, a few thousand of these requests.
    assert len(throttles) < 50_000
    assert not normal.failures, normal.failures
