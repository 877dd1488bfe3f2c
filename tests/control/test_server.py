"""ControlServer over a real Unix datagram socket, queried by the real client."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from replicad.control.client import query
from replicad.control.protocol import (
    MAX_DATAGRAM_BYTES,
    JsonRows,
    ReplyAssembler,
    ReplyComplete,
    encode_reply,
    encode_request,
    ok_reply,
)
from replicad.control.server import ControlServer
from replicad.errors import ControlError, DaemonNotRunning, ReplicadError
from tests.status_snapshot import partition_entry, status_snapshot
from tools.wait import until

NOBODY_UID = 65534
# A deadline only a hung server reaches (a loaded machine takes seconds for 10,000 partitions).
QUERY_TIMEOUT_S = 60.0


def snapshot_with(partitions: int) -> dict[str, Any]:
    """A snapshot of `partitions` partitions (10,000 take many datagrams)."""
    return status_snapshot(
        totals={"partitions": partitions, "lag": partitions},
        leaders=[],
        partitions=[
            partition_entry(
                f"topic-{i % 40}",
                i // 40,
                1_000_000 + i,
                1_000_001 + i,
                leader=1 + i % 3,
                bytes_replicated=123_456_789,
            )
            for i in range(partitions)
        ],
    )


class Reloads:
    """A mutating command that records its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(args)
        return {"reloaded": True, "topics_added": args.get("add", [])}


