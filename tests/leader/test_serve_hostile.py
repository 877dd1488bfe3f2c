"""`replicad serve` under hostile clients (tools/chaos/hostile.py's probes), with ordinary
clients beside them: a raw Fetch loop whose every round trip is timed, and kafka-python
consumers that must get every record while the probe runs."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
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
from replicad.leader.settings import ServeSettings, serve_security_from_options
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.types import TopicPartition
from tools.chaos.hostile import (
    FetchLatency,
    Pipelining,
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
from tools.peers.process import free_port
from tools.replica import replicad_argv

TOPIC = "t"
T0 = TopicPartition(TOPIC, 0)
BATCHES = 200
PER_BATCH = 10
RECORDS = BATCHES * PER_BATCH
MIB = 1024 * 1024


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
    seconds: float = 0.0
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> KafkaPythonReader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def wait_reading(self, timeout_s: float = 30) -> KafkaPythonReader:
        deadline = time.monotonic() + timeout_s
        while not self.values:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "the reader read nothing"
            time.sleep(0.02)
        return self

    def join(self, timeout_s: float = 60) -> KafkaPythonReader:
        assert self._thread is not None
        self._thread.join(timeout_s)
        return self

    def _run(self) -> None:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTP

        start = time.monotonic()
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
                deadline = time.monotonic() + 50
                while len(self.values) < RECORDS and time.monotonic() < deadline:
                    for messages in consumer.poll(timeout_ms=200).values():
                        self.values += [m.value for m in messages]
                    time.sleep(self.pause_s)
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.seconds = time.monotonic() - start

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
        time.sleep(0.2)
        reader = KafkaPythonReader(served.bootstrap).start()
        # 8 MiB naming 500,000 partitions: legal by Kafka's 100 MiB request limit, about
        # 8 s of the loop to answer before; refused at its size prefix now.
        big = huge_fetch(address(served), 500_000, timeout_s=30)
        # 1 MiB naming 65,000: small enough to read, refused once decoded (~1 s before).
        medium = huge_fetch(address(served), 65_000, timeout_s=30)
        reader.join()
        time.sleep(0.2)
    assert big.outcome == "closed" and big.seconds < 5, big
    assert medium.outcome == "closed" and medium.seconds < 5, medium
    reader.assert_read_everything()
    assert not normal.failures, normal.failures
    assert len(normal.latencies_s) > 10
    # Each of the two costs the loop at most the decoding of 1 MiB (~15-60 ms, measured);
    # the bound leaves room for a loaded machine (the old server: 16 s).
    assert normal.max_ms < 1000, f"a plain Fetch waited {normal.max_ms:.0f} ms"
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
        time.sleep(0.2)
        # Two connections each sending 200,000 requests in one go (4 MB) and reading the
        # answers as fast as they come.
        with Pipelining(address(served), connections=2):
            deadline = time.monotonic() + 10
            while served.metrics()["requests_total"].get("LIST_OFFSETS v1", 0) < 1000:
                assert time.monotonic() < deadline, "the pipelining clients did not get going"
                time.sleep(0.05)
            shared = KafkaPythonReader(served.bootstrap).start().join()
            time.sleep(1.0)
    shared.assert_read_everything()
    assert not normal.failures, normal.failures
    # Each connection answers for at most TURN_S (5 ms) before the others' turn, so a
    # plain Fetch waits a few turns at most. Measured (everything in this process, two
    # shared cores): p90 50 ms, max 80-190 ms; before, each chunk of buffered requests
    # held the loop: p90 3,170 ms, max 3,940 ms.
    # The bounds leave room for a machine shared with other test runs (seen: p90 157 ms,
    # max 552 ms under load); the old server is far outside them.
    assert normal.quantile_ms(0.9) < 500, f"p90 {normal.quantile_ms(0.9):.0f} ms"
    assert normal.max_ms < 1500, f"a plain Fetch waited {normal.max_ms:.0f} ms"
    # kafka-python's ~20 round trips (and its start): 0.25-0.5 s alone, 1.6-2.3 s beside
    # the flood here (its thread shares this process's GIL with the server's).
    assert shared.seconds < 8, (shared.seconds, alone.seconds)


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
            time.sleep(1.0)
            during = rss_bytes()
            metrics = served.metrics()
            reader.join()
            deadline = time.monotonic() + 10
            while any(still_open(s) for s in socks) and time.monotonic() < deadline:
                time.sleep(0.2)
            closed = sum(not still_open(s) for s in socks)
    reader.assert_read_everything()
    assert not normal.failures and normal.max_ms < 500, normal.max_ms
    assert metrics["request_pool_used_bytes"] <= pool_bytes
    assert metrics["request_pool_waits_total"] >= 40 - pool_bytes // declared
    # Before: every frame held (40 MiB and growing with the count); now the pool and the
    # buffers of the connections waiting for it (~128 KiB each), plus allocator slack.
    assert during - before < pool_bytes + 24 * MIB, (during - before) / MIB
    assert closed == 40, "stalled frames must be closed at request_frame_timeout_ms"
    assert served.metrics()["frame_timeouts_total"] == 40


def test_an_idle_connection_is_closed(replica, serve_in_thread) -> None:
    served = serve_in_thread(replica, ServeSettings(connections_max_idle_ms=300))
    with connection_flood(address(served), 3) as socks:
        time.sleep(1.5)
        assert not any(still_open(s) for s in socks)
    assert served.metrics()["idle_closed_total"] == 3


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


def wait_for_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.1)


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
        wait_for_port(port)
        bootstrap = f"127.0.0.1:{port}"
        with FetchLatency(("127.0.0.1", port), TOPIC) as normal:
            # An established consumer, still reading when the flood comes.
            reader = KafkaPythonReader(bootstrap, max_poll_records=10, pause_s=0.01)
            reader.start().wait_reading()
            with connection_flood(("127.0.0.1", port), 600) as socks:
                # Connections still in the listen backlog look open from this side until
                # serve accepts and refuses them: on a loaded machine that takes longer
                # than a second (a fresh-clone CI run counted 214 open after 1 s).
                deadline = time.monotonic() + 20
                time.sleep(1.0)
                open_now = sum(still_open(s) for s in socks)
                while open_now > limit // 2 and time.monotonic() < deadline:
                    time.sleep(0.25)
                    open_now = sum(still_open(s) for s in socks)
                reader.join()
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(10)
    lines = log_path.read_text().splitlines()
    reader.assert_read_everything()
    assert not normal.failures and len(normal.latencies_s) > 10
    # Room for the log's files and 256 more, at least half the limit: 200 here.
    assert open_now <= limit // 2, open_now
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
        time.sleep(0.2)
        with connection_flood(address(served), 60) as socks:
            time.sleep(0.5)
            open_now = sum(still_open(s) for s in socks)
        time.sleep(0.2)
    assert open_now == 19  # the 20th is the FetchLatency connection
    assert served.metrics()["refused_connections_per_ip_total"] == 41
    assert not normal.failures and len(normal.latencies_s) > 10


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
    # Each answer waits out the delay: no more than 5 guesses a second per connection.
    assert guesses.seconds >= 10 * 0.2 and guesses.per_second <= 5, guesses
    assert served.metrics()["authentication_failures_total"] == 10
    assert len([line for line in lines if line["event"].startswith("SASL")]) == 1


def test_a_connection_that_never_authenticates_is_closed_in_time(
    replica, serve_in_thread, plain_users
) -> None:
    settings = ServeSettings(authentication_timeout_ms=500)
    served = serve_in_thread(replica, settings, security=sasl_listener(plain_users))
    with connection_flood(address(served), 20) as socks:
        time.sleep(1.5)
        assert not any(still_open(s) for s in socks)
    assert served.metrics()["authentication_timeouts_total"] == 20


def connection_tasks(loop: asyncio.AbstractEventLoop) -> int:
    return sum("_accept" in repr(task.get_coro()) for task in asyncio.all_tasks(loop))


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
    after: list[int] = []
    for _ in range(3):  # rounds: what one leaves behind would add up
        with connection_flood(address(served), 500) as socks:
            deadline = time.monotonic() + 10
            while any(still_open(s) for s in socks) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not any(still_open(s) for s in socks)
        deadline = time.monotonic() + 5
        while served.metrics()["connections"] and time.monotonic() < deadline:
            time.sleep(0.1)
        # Before: asyncio's timeout closed the socket, but the connection's task waited
        # in start_tls() for good.
        assert served.metrics()["connections"] == 0
        assert served.call(connection_tasks, served.loop) == 0
        after.append(rss_bytes())
    assert served.metrics()["tls_handshake_failures_total"] == 1500
    # The first rounds' peak (~120 KB per TLS connection) stays with the allocator; a
    # later round reuses it (measured: +60 MiB, then +12 or +37 depending on what ran
    # before in this process, then +1). Before, every round added its own.
    assert after[-1] - after[-2] < 16 * MIB, [round(a / MIB) for a in after]


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
        greedy.settimeout(10)
        sender = threading.Thread(
            target=greedy.sendall, args=(list_offsets_v2 * 50_000,), daemon=True
        )
        sender.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            answer = read_frame(greedy)
            if answer is None:
                break
            (throttle,) = struct.unpack_from(">i", answer, 4)  # after the correlation id
            throttles.append(throttle)
            # A throttle of a few ms cannot be told from scheduling noise: wait for one
            # long enough to see the mute (they grow while the client keeps asking).
            if throttle >= 200:
                muted_from = time.monotonic()
                greedy.settimeout(throttle / 1000 / 2)
                with pytest.raises(TimeoutError):
                    read_frame(greedy)  # nothing more while the throttle lasts
                assert time.monotonic() - muted_from >= throttle / 1000 / 2
                break
    assert throttles and throttles[-1] >= 200, f"not throttled in {len(throttles)} answers"
    assert served.metrics()["throttled_responses_total"] >= 1
    # 1% of the loop over at least 10 s is 100 ms, a few thousand of these requests.
    assert len(throttles) < 50_000
    # The plain Fetch, from its own address, is not held back by the greedy one's quota.
    assert not normal.failures and normal.quantile_ms(0.9) < 500
