"""The bucket: the one module that talks to S3-compatible object storage (through boto3).

Why boto3: the reference S3 client, kept by AWS, that every S3-compatible server is tested
against; its standard credential chain (the AWS_* environment, a shared credentials file,
an instance role) is what operators and Spark clusters already configure. It is
synchronous: the uploader runs it in a thread of its own, never on the event loop.

- Objects are written with a single PUT from the open file (boto3 streams it: memory stays
  bounded by its chunk, not the segment), read whole (`get`, small objects: manifests,
  indexes) or by byte range (`get_range`, a Range GET: segment bytes).
- A missing object reads as None; every other failure is an `ArchiveError` that names the
  key and the server's code (503 SlowDown included), never the credentials.
- Paths are `s3://bucket/prefix` (or `s3a://`, Hadoop's name, read the same way).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from replicad.errors import ReplicadError

SCHEMES = ("s3", "s3a")


class ArchiveError(ReplicadError):
    """The bucket could not be read or written (the message names the key and why)."""


@dataclass(frozen=True, slots=True)
class BucketSettings:
    bucket: str
    prefix: str = ""
    # None: AWS's own endpoint for the region, or AWS_ENDPOINT_URL when set.
    endpoint: str | None = None
    region: str | None = None
    # None: boto3's credential chain (AWS_ACCESS_KEY_ID..., ~/.aws/credentials, a role).
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    # Path-style addressing (http://host/bucket/key), which every S3-compatible server
    # accepts; false: virtual-hosted style (http://bucket.host/key), AWS's preference.
    path_style: bool = True
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    # boto3's own attempts per request (its "standard" retries of throttling, 5xx and
    # resets, with jittered back-off): Spark's reads keep them; the uploader asks for 1
    # and retries with its own back-off, so that every failure is counted and shown.
    max_attempts: int = 3

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.strip('/')}".rstrip("/")


def is_bucket_url(path: str) -> bool:
    return urlsplit(path).scheme in SCHEMES


def parse_bucket_url(url: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> ("bucket", "a/b"); ArchiveError when it is not such a URL."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise ArchiveError(f"{url}: not a bucket URL (s3://bucket/prefix or s3a://...)")
    return parts.netloc, parts.path.strip("/")


def settings_from_url(url: str, **kwargs: Any) -> BucketSettings:
    bucket, prefix = parse_bucket_url(url)
    return BucketSettings(bucket, prefix, **kwargs)


class ObjectStore:
    """One bucket; safe to share between threads (boto3 clients are)."""

    def __init__(self, settings: BucketSettings) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        self.requests = {"PUT": 0, "GET": 0, "LIST": 0, "DELETE": 0}
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=settings.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=settings.region,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            config=Config(
                s3={"addressing_style": "path" if settings.path_style else "virtual"},
                connect_timeout=settings.connect_timeout_s,
                read_timeout=settings.read_timeout_s,
                retries={"mode": "standard", "max_attempts": settings.max_attempts},
            ),
        )

    def _fail(self, what: str, key: str, error: Exception) -> ArchiveError:
        code = _error_code(error)
        return ArchiveError(
            f"s3://{self.settings.bucket}/{key}: {what} failed: {code or type(error).__name__}"
            f"{'' if code else f' ({error})'}"
        )

    def put_file(self, key: str, path: Path) -> int:
        """Uploads the file as it is now; its size."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._put(key, f, size)
        return size

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(key, data, len(data))

    def _put(self, key: str, body: Any, size: int) -> None:
        self.requests["PUT"] += 1
        try:
            self._client.put_object(
                Bucket=self.settings.bucket, Key=key, Body=body, ContentLength=size
            )
        except Exception as error:
            raise self._fail("PUT", key, error) from None

    def get(self, key: str) -> bytes | None:
        """The whole object, None when there is none."""
        self.requests["GET"] += 1
        try:
            response = self._client.get_object(Bucket=self.settings.bucket, Key=key)
            return bytes(response["Body"].read())
        except Exception as error:
            if _error_code(error) in ("NoSuchKey", "404"):
                return None
            raise self._fail("GET", key, error) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the object (fewer at its end; b"" past it)."""
        if length <= 0:
            return b""
        self.requests["GET"] += 1
        try:
            response = self._client.get_object(
                Bucket=self.settings.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            return bytes(response["Body"].read())
        except Exception as error:
            if _error_code(error) == "InvalidRange":
                return b""
            if _error_code(error) in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"s3://{self.settings.bucket}/{key}") from None
            raise self._fail("GET", key, error) from None

    def get_to_file(self, key: str, path: Path) -> None:
        """The whole object into `path`, streamed (memory bounded by boto3's chunks);
        FileNotFoundError when there is none."""
        self.requests["GET"] += 1
        try:
            self._client.download_file(self.settings.bucket, key, str(path))
        except Exception as error:
            if _error_code(error) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"s3://{self.settings.bucket}/{key}") from None
            raise self._fail("GET", key, error) from None

    def size(self, key: str) -> int:
        """The object's size (a HEAD request); FileNotFoundError when there is none."""
        self.requests["GET"] += 1
        try:
            response = self._client.head_object(Bucket=self.settings.bucket, Key=key)
            return int(response["ContentLength"])
        except Exception as error:
            if _error_code(error) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"s3://{self.settings.bucket}/{key}") from None
            raise self._fail("HEAD", key, error) from None

    def delete(self, keys: list[str]) -> None:
        """Deletes the objects (a DeleteObjects request a thousand keys); a key already gone
        is no error (S3 answers deletions of missing keys as done)."""
        for at in range(0, len(keys), 1000):
            chunk = keys[at : at + 1000]
            self.requests["DELETE"] += 1
            try:
                answer = self._client.delete_objects(
                    Bucket=self.settings.bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
            except Exception as error:
                raise self._fail("DELETE", chunk[0], error) from None
            failed = answer.get("Errors") or ()
            if failed:
                first = failed[0]
                raise ArchiveError(
                    f"s3://{self.settings.bucket}/{first.get('Key')}: DELETE failed: "
                    f"{first.get('Code')} ({len(failed)} keys not deleted)"
                )

    def list_dirs(self, prefix: str) -> list[str]:
        """The "subdirectories" directly under `prefix` (CommonPrefixes), sorted."""
        found: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(
                Bucket=self.settings.bucket, Prefix=prefix, Delimiter="/"
            ):
                self.requests["LIST"] += 1
                found += [p["Prefix"] for p in page.get("CommonPrefixes", ())]
        except Exception as error:
            raise self._fail("LIST", prefix, error) from None
        return sorted(found)

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (for checks and tests; planning never lists)."""
        found: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.settings.bucket, Prefix=prefix):
                self.requests["LIST"] += 1
                found += [o["Key"] for o in page.get("Contents", ())]
        except Exception as error:
            raise self._fail("LIST", prefix, error) from None
        return sorted(found)


def _error_code(error: Exception) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None
