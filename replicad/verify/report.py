"""What `replicad verify --against-source` prints: a line a partition and a summary, or JSON.

Exit status: 0 every partition compared clean (ranges the source no longer has, ranges it
does not have yet and batches its log cleaner rewrote are said, not failed); 1 a mismatch;
3 nothing differed but some partition could not be compared to its end (the source did not
answer, or the replica could not be read), as `replicad status` says "unknown".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from replicad.verify.compare import PartitionResult

EXIT_CLEAN = 0
EXIT_MISMATCH = 1
EXIT_UNVERIFIED = 3
# Mismatches printed per partition; the JSON has them all.
_SHOWN = 5


def exit_code(results: Sequence[PartitionResult]) -> int:
    if any(r.mismatches for r in results):
        return EXIT_MISMATCH
    if any(r.unverified is not None for r in results):
        return EXIT_UNVERIFIED
    return EXIT_CLEAN


def partition_line(result: PartitionResult) -> str:
    r = result
    if r.mismatches:
        head = f"{r.tp}: MISMATCH"
    elif r.unverified is not None:
        head = f"{r.tp}: UNVERIFIED"
    else:
        head = f"{r.tp}: ok"
    if r.replica.end <= r.replica.start:
        parts = ["empty replica"]
    elif r.sample is not None:
        parts = [f"{r.batches_compared} of {len(r.sample)} sampled batches compared"]
    else:
        parts = [f"verified up to offset {r.verified_to} (replica {r.replica})"]
        parts.append(f"{r.batches_compared} batches, {r.bytes_compared} bytes identical")
    if r.gone_at_source:
        parts.append(
            "no longer at the source (retention): " + ", ".join(str(g) for g in r.gone_at_source)
        )
    if r.rewritten_at_source:
        parts.append(
            "rewritten by the source's log cleaner, not provable: "
            + ", ".join(str(g) for g in r.rewritten_at_source)
        )
    if r.not_at_source is not None:
        parts.append(f"not at the source yet (past its high watermark): {r.not_at_source}")
    if r.unverified is not None:
        parts.append(f"stopped {r.unverified}")
    line = f"{head} ({'; '.join(parts)})"
    for m in r.mismatches[:_SHOWN]:
        span = str(m.offset) if m.last_offset == m.offset else f"{m.offset}..{m.last_offset}"
        line += f"\n  offset {span}: {m.kind.value}: {m.detail}"
    if len(r.mismatches) > _SHOWN:
        line += f"\n  ... {len(r.mismatches) - _SHOWN} more (--json lists them all)"
    return line


def summary_line(results: Sequence[PartitionResult], *, seed: int | None) -> str:
    mismatches = sum(len(r.mismatches) for r in results)
    unverified = sum(r.unverified is not None for r in results)
    compared = sum(r.batches_compared for r in results)
    text = (
        f"{len(results)} partitions, {compared} batches compared, {mismatches} mismatches, "
        f"{unverified} not compared to the end"
    )
    if seed is not None:
        text += f" (sample seed {seed})"
    return text


def as_json(results: Sequence[PartitionResult], *, seed: int | None) -> dict[str, Any]:
    def ranges(items: Sequence[Any]) -> list[dict[str, int]]:
        return [{"start": g.start, "end": g.end} for g in items]

    return {
        "exit_code": exit_code(results),
        "sample_seed": seed,
        "partitions": [
            {
                "topic": r.tp.topic,
                "partition": r.tp.partition,
                "clean": r.clean,
                "replica": {"start": r.replica.start, "end": r.replica.end},
                "verified_to": r.verified_to,
                "batches_compared": r.batches_compared,
                "bytes_compared": r.bytes_compared,
                "mismatches": [m.as_dict() for m in r.mismatches],
                "gone_at_source": ranges(r.gone_at_source),
                "rewritten_at_source": ranges(r.rewritten_at_source),
                "not_at_source": ranges([r.not_at_source] if r.not_at_source else []),
                "unverified": r.unverified,
                "sample": list(r.sample) if r.sample is not None else None,
            }
            for r in results
        ],
    }


def dumps(results: Sequence[PartitionResult], *, seed: int | None) -> str:
    return json.dumps(as_json(results, seed=seed), indent=2)