async def failing(args: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("disk on fire")


async def refusing(args: dict[str, Any]) -> dict[str, Any]:
    raise ReplicadError("config invalid: topics.include: not a list")


@pytest.fixture
def reloads() -> Reloads:
    return Reloads()


@pytest.fixture
async def server(shared_dir: Path, reloads: Reloads) -> AsyncIterator[ControlServer]:
    state = {"snapshot": snapshot_with(10_000)}
    control = ControlServer(
        shared_dir / "control.sock",
        lambda: state["snapshot"],
        {"reload": reloads, "explode": failing, "refuse": refusing},
        mode=0o666,
        queries={"echo": lambda args: _echo(args)},
    )
    await control.start()
    yield control
    await control.close()


async def _echo(args: dict[str, Any]) -> dict[str, Any]:
    return {"echo": args}


async def ask(path: Path, cmd: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The blocking client, off the loop so the server keeps running."""
    return await asyncio.to_thread(query, path, cmd, QUERY_TIMEOUT_S, args)


async def test_status_of_10000_partitions_round_trips_over_many_datagrams(
    server: ControlServer,
) -> None:
    expected = snapshot_with(10_000)
    assert len(encode_reply(1, ok_reply(expected))) > 10
    result = await ask(server.path, "status")
    assert result["partitions"] == expected["partitions"]
    assert result["totals"] == expected["totals"]


async def test_a_status_whose_rows_are_made_as_it_is_encoded_round_trips(
    shared_dir: Path,
) -> None:
    """The daemon answers status with its partition rows as JsonRows (made one at a time as
    the reply is encoded): the client gets the same reply as from a list, every time."""
    expected = snapshot_with(10_000)

    def streamed() -> dict[str, Any]:
        return {**expected, "partitions": JsonRows(iter(expected["partitions"]))}

    async with ControlServer(shared_dir / "rows.sock", streamed) as control:
        for _ in range(2):
            assert await ask(control.path, "status") == expected


async def test_socket_mode_and_file_lifecycle(shared_dir: Path) -> None:
    path = shared_dir / "run" / "lifecycle.sock"  # the directory is made too
    control = ControlServer(path, dict)
    await control.start()
    info = os.stat(path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o660
    await control.close()
    assert not path.exists()
    with pytest.raises(DaemonNotRunning, match="no control socket at"):
        query(path)


async def test_a_mutating_command_runs_for_the_daemons_own_user(
    server: ControlServer, reloads: Reloads
) -> None:
    result = await ask(server.path, "reload", {"add": ["orders"]})
    assert result == {"reloaded": True, "topics_added": ["orders"]}
    assert reloads.calls == [{"add": ["orders"]}]


async def test_another_user_may_read_status_but_not_reload(
    server: ControlServer, reloads: Reloads, run_as_nobody: Callable[..., Any]
) -> None:
    path = server.path
    status = await asyncio.to_thread(run_as_nobody, lambda: query(path, "status", 5.0))
    assert len(status["partitions"]) == 10_000
    with pytest.raises(ControlError, match=f"permission denied for uid {NOBODY_UID}"):
        await asyncio.to_thread(run_as_nobody, lambda: query(path, "reload", 5.0))
    assert reloads.calls == []


async def test_the_daemons_uid_is_trusted_even_when_not_root(
    shared_dir: Path, reloads: Reloads, run_as_nobody: Callable[..., Any]
) -> None:
    path = shared_dir / "as-daemon-uid.sock"
    control = ControlServer(path, dict, {"reload": reloads}, mode=0o666, daemon_uid=NOBODY_UID)
    async with control:
        result = await asyncio.to_thread(run_as_nobody, lambda: query(path, "reload", 5.0))
    assert result["reloaded"] is True


async def test_mode_0660_keeps_other_users_out(
    shared_dir: Path, run_as_nobody: Callable[..., Any]
) -> None:
    path = shared_dir / "private.sock"
    async with ControlServer(path, dict):
        with pytest.raises(ControlError, match="cannot write to control socket"):
            await asyncio.to_thread(run_as_nobody, lambda: query(path, "status", 5.0))


async def test_unknown_and_failing_commands_are_answered_with_errors(
    server: ControlServer,
) -> None:
    with pytest.raises(ControlError, match=r"unknown command 'frobnicate'.*echo, explode"):
        await ask(server.path, "frobnicate")
    with pytest.raises(ControlError, match="explode failed: RuntimeError: disk on fire"):
        await ask(server.path, "explode")
    with pytest.raises(ControlError, match=r"config invalid: topics\.include"):
        await ask(server.path, "refuse")
    # The daemon is still answering.
    assert await ask(server.path, "echo", {"x": 1}) == {"echo": {"x": 1}}


async def test_malformed_and_oversized_requests_get_error_replies(
    server: ControlServer,
) -> None:
    def raw_exchange(datagram: bytes, request_id: int) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(f"\0replicad-test-raw-{os.getpid()}-{request_id}")
            sock.settimeout(QUERY_TIMEOUT_S)
            sock.sendto(datagram, str(server.path))
            assembler = ReplyAssembler(request_id)
            while True:
                step = assembler.feed(sock.recv(MAX_DATAGRAM_BYTES))
                if isinstance(step, ReplyComplete):
                    return step.reply

    reply = await asyncio.to_thread(raw_exchange, b'{"id": 5, "cmd": 7}', 5)
    assert reply == {"ok": False, "error": "request has no `cmd` string"}
    huge = b'{"id": 0, "cmd": "status", "pad": "' + b"x" * MAX_DATAGRAM_BYTES + b'"}'
    reply = await asyncio.to_thread(raw_exchange, huge, 0)
    assert reply["ok"] is False
    assert "request larger than" in reply["error"]


async def test_a_client_that_never_reads_does_not_hold_up_others(
    shared_dir: Path,
) -> None:
    path = shared_dir / "slow.sock"
    # Were replies serialized, the second client would wait out the stuck one's reply
    # timeout: an hour, far past its own query's deadline.
    async with ControlServer(path, lambda: snapshot_with(10_000), reply_timeout_s=3600):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stuck:
            stuck.bind(f"\0replicad-test-stuck-{os.getpid()}")
            stuck.sendto(encode_request("status", 1), str(path))
            # The server is replying to it: a datagram waits in its buffer, unread.
            await until(
                lambda: select.select([stuck], [], [], 0)[0],
                what="the reply to the stuck client to start",
            )
            result = await ask(path, "status")
            assert len(result["partitions"]) == 10_000


async def test_no_reply_is_built_for_clients_that_gave_up(shared_dir: Path) -> None:
    """A retry storm: clients that closed their socket before the server read their request
    (the CLI does when its timeout passes, then asks again from a new one) get no status
    built, and the one still waiting gets its answer. On the old code the status was built
    for every request: 6 builds, not 1 (at 10,000 partitions under load each took longer
    than the client's 5 s: 60 retries, 303 s for one answer, in session 13)."""
    builds: list[int] = []

    def counted() -> dict[str, Any]:
        builds.append(len(builds))
        return snapshot_with(1_000)

    path = shared_dir / "storm.sock"
    async with ControlServer(path, counted) as control:
        for i in range(5):
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as gone:
                gone.bind(f"\0replicad-test-gone-{os.getpid()}-{i}")
                gone.sendto(encode_request("status", i), str(path))
        # Read after the five (one socket, in order), and answered.
        result = await ask(path, "status")
        assert len(result["partitions"]) == 1_000
        assert len(builds) == 1
        assert control.abandoned == 5


async def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(
    shared_dir: Path,
) -> None:
    path = shared_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(path))
    dead.close()  # what a killed daemon leaves behind
    with pytest.raises(DaemonNotRunning):
        query(path, "status", 1.0)
    async with ControlServer(path, lambda: {"alive": True}):
        assert await ask(path, "status") == {"alive": True}
        with pytest.raises(ControlError, match="another process is listening"):
            await ControlServer(path, dict).start()
        assert await ask(path, "status") == {"alive": True}


async def test_a_file_that_is_not_a_socket_is_left_alone(shared_dir: Path) -> None:
    path = shared_dir / "config.yaml"
    path.write_text("precious")
    with pytest.raises(ControlError, match="not a socket"):
        await ControlServer(path, dict).start()
    assert path.read_text() == "precious"


def test_status_and_commands_cannot_share_a_name() -> None:
    with pytest.raises(ValueError, match="status"):
        ControlServer(Path("/nonexistent"), dict, {"status": failing})
