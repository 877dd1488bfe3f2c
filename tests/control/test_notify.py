"""sd_notify against a real AF_UNIX datagram socket playing systemd's side."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
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
from tools.wait import DEADLINE_S

RECV_TIMEOUT_S = DEADLINE_S  # a message is waited for; only a hang reaches this


class ManagerSide:
    """What systemd does with $NOTIFY_SOCKET: a bound datagram socket it reads from."""

    def __init__(self, env_value: str) -> None:
        self.env_value = env_value
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(socket_address(env_value))
        self.sock.settimeout(RECV_TIMEOUT_S)

    def receive(self) -> dict[str, str]:
        return decode_notify(self.sock.recv(4096))

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


async def test_watchdog_loop_pings_again_and_again_until_stopped(manager: ManagerSide) -> None:
    # WatchdogSec=0.2s -> a ping every 0.1s: three of them come, each waited for.
    env = {"NOTIFY_SOCKET": manager.env_value, "WATCHDOG_USEC": "200000"}
    notifier = SystemdNotifier.from_env(env)
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog_loop(notifier, stop))
    for _ in range(3):
        assert await asyncio.to_thread(manager.receive) == {"WATCHDOG": "1"}
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)
    notifier.close()


async def test_watchdog_loop_waits_its_interval_and_a_stop_ends_the_wait(
    manager: ManagerSide,
) -> None:
    """WatchdogSec of two hours: one ping at once, then none while a client waits a second
    (the loop waits an hour; a busy machine only makes the silence more certain), and a
    stop ends that wait at once rather than after it. The interval itself is half of
    WATCHDOG_USEC (test_watchdog_interval_is_half_of_watchdog_usec)."""
    env = {"NOTIFY_SOCKET": manager.env_value, "WATCHDOG_USEC": str(7200 * 1_000_000)}
    notifier = SystemdNotifier.from_env(env)
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog_loop(notifier, stop))
    assert await asyncio.to_thread(manager.receive) == {"WATCHDOG": "1"}
    manager.sock.settimeout(1)
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(manager.receive)
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)
    notifier.close()
    assert manager.pending() == 0


def test_a_wedged_event_loop_stops_the_watchdog_pings(tmp_path: Path) -> None:
    """Something on the loop blocks it (held until the test lets it go): no ping comes
    while a client waits a second, four intervals; once it lets go, pings come again."""
    manager = ManagerSide(str(tmp_path / "notify.sock"))
    env = {"NOTIFY_SOCKET": manager.env_value, "WATCHDOG_USEC": "500000"}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    notifier = SystemdNotifier.from_env(env)
    wedged, unwedge = threading.Event(), threading.Event()

    async def daemon() -> None:
        try:
            await watchdog_loop(notifier, stop)
        finally:
            notifier.close()

    def wedge() -> None:
        wedged.set()
        unwedge.wait(DEADLINE_S)

    thread = threading.Thread(target=loop.run_until_complete, args=(daemon(),))
    thread.start()
    try:
        assert manager.receive() == {"WATCHDOG": "1"}
        loop.call_soon_threadsafe(wedge)
        assert wedged.wait(DEADLINE_S)
        manager.pending()  # what was sent before the wedge
        manager.sock.settimeout(1)
        with pytest.raises(TimeoutError):
            manager.receive()
        unwedge.set()
        manager.sock.settimeout(DEADLINE_S)
        assert manager.receive() == {"WATCHDOG": "1"}
    finally:
        unwedge.set()
        loop.call_soon_threadsafe(stop.set)
        thread.join(DEADLINE_S)
        loop.close()
        manager.close()


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
