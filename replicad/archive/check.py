"""`replicad verify s3://bucket/prefix` and `replicad dump-log s3://...`: the archive checked
as a data directory is (log/verify.py, log/dump.py), one segment at a time.

Rules:
- The partitions are the prefixes under the archive's prefix that hold a manifest
  (`<topic>-<partition>/manifest.json`); a prefix without one is reported, not failed.
- Per partition, the manifest must parse and name its own topic and partition; its
  segments' objects (`.log`, `.index`, `.timeindex`) must all be there. Each segment is
  downloaded to a temporary directory (one at a time: disk and memory stay bounded by one
  segment) and checked by log/verify.py's own checks: batches whole, CRCs, offsets
  increasing, indexes agreeing; then against the manifest: the `.log`'s size, its batches
  within [base, next offset), its largest timestamp. Offsets must increase across
  segments (gaps counted, as in a directory).
- Objects under the partition's topic-id prefix that no manifest names (a crash between
  an upload and its manifest, or a deletion's leftovers) are counted, not failed: the next
  upload writes them again under the same keys.
- An object whose bytes do not match the CRC32C stored with it (damaged in the bucket) is a
  problem of its partition, named on its line; the other segments and partitions are still
  checked. dump-log says so in a PROBLEM line and dumps the object as it was read.
- Exit 0 when nothing was found, 1 otherwise (as `verify DATA_DIR`); the bucket that cannot
  be read at all is an ArchiveError for the command line to report.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import TextIO

from replicad.archive.manifest import (
    MANIFEST_NAME,
    SEGMENT_SUFFIXES,
    Manifest,
    chunk_name,
    decode_manifest,
    normalized_prefix,
    partition_prefix,
    segment_key,
    segments_prefix,
)
from replicad.archive.store import ChecksumMismatch, ObjectStore
from replicad.errors import LogError
from replicad.log.dump import dump_log
from replicad.log.layout import LOG_SUFFIX, parse_partition_dir, segment_file_name
from replicad.log.verify import EXIT_OK, EXIT_PROBLEMS, PartitionReport, verify_partition
from replicad.records.batch import NO_TIMESTAMP
from replicad.types import TopicPartition


def verify_bucket(store: ObjectStore, out: TextIO) -> int:
    """Every partition of the archive under the store's prefix; one line each, then a summary."""
    prefix = normalized_prefix(store.settings.prefix)
    failed = False
    partitions = 0
    for directory in store.list_dirs(prefix):
        name = directory[len(prefix) :].rstrip("/")
        tp = parse_partition_dir(name)
        if tp is None:
            continue
        try:
            data = store.get(directory + MANIFEST_NAME)
        except ChecksumMismatch as error:  # this partition's problem, not the bucket's
            partitions += 1
            print(PartitionReport(name, problems=[str(error)]).line(), file=out)
            failed = True
            continue
        if data is None:
            print(f"{name}: no manifest (nothing archived yet)", file=out)
            continue
        partitions += 1
        report = verify_archived_partition(store, tp, data)
        print(report.line(), file=out)
        failed = failed or bool(report.problems)
    print(
        f"{store.settings.url}: {partitions} partitions, "
        f"{'problems found' if failed else 'all ok'}",
        file=out,
    )
    return EXIT_PROBLEMS if failed else EXIT_OK


def verify_archived_partition(
    store: ObjectStore, tp: TopicPartition, data: bytes
) -> PartitionReport:
    report = PartitionReport(f"{tp.topic}-{tp.partition}")
    source = f"s3://{store.settings.bucket}/{store.settings.prefix}/{report.name}/{MANIFEST_NAME}"
    directory = partition_prefix(store.settings.prefix, tp)
    try:
        manifest = decode_manifest(data, source=source, read=lambda n: store.get(directory + n))
    except (LogError, ChecksumMismatch) as error:
        report.problems.append(str(error))
        return report
    if manifest.topic_partition != tp:
        report.problems.append(f"the manifest names {manifest.topic_partition}")
        return report
    report.segments = len(manifest.segments)
    present = set(store.list_keys(segments_prefix(store.settings.prefix, tp, manifest.topic_id)))
    named = {directory + chunk_name(manifest.topic_id, c.base_offset) for c in manifest.chunks}
    with tempfile.TemporaryDirectory(prefix="replicad-verify-") as temp:
        for segment in manifest.segments:
            keys = {
                suffix: segment_key(
                    store.settings.prefix, tp, manifest.topic_id, segment.base_offset, suffix
                )
                for suffix in SEGMENT_SUFFIXES
            }
            named.update(keys.values())
            missing = [k for k in keys.values() if k not in present]
            if missing:
                report.problems += [f"{key}: named by the manifest, missing" for key in missing]
                continue
            one = Path(temp) / report.name
            try:
                _download(store, keys, one)
            except ChecksumMismatch as error:
                # An object damaged in the bucket is this segment's problem: the others,
                # and the other partitions, are still checked (one line a partition).
                report.problems.append(str(error))
            else:
                _merge(report, verify_partition(one, in_use=False), segment.base_offset)
                _check_against_manifest(report, one, manifest, segment.base_offset)
            for path in one.iterdir():
                path.unlink()
    unnamed = present - named
    if unnamed:
        # Not a problem: the next upload writes them again (see the module rules).
        report.name += f" [{len(unnamed)} objects no manifest names]"
    return report


