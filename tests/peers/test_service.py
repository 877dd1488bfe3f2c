"""tools/peers/service.py: `with` starts, stops, and kills what a failed start left."""

from __future__ import annotations

import pytest

from tools.peers.process import PeerError
from tools.peers.service import Service


class Recorder(Service):
    what = "recorder"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")
        if self.fail:
            raise PeerError("did not come up")
        self._port = 4242

    def stop(self) -> None:
        self.calls.append("stop")

    def kill(self) -> None:
        self.calls.append("kill")


def test_with_starts_and_stops() -> None:
    service = Recorder()
    with pytest.raises(PeerError, match="the recorder has not been started yet"):
        _ = service.port
    with service as same:
        assert same is service
        assert service.bootstrap == "127.0.0.1:4242"
    assert service.calls == ["start", "stop"]


def test_a_failed_start_is_killed_and_raised() -> None:
    service = Recorder(fail=True)
    with pytest.raises(PeerError, match="did not come up"), service:
        pytest.fail("the block must not run")
    assert service.calls == ["start", "kill"]
