"""sd_notify against a real AF_UNIX datagram socket playing systemd's side."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.control.notify import (
    SystemdNotifier,
    decode_notify,
    encode_notify,
    one_line,
    socket_address,
    watchdog_loop,
)

RECV_TIMEOUT_S = 2.0


class ManagerSide:
    """What systemd does with $NOTIFY_SOCKET: a bound datagram socket it reads from."""

    def __init__(self, env_value: str) -> None:
        self.env_value = env_value
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(socket_address(env_value))
        self.sock.settimeout(RECV_TIMEOUT_S)

    def receive(self) -> dict[str, str]:
        return decode_notify(self.sock.recv(4096))

    def receive_timed(self) -> tuple[float, dict[str, str]]:
        fields = self.receive()
        return time.monotonic(), fields

    def pending(self) -> int:
        """Datagrams waiting, without blocking."""
        count = 0
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(4096)
                count += 1
        except BlockingIOError:
            return count
        finally:
            self.sock.settimeout(RECV_TIMEOUT_S)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ManagerSide]:
    if request.param == "path":
        value = str(tmp_path / "notify.sock")
    else:
        value = f"@replicad-test-notify-{os.getpid()}-{secrets.token_hex(6)}"
    side = ManagerSide(value)
    yield side
    side.close()


async def test_ready_status_watchdog_stopping_arrive_in_order(manager: ManagerSide) -> None:
    notifier = SystemdNotifier.from_env({"NOTIFY_SOCKET": manager.env_value})
    assert notifier.enabled
    await notifier.ready("3 leaders, 24 partitions, lag 0")
    await notifier.status("3 leaders, 24 partitions, lag 12")
    await notifier.watchdog()
    await notifier.stopping()
    notifier.close()
    assert manager.receive() == {"READY": "1", "STATUS": "3 leaders, 24 partitions, lag 0"}
    assert manager.receive() == {"STATUS": "3 leaders, 24 partitions, lag 12"}
    assert manager.receive() == {"WATCHDOG": "1"}
    assert manager.receive() == {"STOPPING": "1"}


async def test_without_notify_socket_everything_is_a_no_op() -> None:
    notifier = SystemdNotifier.from_env({"WATCHDOG_USEC": "30000000"})
    assert not notifier.enabled
    assert notifier.watchdog_interval_s() is None
    await notifier.ready("x")
    await notifier.status("x")
    await notifier.watchdog()
    await notifier.stopping()
    # watchdog_loop returns at once instead of waiting for a stop that never comes.
    await asyncio.wait_for(watchdog_loop(notifier, asyncio.Event()), timeout=1)


async def test_a_vanished_manager_socket_is_logged_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    await notifier.ready("x")
    await notifier.watchdog()
    side = ManagerSide(str(tmp_path / "gone.sock"))
    try:
        # Once the manager is back, the next message reconnects and gets through.
        await notifier.status("back")
        assert side.receive() == {"STATUS": "back"}
    finally:
        notifier.close()
        side.close()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}
    assert SystemdNotifier.from_env(env).watchdog_interval_s() == 15.0
    own = {**env, "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier.from_env(own).watchdog_interval_s() == 15.0
    # The manager watches another process (we are a child of the main one): not ours.
    other = {**env, "WATCHDOG_PID": str(os.getpid() + 1)}
    assert SystemdNotifier.from_env(other).watchdog_interval_s() is None
    assert SystemdNotifier.from_env({**env, "WATCHDOG_USEC": "0"}).watchdog_interval_s() is None
    assert SystemdNotifier.from_env({**env, "WATCHDOG_USEC": "x"}).watchdog_interval_s() is None


async def test_watchdog_loop_pings_at_half_the_interval_until_stopped(
    manager: ManagerSide,
) -> None:
    # WatchdogSec=0.2s -> a ping every 0.1s.
    env = {"NOTIFY_SOCKET": manager.env_value, "WATCHDOG_USEC": "200000"}
    notifier = SystemdNotifier.from_env(env)
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(watchdog_loop(notifier, stop))
    await asyncio.sleep(0.55)
    stop.set()
    await asyncio.wait_for(task, timeout=1)
    elapsed = time.monotonic() - started
    notifier.close()
    pings = manager.pending()
    # One at once, then one per 0.1s; a busy machine can only make pings late, not early.
    expected = 1 + int(elapsed / 0.1)
    assert expected // 2 <= pings <= expected
    assert pings >= 3
    await asyncio.sleep(0.25)
    assert manager.pending() == 0


def test_a_wedged_event_loop_stops_the_watchdog_pings(tmp_path: Path) -> None:
    manager = ManagerSide(str(tmp_path / "notify.sock"))
    env = {"NOTIFY_SOCKET": manager.env_value, "WATCHDOG_USEC": "200000"}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    notifier = SystemdNotifier.from_env(env)

    async def daemon() -> None:
        try:
            await watchdog_loop(notifier, stop)
        finally:
            notifier.close()

    def run_daemon_loop() -> None:
        loop.run_until_complete(daemon())

    thread = threading.Thread(target=run_daemon_loop)
    thread.start()
    try:
        stamps = [manager.receive_timed()[0] for _ in range(4)]
        # Something on the loop blocks it for 0.8s: four pings' worth.
        loop.call_soon_threadsafe(time.sleep, 0.8)
        stamps += [manager.receive_timed()[0] for _ in range(4)]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)
        loop.close()
        manager.close()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert statistics.median(gaps) < 0.2
    assert max(gaps) >= 0.7


def test_encoding_matches_what_systemd_parses() -> None:
    datagram = encode_notify({"READY": "1", "STATUS": "ok"})
    assert datagram == b"READY=1\nSTATUS=ok"
    assert decode_notify(datagram) == {"READY": "1", "STATUS": "ok"}
    with pytest.raises(ValueError):
        encode_notify({"STATUS": "two\nlines"})
    assert one_line("a\n  b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 200


def test_abstract_socket_names_start_with_nul() -> None:
    assert socket_address("@systemd/notify") == "\0systemd/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
