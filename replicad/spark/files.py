"""Every file the Spark source opens goes through `FileOpener`, the one place to observe it.

Pruning is a promise about files not opened, so it has to be checkable: with a trace path
(the `traceFileOpens` option) each open appends one line `<purpose>\\t<path>` to that file.
Planning on the driver and reading on the executors run in different processes; lines are
appended with O_APPEND in a single write, which keeps them whole when processes interleave
on a local file system.

A path is a local file, or an object of an archive bucket (`s3://bucket/key`, or
`s3a://`; replicad/archive): `open` hands back a `RandomAccess` either way, read by
position -- `pread` on a descriptor, a ranged GET on an object -- so the planner and the
readers are the same code for both. A bucket's client is made once per process and
bucket (boto3 clients are thread-safe); its credentials come from the AWS chain (the
environment, a credentials file, a role), never from the read's options.

Files are only ever opened read-only: the data directory may belong to a running replicad.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from replicad.archive.store import (
    BucketSettings,
    ObjectStore,
    is_bucket_url,
    parse_bucket_url,
    settings_from_url,
)
from replicad.log.layout import classify_partition_files


class Purpose(enum.Enum):
    INDEX = "index"  # planning: an .index or .timeindex file
    PLAN = "plan"  # planning: a .log read to turn a timestamp into an offset
    READ = "read"  # a split's own bytes
    LOOKAHEAD = "lookahead"  # read_committed: bytes after a split, for transaction markers


class RandomAccess(Protocol):
    def pread(self, size: int, position: int) -> bytes: ...

    @property
    def size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LocalFile:
    fd: int

    def pread(self, size: int, position: int) -> bytes:
        return os.pread(self.fd, size, position)

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size


@dataclass(frozen=True, slots=True)
class RemoteObject:
    """An object of a bucket; every `pread` is one ranged GET."""

    store: ObjectStore
    key: str

    def pread(self, size: int, position: int) -> bytes:
        return self.store.get_range(self.key, position, size)

    @property
    def size(self) -> int:
        return self.store.size(self.key)


_stores: dict[BucketSettings, ObjectStore] = {}
_stores_lock = threading.Lock()


def bucket_store(settings: BucketSettings) -> ObjectStore:
    """The process's client of one bucket."""
    with _stores_lock:
        store = _stores.get(settings)
        if store is None:
            store = _stores[settings] = ObjectStore(settings)
        return store


@dataclass(frozen=True, slots=True)
class FileOpener:
    trace_path: str | None = None
    # Where a bucket URL's objects are (None: the AWS configuration's defaults).
    s3_endpoint: str | None = None
    s3_region: str | None = None

    def store(self, url: str) -> tuple[ObjectStore, str]:
        """The client of the bucket `url` names, and the key (or prefix) it names."""
        bucket, key = parse_bucket_url(url)
        settings = settings_from_url(
            f"s3://{bucket}", endpoint=self.s3_endpoint, region=self.s3_region
        )
        return bucket_store(settings), key

    @contextmanager
    def open(self, path: str, purpose: Purpose) -> Iterator[RandomAccess]:
        """Read-only access to `path`; FileNotFoundError when it is gone."""
        if is_bucket_url(path):
            store, key = self.store(path)
            self._trace(path, purpose)
            yield RemoteObject(store, key)
            return
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._trace(path, purpose)
            yield LocalFile(fd)
        finally:
            os.close(fd)

    def read_all(self, path: str, purpose: Purpose) -> bytes | None:
        """The whole file, or None when it does not exist."""
        if is_bucket_url(path):
            store, key = self.store(path)
            self._trace(path, purpose)
            return store.get(key)
        try:
            with self.open(path, purpose) as file:
                size = file.size
                return file.pread(size, 0) if size else b""
        except FileNotFoundError:
            return None

    def segments(self, directory: str) -> list[int]:
        """Base offsets of the segments in a partition's directory (or bucket prefix)."""
        if is_bucket_url(directory):
            store, prefix = self.store(directory)
            keys = store.list_keys(prefix.rstrip("/") + "/")
            names = [key.rsplit("/", 1)[-1] for key in keys]
        else:
            names = sorted(os.listdir(directory))
        return classify_partition_files(sorted(names)).segments

    def _trace(self, path: str, purpose: Purpose) -> None:
        if self.trace_path is None:
            return
        line = f"{purpose.value}\t{path}\n".encode()
        fd = os.open(self.trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class TracedOpen:
    purpose: Purpose
    path: str


def read_trace(trace_path: str) -> list[TracedOpen]:
    """The opens a trace file recorded, in the order they were appended."""
    try:
        with open(trace_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    opened = []
    for line in lines:
        purpose, _, path = line.partition("\t")
        opened.append(TracedOpen(Purpose(purpose), path))
    return opened
