"""The bucket: the one module that talks to S3-compatible object storage (through boto3).

Why boto3: the reference S3 client, kept by AWS, that every S3-compatible server is tested
against; its standard credential chain (the AWS_* environment, a shared credentials file,
an instance role) is what operators and Spark clusters already configure. It is
synchronous: the uploader runs it in a thread of its own, never on the event loop.

- Objects are written with a single PUT from the open file (streamed: memory stays bounded
  by a block, not the segment; S3 takes up to 5 GiB in one PUT and a Kafka segment is at
  most 2 GiB, so no multipart: one request per object keeps the requests per GB low), read
  whole (`get`, small objects: manifests, indexes) or by byte range (`get_range`, a Range
  GET: segment bytes).
- Integrity without hashing twice: every PUT carries the body's CRC32C
  (`x-amz-checksum-crc32c`), computed by the `crc32c` library (hardware, outside the GIL)
  in one pass over the file, and the bucket refuses a body that does not match it
  (BadDigest); boto3's own request checksum (a CRC32 in Python's zlib, another pass) is
  off (`request_checksum_calculation="when_required"`). A file changed between that pass
  and the send fails the same way, and is uploaded again. An S3-compatible store without
  S3's flexible checksums refuses that header: `upload_crc32c` off (archive.upload_crc32c)
  sends none and skips the pass (the payload signature, where on, still guards the body).
- Payload signing (`payload_signing`): SigV4 signs a SHA-256 of the whole body, one more
  pass over it, in this process and in the server. Over TLS it is off (UNSIGNED-PAYLOAD, as
  AWS's SDKs do: TLS guards the bytes in transit, the CRC32C their integrity). Over plain
  http it is on by default -- there it is the only guard against a body changed in transit
  on purpose (a CRC is no defence against that) -- unless the operator turns it off for a
  bucket on loopback or a trusted link (`unsigned`). `signed` keeps it on over TLS for
  an endpoint that refuses UNSIGNED-PAYLOAD.
- A missing object reads as None; every other failure is an `ArchiveError` that names the
  key and the server's code (503 SlowDown included), never the credentials.
- A whole object read (`get`, `get_to_file`) is checked against the CRC32C stored with it
  (botocore can check only its own CRC32 and the SHAs without the AWS CRT); a ranged read
  is not (S3 keeps no checksum of a range): its record batches carry their own CRC32C.
- Paths are `s3://bucket/prefix` (or `s3a://`, Hadoop's name, read the same way).
"""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import crc32c

from replicad.config.model import ArchiveConfig, PayloadSigning, defaults_of
from replicad.errors import ReplicadError

SCHEMES = ("s3", "s3a")
# The file is read in blocks this large for its CRC32C and for the send: one Python turn
# a block, the copy and the CRC outside the GIL.
BLOCK_BYTES = 1024 * 1024
_ARCHIVE = defaults_of(ArchiveConfig)


class ArchiveError(ReplicadError):
    """The bucket could not be read or written (the message names the key and why)."""


class ChecksumMismatch(ArchiveError):
    """A whole object read does not match the CRC32C stored with it: that object is damaged
    in the bucket (or was changed on the way), the bucket itself answers."""


