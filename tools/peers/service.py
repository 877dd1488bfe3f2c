"""What every started thing of the harness shares: start/stop as a context manager, one port.

A `Service` is a broker, a cluster, a fault proxy -- anything a test starts, talks to on
127.0.0.1 and must stop. `with service:` starts it, stops it at the end of the block, and
kills what a failed start left half-running (a JVM that never became ready still holds
memory and a port).
"""

from __future__ import annotations

from typing import Self

from tools.peers.process import LOOPBACK, PeerError


class Service:
    """Start, stop, kill, and `with`; the port it listens on once started (kept by restarts)."""

    # Named in errors: "the Kafka broker has not been started yet".
    what = "service"
    _port: int | None = None

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Stop at once; by default the same as `stop`."""
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise PeerError(f"the {self.what} has not been started yet: no port")
        return self._port

    @property
    def bootstrap(self) -> str:
        """Its listener's address, 127.0.0.1:PORT."""
        return f"{LOOPBACK}:{self.port}"

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
