"""versitygw, a real S3-compatible server, for the archive's tests (tools/s3/versitygw.sh).

It runs with the `posix` backend: every bucket is a directory under `<workdir>/data` and
every object a file in it, so what a test uploaded can also be looked at on disk. It listens
on 127.0.0.1 on a free port, with one root account (`ACCESS_KEY`/`SECRET_KEY`, test-only
values). Ready means the port accepts and ListBuckets answers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.peers.broker import tail
from tools.peers.process import (
    LOOPBACK,
    PeerNotInstalledError,
    exit_reason,
    free_port,
    kill,
    spawn,
    terminate,
    wait_until,
)
from tools.peers.service import Service
from tools.wait import DEADLINE_S

if TYPE_CHECKING:
    from replicad.archive.store import BucketSettings

ROOT = Path(__file__).resolve().parents[2]
BINARY = (
    Path(os.environ.get("REPLICAD_VERSITYGW_CACHE", ROOT / ".cache" / "versitygw"))
    / "bin"
    / "versitygw"
)
ACCESS_KEY = "replicad-test"
SECRET_KEY = "replicad-test-secret-key"  # a throw-away server's root account
REGION = "us-east-1"


def client_environ() -> dict[str, str]:
    """The variables a client (boto3, a Spark executor, replicad) reads the test server's
    credentials and region from."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }


def bucket_settings(endpoint: str, bucket: str, prefix: str = "", **kwargs: Any) -> BucketSettings:
    """`BucketSettings` of `bucket` on the test server at `endpoint` (or a fault proxy in
    front of it), in its region and signed with its account; `kwargs`: other fields."""
    from replicad.archive.store import BucketSettings

    account = {"region": REGION, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    return BucketSettings(bucket, prefix, endpoint=endpoint, **{**account, **kwargs})


def archived_end(store: Any, bucket: str, prefix: str, topic: str, partition: int) -> int:
    """The end offset of a partition's archive as its manifest says, read with `store` (a
    boto3 client, `S3Server.client()`); 0 while there is no manifest."""
    from replicad.archive.manifest import decode_manifest, manifest_key, partition_prefix
    from replicad.types import TopicPartition

    tp = TopicPartition(topic, partition)

    def get(key: str) -> bytes | None:
        try:
            return bytes(store.get_object(Bucket=bucket, Key=key)["Body"].read())
        except store.exceptions.NoSuchKey:
            return None

    body = get(manifest_key(prefix, tp))
    if body is None:
        return 0
    directory = partition_prefix(prefix, tp)
    manifest = decode_manifest(
        body, source=manifest_key(prefix, tp), read=lambda n: get(directory + n)
    )
    return manifest.end_offset or 0


class S3Server(Service):
    """One versitygw on 127.0.0.1; its output goes to `<workdir>/versitygw.out`."""

    what = "S3 server (versitygw)"

    def __init__(self, workdir: Path, *, access_log: bool = False) -> None:
        self.workdir = Path(workdir).resolve()
        # One line per request (benchmarks count requests by method from it).
        self.access_log = self.workdir / "access.log" if access_log else None
        self.data = self.workdir / "data"
        self.output = self.workdir / "versitygw.out"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU from /proc)."""
        return self._proc.pid if self._proc is not None else None

    def environ(self) -> dict[str, str]:
        """`client_environ()` and this server's endpoint (AWS_ENDPOINT_URL)."""
        return {**client_environ(), "AWS_ENDPOINT_URL": self.endpoint}

    def start(self) -> S3Server:
        if not os.access(BINARY, os.X_OK):
            raise PeerNotInstalledError(
                f"versitygw is not built ({BINARY}): run `make s3-server` "
                "(tools/s3/versitygw.sh fetch)"
            )
        self.data.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port()
        argv = [
            str(BINARY),
            "--access",
            ACCESS_KEY,
            "--secret",
            SECRET_KEY,
            "--port",
            f"{LOOPBACK}:{self._port}",
            "--region",
            REGION,
            "--quiet",
            *(["--access-log", str(self.access_log)] if self.access_log else []),
            "posix",
            str(self.data),
        ]
        with self.output.open("ab") as out:
            self._proc = spawn(argv, cwd=self.workdir, env=os.environ, output=out)
        proc = self._proc
        wait_until(
            self._answers,
            timeout_s=DEADLINE_S,
            what=f"{self.what} on {self.endpoint}",
            alive=lambda: _with_log(exit_reason(proc), self.output),
        )
        return self

    def _answers(self) -> bool | None:
        self.client().list_buckets()
        return True

    def requests(self, operation: str) -> int:
        """Requests of an S3 operation (GetObject, PutObject, ...) in the access log so far
        (0 without one)."""
        if self.access_log is None or not self.access_log.exists():
            return 0
        text = self.access_log.read_text(errors="replace")
        return sum(f" s3_{operation} " in line for line in text.splitlines())

    def client(self) -> Any:
        """A boto3 S3 client of the root account (path-style addressing, as the archive's)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self._proc is not None:
            terminate(self._proc, timeout_s=10.0)
            self._proc = None

    def kill(self) -> None:
        if self._proc is not None:
            kill(self._proc)
            self._proc = None


def _with_log(reason: str | None, output: Path) -> str | None:
    return None if reason is None else f"{reason}\n{tail(output, 30)}"