@dataclass(frozen=True, slots=True)
class BucketSettings:
    """How to reach one bucket: from `archive:` (the uploader, serve's remote reads) or from
    a bucket URL (Spark, `serve --archive`, `verify` and `dump-log` of a bucket). The
    defaults of the keys `archive:` sets are that section's, written there only; the
    timeouts and attempts are the client's own (`archive:` sets both timeouts from one
    `request_timeout_ms`)."""

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
    path_style: bool = _ARCHIVE["path_style"]
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    # boto3's own attempts per request (its "standard" retries of throttling, 5xx and
    # resets, with jittered back-off): Spark's reads keep them; the uploader asks for 1
    # and retries with its own back-off, so that every failure is counted and shown.
    max_attempts: int = 3
    payload_signing: PayloadSigning = _ARCHIVE["payload_signing"]
    # Each PUT carries its body's CRC32C (archive.upload_crc32c; module docstring).
    upload_crc32c: bool = _ARCHIVE["upload_crc32c"]

    @property
    def signs_payload(self) -> bool:
        """Whether PUT bodies are SHA-256 signed (module docstring)."""
        if self.payload_signing is not PayloadSigning.AUTO:
            return self.payload_signing is PayloadSigning.SIGNED
        endpoint = self.endpoint or os.environ.get("AWS_ENDPOINT_URL") or "https://"
        return not endpoint.lower().startswith("https://")

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
        self.settings = settings
        self.requests = {"PUT": 0, "GET": 0, "LIST": 0, "DELETE": 0}
        self._counting = threading.Lock()  # several uploads and reads at once
        endpoint = settings.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
        try:
            self._client = _client(settings, endpoint)
        except ValueError as error:  # boto3's "Invalid endpoint: ...": a bad URL, said so
            raise ArchiveError(f"s3://{settings.bucket}: endpoint {endpoint!r}: {error}") from None

    def _fail(self, what: str, key: str, error: Exception) -> ArchiveError:
        code = _error_code(error)
        return ArchiveError(
            f"s3://{self.settings.bucket}/{key}: {what} failed: {code or type(error).__name__}"
            f"{'' if code else f' ({error})'}"
        )

    def _count(self, method: str) -> None:
        with self._counting:
            self.requests[method] += 1

    def put_file(self, key: str, path: Path) -> int:
        """Uploads the file as it is now; its size."""
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            checksum = file_crc32c(f.fileno(), size) if self.settings.upload_crc32c else None
            self._put(key, _Blocks(f, size), size, checksum)
        return size

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(
            key, data, len(data), crc32c.crc32c(data) if self.settings.upload_crc32c else None
        )

    def _put(self, key: str, body: Any, size: int, checksum: int | None) -> None:
        """One PutObject; `checksum`: the body's CRC32C, sent for the bucket to check
        (None: upload_crc32c is off, nothing sent)."""
        self._count("PUT")
        sums = (
            {}
            if checksum is None
            else {"ChecksumCRC32C": base64.b64encode(checksum.to_bytes(4, "big")).decode()}
        )
        try:
            self._client.put_object(
                Bucket=self.settings.bucket, Key=key, Body=body, ContentLength=size, **sums
            )
        except Exception as error:
            raise self._fail("PUT", key, error) from None

    def get(self, key: str) -> bytes | None:
        """The whole object, None when there is none."""
        self._count("GET")
        try:
            response = self._client.get_object(
                Bucket=self.settings.bucket, Key=key, ChecksumMode="ENABLED"
            )
            data = bytes(response["Body"].read())
        except Exception as error:
            if _error_code(error) in ("NoSuchKey", "404"):
                return None
            raise self._fail("GET", key, error) from None
        self._check(key, response, crc32c.crc32c(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the object (fewer at its end; b"" past it)."""
        if length <= 0:
            return b""
        self._count("GET")
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
        """The whole object into `path`, streamed (memory bounded by a block);
        FileNotFoundError when there is none. The bytes go to a temporary name beside
        `path`, renamed to it once the object is read to its end: a read that fails or a
        process that dies midway leaves no shorter file at `path` that looks whole (the
        temporary one is removed on a failure). An object that does not match its stored
        CRC32C is at `path` as read, and ChecksumMismatch says so (dump-log shows it)."""
        self._count("GET")
        value = 0
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            response = self._client.get_object(
                Bucket=self.settings.bucket, Key=key, ChecksumMode="ENABLED"
            )
            with open(partial, "wb") as out:
                for block in response["Body"].iter_chunks(BLOCK_BYTES):
                    out.write(block)
                    value = crc32c.crc32c(block, value)
            os.replace(partial, path)
        except Exception as error:
            partial.unlink(missing_ok=True)
            if _error_code(error) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"s3://{self.settings.bucket}/{key}") from None
            raise self._fail("GET", key, error) from None
        self._check(key, response, value)

    def _check(self, key: str, response: dict[str, Any], value: int) -> None:
        """A whole object read must match the CRC32C the bucket stored with it (boto3
        checks only the CRC32 and SHAs itself); an object without one is taken as read."""
        stored = response.get("ChecksumCRC32C")
        if not stored or "-" in stored:  # none, or a multipart object's composite
            return
        if base64.b64decode(stored) != value.to_bytes(4, "big"):
            raise ChecksumMismatch(
                f"s3://{self.settings.bucket}/{key}: the bytes read do not match the "
                f"CRC32C stored with the object ({stored})"
            )

    def size(self, key: str) -> int:
        """The object's size (a HEAD request); FileNotFoundError when there is none."""
        self._count("GET")
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
            self._count("DELETE")
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
                self._count("LIST")
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
                self._count("LIST")
                found += [o["Key"] for o in page.get("Contents", ())]
        except Exception as error:
            raise self._fail("LIST", prefix, error) from None
        return sorted(found)


def _client(settings: BucketSettings, endpoint: str | None) -> Any:
    """boto3's S3 client for `settings` (ValueError for an endpoint that is no URL)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=settings.region,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        config=Config(
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            retries={"mode": "standard", "max_attempts": settings.max_attempts},
            # Our own CRC32C instead (module docstring); whole reads are checked by
            # boto3 (CRC32, SHAs) and by `_check` (CRC32C).
            request_checksum_calculation="when_required",
            s3={
                "addressing_style": "path" if settings.path_style else "virtual",
                "payload_signing_enabled": settings.signs_payload,
            },
        ),
    )


def file_crc32c(fd: int, size: int) -> int:
    """The CRC32C of the file's first `size` bytes (OSError when it is shorter now)."""
    block = bytearray(min(BLOCK_BYTES, max(size, 1)))
    view = memoryview(block)
    value, at = 0, 0
    while at < size:
        n = os.preadv(fd, [view[: min(len(block), size - at)]], at)
        if n == 0:
            raise OSError(f"the file ended at {at} of its {size} bytes while read")
        value = crc32c.crc32c(view[:n], value)
        at += n
    return value


class _Blocks:
    """A file as a PUT body, read in BLOCK_BYTES blocks.

    urllib3 sends a file body by reading it `blocksize` (16 KiB) at a time, each block a
    turn of Python: about 65,000 a GB. This reads the size asked or a block, whichever is
    larger (at most what is left of `size`), so a GB is about a thousand turns; the rest
    of the file interface is the file's own (boto3 seeks it back to retry a request).
    """

    def __init__(self, f: Any, size: int) -> None:
        self._f = f
        self._size = size

    def read(self, amt: int | None = -1) -> bytes:
        left = self._size - self._f.tell()
        if left <= 0:
            return b""
        want = left if amt is None or amt < 0 else min(left, max(amt, BLOCK_BYTES))
        return bytes(self._f.read(want))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:  # the body ends at `size`, whatever follows in the file
            return int(self._f.seek(self._size + offset))
        return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        return int(self._f.tell())


def _error_code(error: Exception) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None
