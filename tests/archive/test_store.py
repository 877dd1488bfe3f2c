"""The bucket client against a real S3 server (versitygw): whole and ranged reads, listings,
a missing object, and errors that name the key but never the credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.archive.store import (
    ArchiveError,
    BucketSettings,
    ObjectStore,
    is_bucket_url,
    parse_bucket_url,
)
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server


def store_of(server: S3Server, bucket: str, **kwargs: object) -> ObjectStore:
    settings = BucketSettings(
        bucket,
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        **kwargs,  # type: ignore[arg-type]
    )
    return ObjectStore(settings)


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
    settings = BucketSettings(
        s3_bucket,
        endpoint=s3_server.endpoint,
        region=REGION,
        access_key_id=ACCESS_KEY,
        secret_access_key="not-the-secret-1234",
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
