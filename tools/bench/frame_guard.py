"""What the frame guard costs on the follower's hot path: Fetch responses decoded as
`replicad run` decodes them, the guard's walk timed apart from kio's native reader.

Shapes: 10,000 partitions (100 topics x 100) of small records -- the walk is one step per
field, so this is its worst honest case -- and 50 MiB of records, in one partition and in
50, where the walk skips the records by their length and should cost next to nothing.
For scale, one response the guard covers that no Fetch scanner will: Metadata v12 for
10,000 partitions (what `replicad run` reads at start and on every refresh).

    .venv/bin/python -m tools.bench.frame_guard [--repeat 20] [--versions 12,17]

Prints a markdown table: the best of `--repeat` runs of each (other processes on the
machine add to every figure, never take away).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Sequence

from kio.serial import entity_reader

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, response_type
from replicad.protocol.frame_guard import check_message
from tools.chaos.wire_data import (
    BrokerEntry,
    PartitionAnswer,
    fetch_response_body,
    metadata_response_body,
)

MIB = 1 << 20


def shapes() -> dict[str, list[PartitionAnswer]]:
    topic_id = uuid.uuid4()

    def answer(topic: str, partition: int, size: int) -> PartitionAnswer:
        return PartitionAnswer(topic, partition, b"r" * size, high_watermark=1, topic_id=topic_id)

    return {
        "10,000 partitions x 200 B": [answer(f"t{i // 100}", i % 100, 200) for i in range(10_000)],
        "10,000 partitions x 20 B": [answer(f"t{i // 100}", i % 100, 20) for i in range(10_000)],
        "1 partition x 50 MiB": [answer("t", 0, 50 * MIB)],
        "50 partitions x 1 MiB": [answer("t", p, MIB) for p in range(50)],
    }


def best_ms(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def measure(version: int, label: str, partitions: Sequence[PartitionAnswer], repeat: int) -> str:
    frame = fetch_response_body(version, partitions)
    return row(f"Fetch v{version}", label, response_type(ApiKey.FETCH, version), frame, repeat)


def row(api: str, label: str, cls: type, frame: bytes, repeat: int) -> str:
    header_cls = cls.__header_schema__
    read_header, read_body = entity_reader(header_cls), entity_reader(cls)
    assert check_message(frame, header_cls, cls).complete

    def kio_only() -> None:
        _, used = read_header(frame, 0)
        read_body(frame, used)

    guard = best_ms(lambda: check_message(frame, header_cls, cls), repeat)
    kio = best_ms(kio_only, repeat)
    full = best_ms(lambda: decode_response(frame, cls), repeat)
    return (
        f"| {api} | {label} | {len(frame) / MIB:.1f} | {guard:.2f} | {kio:.2f} | "
        f"{full:.2f} | {100 * guard / full:.0f}% |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--versions", default="12,17")
    args = parser.parse_args()
    print("| API | response | MiB | guard ms | kio read ms | decode_response ms | guard share |")
    print("|---|---|---|---|---|---|---|")
    for version in (int(v) for v in args.versions.split(",")):
        for label, partitions in shapes().items():
            print(measure(version, label, partitions, args.repeat), flush=True)
    brokers = [BrokerEntry(n, "127.0.0.1", 9092 + n) for n in range(3)]
    metadata = metadata_response_body(12, brokers, [(f"t{i}", 100) for i in range(100)])
    cls = response_type(ApiKey.METADATA, 12)
    print(row("Metadata v12", "100 topics x 100 partitions", cls, metadata, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
