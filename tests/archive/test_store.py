"""The bucket client against a real S3 server (versitygw): whole and ranged reads, listings,
a missing object, errors that name the key but never the credentials; every PUT carries a
CRC32C the server checks, and the body's SHA-256 is signed only where it is asked for."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from replicad.archive.store import (
    BLOCK_BYTES,
    ArchiveError,
    BucketSettings,
    ObjectStore,
    _Blocks,
    file_crc32c,
    is_bucket_url,
    parse_bucket_url,
)
from replicad.config.model import PayloadSigning
from tools.peers.s3 import S3Server, bucket_settings
from tools.peers.s3_proxy import S3FaultProxy


def store_of(server: S3Server | S3FaultProxy, bucket: str, **kwargs: object) -> ObjectStore:
    return ObjectStore(bucket_settings(server.endpoint, bucket, **kwargs))


def test_objects_are_written_and_read_whole_and_by_range(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    store = store_of(s3_server, s3_bucket)
    source = tmp_path / "segment"
    source.write_bytes(bytes(range(256)) * 40)
    assert store.put_file("p/t-0/A/0.log", source) == 10_240
    store.put_bytes("p/t-0/manifest.json", b"{}")
    store.put_bytes("p/t-1/manifest.json", b"{}")
    assert store.get("p/t-0/A/0.log") == source.read_bytes()
    assert store.get_range("p/t-0/A/0.log", 250, 10) == source.read_bytes()[250:260]
    assert store.get_range("p/t-0/A/0.log", 10_235, 100) == source.read_bytes()[10_235:]
    assert store.size("p/t-0/A/0.log") == 10_240
    assert store.get("p/missing") is None
    with pytest.raises(FileNotFoundError):
        store.get_range("p/missing", 0, 10)
    assert store.list_dirs("p/") == ["p/t-0/", "p/t-1/"]
    assert store.list_keys("p/t-0/") == ["p/t-0/A/0.log", "p/t-0/manifest.json"]
    assert store.requests["PUT"] == 3


def test_a_wrong_secret_fails_naming_the_key_not_the_secret(
    s3_server: S3Server, s3_bucket: str
) -> None:
    settings = bucket_settings(
        s3_server.endpoint, s3_bucket, secret_access_key="not-the-secret-1234"
    )
    with pytest.raises(ArchiveError) as caught:
        ObjectStore(settings).put_bytes("k", b"x")
    assert f"s3://{s3_bucket}/k: PUT failed" in str(caught.value)
    assert "not-the-secret-1234" not in str(caught.value)
    assert "not-the-secret-1234" not in repr(settings)


def test_bucket_urls() -> None:
    assert parse_bucket_url("s3://b/a/b/") == ("b", "a/b")
    assert parse_bucket_url("s3a://b") == ("b", "")
    assert is_bucket_url("s3://b/x") and not is_bucket_url("/var/lib/replicad")
    with pytest.raises(ArchiveError, match="not a bucket URL"):
        parse_bucket_url("http://b/x")


def test_an_endpoint_that_is_no_url_is_an_archive_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """boto3 raises ValueError ("Invalid endpoint") when the client is made: an ArchiveError
    naming the endpoint, which `verify s3://` and `dump-log s3://` report (no traceback)."""
    from replicad.cli import main

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with pytest.raises(ArchiveError, match="s3://b: endpoint 'localhost:9000': Invalid endpoint"):
        ObjectStore(BucketSettings("b", endpoint="localhost:9000"))
    assert main(["verify", "s3://b/x", "--s3-endpoint", "localhost:9000"]) == 1
    assert "replicad verify: s3://b: endpoint 'localhost:9000'" in capsys.readouterr().err


def _sent_headers(store: ObjectStore) -> list[dict[str, str]]:
    """The headers of every PutObject the store sends from now on, as sent."""
    seen: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        seen.append(
            {
                k.lower(): v.decode() if isinstance(v, bytes) else str(v)
                for k, v in request.headers.items()
            }
        )

    store._client.meta.events.register("before-send.s3.PutObject", record)
    return seen


def test_every_put_carries_a_crc32c_the_bucket_checks(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    store = store_of(s3_server, s3_bucket)
    sent = _sent_headers(store)
    source = tmp_path / "segment"
    body = os.urandom(3 * BLOCK_BYTES + 5)  # several blocks, the last one short
    source.write_bytes(body)
    assert store.put_file("a.log", source) == len(body)
    store.put_bytes("m.json", b'{"v": 1}')
    expected = [crc32c.crc32c(body), crc32c.crc32c(b'{"v": 1}')]
    assert [h["x-amz-checksum-crc32c"] for h in sent] == [
        base64.b64encode(c.to_bytes(4, "big")).decode() for c in expected
    ]
    # boto3's own checksum (a CRC32, another pass over the body) is not computed.
    assert not any("x-amz-checksum-crc32" in h for h in sent)
    assert store.get("a.log") == body
    # The bucket stored the checksum it was given, and checked it: a body that does not
    # match is refused and the object not written.
    head = store._client.head_object(Bucket=s3_bucket, Key="a.log", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == sent[0]["x-amz-checksum-crc32c"]
    with pytest.raises(ArchiveError, match=r"b\.log: PUT failed"):
        store._put("b.log", body, len(body), expected[0] ^ 1)
    assert store.get("b.log") is None


def test_the_payload_is_signed_over_http_unless_turned_off(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    source = tmp_path / "segment"
    source.write_bytes(os.urandom(100_000))
    signed = store_of(s3_server, s3_bucket)
    unsigned = store_of(s3_server, s3_bucket, payload_signing=PayloadSigning.UNSIGNED)
    signed_sent, unsigned_sent = _sent_headers(signed), _sent_headers(unsigned)
    signed.put_file("signed.log", source)
    unsigned.put_file("unsigned.log", source)
    assert signed_sent[0]["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"
    assert unsigned_sent[0]["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    # The bucket takes both, and the CRC32C is still sent and checked without the hash.
    assert "x-amz-checksum-crc32c" in unsigned_sent[0]
    assert unsigned.get("unsigned.log") == signed.get("signed.log") == source.read_bytes()


def test_payload_signing_auto_follows_the_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    auto = BucketSettings("b", endpoint="http://127.0.0.1:9000")
    assert auto.signs_payload
    assert not BucketSettings("b", endpoint="https://s3.example:9000").signs_payload
    assert not BucketSettings("b").signs_payload  # AWS's own endpoint: https
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert BucketSettings("b").signs_payload
    assert not BucketSettings(
        "b", endpoint="http://h:1", payload_signing=PayloadSigning.UNSIGNED
    ).signs_payload
    assert BucketSettings(
        "b", endpoint="https://h:1", payload_signing=PayloadSigning.SIGNED
    ).signs_payload


def test_a_file_is_read_in_blocks_and_its_crc32c_in_one_pass(tmp_path: Path) -> None:
    path = tmp_path / "f"
    body = os.urandom(2 * BLOCK_BYTES + 7)
    path.write_bytes(body + b"tail written after the size was taken")
    with open(path, "rb", buffering=0) as f:
        assert file_crc32c(f.fileno(), len(body)) == crc32c.crc32c(body)
        blocks = _Blocks(f, len(body))
        # urllib3 asks for 16 KiB; a block comes, and never past the size.
        assert blocks.read(16_384) == body[:BLOCK_BYTES]
        assert blocks.read(16_384) == body[BLOCK_BYTES : 2 * BLOCK_BYTES]
        assert blocks.read(16_384) == body[2 * BLOCK_BYTES :]
        assert blocks.read(16_384) == b""
        blocks.seek(0)  # boto3 rewinds a body to retry
        assert blocks.read() == body
        assert blocks.seek(0, os.SEEK_END) == len(body)  # how boto3 may size it
        assert file_crc32c(f.fileno(), 0) == 0
    path.write_bytes(body[:10])
    with open(path, "rb", buffering=0) as f, pytest.raises(OSError, match="ended at 10"):
        file_crc32c(f.fileno(), len(body))


def test_a_whole_object_read_is_checked_against_its_stored_crc32c(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """A byte flipped in the bucket's copy (versitygw's posix backend keeps each object as a
    file) is found by `get` and `get_to_file`; a ranged read returns what is there."""
    store = store_of(s3_server, s3_bucket)
    body = os.urandom(BLOCK_BYTES + 100)
    store.put_bytes("p/0.index", body)
    assert store.get("p/0.index") == body
    store.get_to_file("p/0.index", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == body
    on_disk = s3_server.data / s3_bucket / "p" / "0.index"
    with open(on_disk, "r+b") as f:  # in place: the object's stored checksum stays
        f.seek(BLOCK_BYTES + 1)
        f.write(bytes([body[BLOCK_BYTES + 1] ^ 0xFF]))
    for read in (
        lambda: store.get("p/0.index"),
        lambda: store.get_to_file("p/0.index", tmp_path / "again"),
    ):
        with pytest.raises(ArchiveError, match="do not match the CRC32C stored"):
            read()
    assert store.get_range("p/0.index", 0, 10) == body[:10]


def test_a_read_that_fails_midway_leaves_no_file_at_the_destination(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_to_file writes a temporary name and renames it once the object is read to its
    end: a read cut after its first block leaves nothing at the path (a shorter file there
    would look whole), nor the temporary file; a whole read replaces what was there."""
    store = store_of(s3_server, s3_bucket)
    body = os.urandom(3 * BLOCK_BYTES)
    store.put_bytes("p/0.log", body)
    real_get = store._client.get_object

    class CutBody:
        def __init__(self, body: Any) -> None:
            self._body = body

        def iter_chunks(self, size: int) -> Iterator[bytes]:
            chunks = self._body.iter_chunks(size)
            yield next(chunks)
            raise ConnectionResetError("the connection was cut")

    def cut_get(**kwargs: Any) -> dict[str, Any]:
        response = real_get(**kwargs)
        return {**response, "Body": CutBody(response["Body"])}

    monkeypatch.setattr(store._client, "get_object", cut_get)
    with pytest.raises(ArchiveError, match=r"p/0\.log: GET failed"):
        store.get_to_file("p/0.log", tmp_path / "0.log")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "0.log").write_bytes(b"an older copy")
    with pytest.raises(ArchiveError):
        store.get_to_file("p/0.log", tmp_path / "0.log")
    assert (tmp_path / "0.log").read_bytes() == b"an older copy"
    monkeypatch.setattr(store._client, "get_object", real_get)
    store.get_to_file("p/0.log", tmp_path / "0.log")
    assert (tmp_path / "0.log").read_bytes() == body
    assert [p.name for p in tmp_path.iterdir()] == ["0.log"]