def _download(store: ObjectStore, keys: dict[str, str], directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    for key in keys.values():
        store.get_to_file(key, directory / key.rsplit("/", 1)[1])
    return directory


def _merge(report: PartitionReport, one: PartitionReport, base: int) -> None:
    name = segment_file_name(base, LOG_SUFFIX)
    report.problems += [p if p.startswith(name) else f"{name}: {p}" for p in one.problems]
    report.batches += one.batches
    report.gaps += one.gaps
    if one.first_offset is None or one.next_offset is None:
        return
    overlapped = report.advance(one.first_offset, one.next_offset)
    if overlapped is not None:
        report.problems.append(
            f"{name}: offset {one.first_offset} overlaps the previous segment ending at "
            f"{overlapped}"
        )


def _check_against_manifest(
    report: PartitionReport, directory: Path, manifest: Manifest, base: int
) -> None:
    from replicad.log.verify import scan_file

    (segment,) = [s for s in manifest.segments if s.base_offset == base]
    name = segment_file_name(base, LOG_SUFFIX)
    path = directory / name
    size = path.stat().st_size
    if size != segment.size:
        report.problems.append(f"{name}: {size} bytes, the manifest says {segment.size}")
    batches = scan_file(path, verify_crc=False).batches
    if batches and batches[-1].next_offset > segment.next_offset:
        report.problems.append(
            f"{name}: ends at offset {batches[-1].last_offset}, past the manifest's next "
            f"offset {segment.next_offset}"
        )
    peak = max((b.max_timestamp for b in batches), default=NO_TIMESTAMP)
    if peak != segment.max_timestamp and segment.max_timestamp != NO_TIMESTAMP:
        report.problems.append(
            f"{name}: largest timestamp {peak}, the manifest says {segment.max_timestamp}"
        )


def dump_bucket(store: ObjectStore, path: str, *, deep: bool, out: TextIO) -> int:
    """dump-log of `path` under the store's bucket: a partition (`.../<topic>-<n>`, every
    segment its manifest names) or one object (`...<base>.log|.index|.timeindex`)."""
    path = path.strip("/")
    name = path.rsplit("/", 1)[-1]
    problems = 0
    with tempfile.TemporaryDirectory(prefix="replicad-dump-") as temp:
        if parse_partition_dir(name) is not None:
            data = store.get(f"{path}/{MANIFEST_NAME}")
            if data is None:
                print(f"PROBLEM s3://{store.settings.bucket}/{path}: no manifest", file=out)
                return EXIT_PROBLEMS
            manifest = decode_manifest(
                data,
                source=f"s3://{store.settings.bucket}/{path}",
                read=lambda n: store.get(f"{path}/{n}"),
            )
            targets = [
                f"{path}/{manifest.topic_id}/{segment_file_name(s.base_offset, '')}"
                for s in manifest.segments
            ]
        else:
            targets = [path.rsplit(".", 1)[0]] if "." in name else [path]
            if "." not in name:
                print(f"PROBLEM s3://{store.settings.bucket}/{path}: not a partition "
                      "or a .log, .index or .timeindex object", file=out)  # fmt: skip
                return EXIT_PROBLEMS
        for stem in targets:
            local = Path(temp) / stem.rsplit("/", 1)[1]
            for suffix in SEGMENT_SUFFIXES:
                try:
                    store.get_to_file(stem + suffix, local.with_suffix(suffix))
                except FileNotFoundError:
                    pass  # dump_log says what is missing
                except ChecksumMismatch as error:
                    # Damaged in the bucket: said, and dumped as read (its batches' own
                    # CRCs show where), as verify names it and goes on.
                    print(f"PROBLEM {error}", file=out)
                    problems += 1
            wanted = name[len(name.split(".")[0]) :] if "." in name else LOG_SUFFIX
            text = io.StringIO()
            problems += dump_log(local.with_suffix(wanted), deep=deep, out=text)
            print(
                text.getvalue().replace(str(Path(temp)), f"s3://{store.settings.bucket}/"
                                        f"{stem.rsplit('/', 1)[0]}"),
                end="",
                file=out,
            )  # fmt: skip
            for file in Path(temp).iterdir():
                file.unlink()
    return EXIT_PROBLEMS if problems else EXIT_OK
