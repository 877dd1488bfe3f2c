"""A broker process of the harness: how Kafka and Tansu are started, awaited and stopped.

`BrokerProcess` holds what the two have in common, so each peer module says only what is
its own (the command line, the config, which log tells a taken port):

- Ports are picked free at the first start and kept by every later one, so a client sees
  the same address go away and come back.
- A port can be taken between `free_port()` and the broker's bind. A first start whose
  log says so starts over on new ports (`BIND_ATTEMPTS` in all); a restart never moves.
- Ready means the port accepts and the broker answers Metadata naming itself -- the moment
  clients can use it. A broker that exits meanwhile fails the wait at once, with the tail
  of its log.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tools.peers.admin import admin_client, create_topic_and_wait
from tools.peers.process import (
    PeerError,
    exit_reason,
    kill,
    port_accepts,
    terminate,
    wait_until,
)
from tools.peers.service import Service
from tools.wait import DEADLINE_S

# A port taken between free_port() and the broker's bind: start again on new ports.
BIND_ATTEMPTS = 3
METADATA_PROBE_TIMEOUT_S = 2.0

_log = logging.getLogger(__name__)


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def text_since(path: Path, position: int) -> str:
    """What a log file gained after byte `position` ("" when it cannot be read)."""
    try:
        with path.open("rb") as log:
            log.seek(position)
            return log.read().decode(errors="replace")
    except OSError:
        return ""


class BrokerProcess(Service):
    """One broker process in `workdir`; subclasses launch it (`_launch` sets `_proc`)."""

    # A JVM starting beside eight test runs and a CPU hog takes a minute or more; a broker
    # that exits is reported at once (`alive`), so the deadline only bounds a hang.
    start_timeout_s = 300.0
    stop_timeout_s = 30.0
    # The line a broker logs when its port is taken, and the file it logs it to.
    bind_failure_text = "Address already in use"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir).resolve()
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what a peer says about itself ----------------------------------------------

    @property
    def bind_log(self) -> Path:
        """The log in which a failed bind shows."""
        raise NotImplementedError

    def _check_installed(self) -> None:
        """Raise PeerNotInstalledError (with the command that installs it) before launching."""

    def _pick_ports(self) -> None:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Files the launch needs (config, formatted storage)."""

    def _launch(self) -> None:
        raise NotImplementedError

    def _serves(self, brokers: Mapping[int, object]) -> bool:
        """Whether a Metadata answer's broker list shows this broker ready."""
        return bool(brokers)

    def _forget_failed_start(self) -> None:
        """Undo what a first start on a taken port left (it may depend on the old ports)."""

    def _exited(self, code: int | None) -> None:
        """The process ended: `code` from a stop, None from a kill."""

    def _logs_tail(self) -> str:
        return tail(self.bind_log)

    # -- life cycle ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self, timeout_s: float | None = None) -> None:
        """Launch and wait until it serves metadata; see the module doc for taken ports."""
        if self.running:
            raise PeerError(f"the {self.what} in {self.workdir} is already running")
        self._check_installed()
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        first_start = self._port is None
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if first_start:
                self._pick_ports()
            self.prepare()
            started = time.monotonic()
            mark = self.bind_log.stat().st_size if self.bind_log.exists() else 0
            self.launch()
            try:
                self.wait_ready(timeout_s)
            except PeerError:
                taken = self.bind_failed(mark)
                self.kill()
                if first_start and taken and attempt < BIND_ATTEMPTS:
                    _log.warning("%s: port taken, retrying on new ports", self.what)
                    self._forget_failed_start()
                    continue
                raise
            _log.info(
                "%s %s up in %.1f s (workdir %s)",
                self.what,
                self.bootstrap,
                time.monotonic() - started,
                self.workdir,
            )
            return

    def prepare(self) -> None:
        """Write what the launch needs (a cluster prepares all its nodes before launching)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._prepare()

    def launch(self) -> None:
        """Start the process without waiting for it."""
        self._launch()

    def wait_ready(self, timeout_s: float) -> None:
        """Until the broker answers Metadata naming itself; PeerError with its log's tail."""
        proc = self._proc
        assert proc is not None
        client: AdminClient | None = None

        def serves_metadata() -> bool | None:
            nonlocal client
            if not port_accepts(self.port):
                return None
            if client is None:
                client = self.admin()
            brokers = client.list_topics(timeout=METADATA_PROBE_TIMEOUT_S).brokers
            return True if self._serves(brokers) else None

        try:
            wait_until(
                serves_metadata,
                timeout_s=timeout_s,
                what=f"{self.what} on {self.bootstrap}",
                alive=lambda: exit_reason(proc),
            )
        except PeerError as exc:
            raise PeerError(f"{exc}\n--- {self.bind_log} (tail) ---\n{self._logs_tail()}") from exc

    def bind_failed(self, since: int = 0) -> bool:
        """Whether the broker's log, from byte `since`, says its port was taken."""
        return self.bind_failure_text in text_since(self.bind_log, since)

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL when it takes longer than `timeout_s`."""
        if self._proc is not None:
            code = terminate(
                self._proc, timeout_s=self.stop_timeout_s if timeout_s is None else timeout_s
            )
            self._proc = None
            self._exited(code)

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown."""
        if self._proc is not None:
            kill(self._proc)
            self._proc = None
            self._exited(None)

    def restart(self, timeout_s: float | None = None) -> None:
        """Stop and start again on the same ports."""
        self.stop()
        self.start(timeout_s)

    # -- topics ----------------------------------------------------------------------

    def admin(self) -> AdminClient:
        """A confluent-kafka AdminClient on this broker (its log goes to `logging`)."""
        return admin_client(self.bootstrap)

    def create_topic(
        self,
        name: str,
        partitions: int,
        config: Mapping[str, str] | None = None,
        *,
        timeout_s: float = DEADLINE_S,
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition is served."""
        create_topic_and_wait(self.bootstrap, name, partitions, config, timeout_s=timeout_s)