def test_a_store_without_flexible_checksums_takes_puts_with_upload_crc32c_off(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """archive.upload_crc32c: a store that refuses x-amz-checksum-crc32c (501
    NotImplemented, as one without S3's flexible checksums answers) refuses every PUT that
    carries it; off, the PUTs carry none and are taken, and reads work as before."""
    source = tmp_path / "segment"
    body = os.urandom(BLOCK_BYTES + 3)
    source.write_bytes(body)
    with S3FaultProxy(s3_server.endpoint) as proxy:
        proxy.refuse_checksums(True)
        with_crc = store_of(proxy, s3_bucket)
        with pytest.raises(ArchiveError, match=r"a\.log: PUT failed: NotImplemented"):
            with_crc.put_file("a.log", source)
        without = store_of(proxy, s3_bucket, upload_crc32c=False)
        sent = _sent_headers(without)
        assert without.put_file("a.log", source) == len(body)
        without.put_bytes("m.json", b"{}")
        assert not any(k.startswith("x-amz-checksum-") for h in sent for k in h)
        assert without.get("a.log") == body and without.get("m.json") == b"{}"
        without.get_to_file("a.log", tmp_path / "copy")
        assert (tmp_path / "copy").read_bytes() == body
        assert proxy.stats.refused == 1
