"""The mirror shell's own parts that need no destination: how the sends the cores hand
out become Produce requests, how it performs its metadata chore (the shell as a whole runs
against Kafka in
test_mirror_kafka.py, its decisions in test_partition_mirror.py and tools/sim)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

from replicad.errors import KafkaConnectionError, LeaderNotKnownError
from replicad.mirror.partition_mirror import LogEntry, Send
from replicad.mirror.restamp import ProducerStamp
from replicad.mirror.shell import failure_event, lane_of, pack_requests, send_bytes
from replicad.records.batch import BatchHeader
from replicad.types import TopicPartition

A, B = TopicPartition("a", 0), TopicPartition("b", 1)
STAMP_OF_TEST = ProducerStamp(7, 0)


def send(base: int, size: int = 100) -> Send:
    header = BatchHeader(0, base, 100, 0, 2, 0, 0, 0, 0, 0, -1, 0, 0, 1)
    return Send(LogEntry(header, None, b"x" * size), ProducerStamp(1, 0), base, base, 0)


def test_one_batch_per_partition_per_request_in_order() -> None:
    sends = [(A, send(0)), (A, send(1)), (B, send(0)), (A, send(2)), (B, send(1))]
    requests = pack_requests(sends, request_bytes=1 << 20)
    assert [[(tp, s.base_sequence) for tp, s in r] for r in requests] == [
        [(A, 0), (B, 0)],
        [(A, 1), (B, 1)],
        [(A, 2)],
    ]


def test_a_request_holds_at_most_its_bytes_but_always_one_batch() -> None:
    sends = [(A, send(0, 700)), (B, send(0, 700)), (TopicPartition("c", 0), send(0, 2000))]
    requests = pack_requests(sends, request_bytes=1000)
    assert [len(r) for r in requests] == [1, 1, 1]
    assert sum(len(r) for r in pack_requests(sends, request_bytes=1400)) == 3


def test_a_coalesced_run_counts_every_batch_of_the_run_toward_the_request_bytes() -> None:
    """A run coalesced into one batch sends the records of all its batches: counted by its
    first batch alone (session 18's mirror note), two runs of 1.2 MB went in one request of
    a 1 MiB bound."""

    def run(tp_base: int) -> Send:
        first, *more = (send(tp_base + i, 400_000).entry for i in range(3))
        return replace(send(tp_base, 0), entry=first, more=tuple(more))

    requests = pack_requests([(A, run(0)), (B, run(0))], request_bytes=1 << 20)
    assert [len(r) for r in requests] == [1, 1]
    unread = LogEntry(send(0).entry.header, None, None)  # bytes to be read again
    assert send_bytes(replace(send(0, 0), entry=unread)) == 12 + 100  # its stored length


def test_a_leader_not_known_yet_is_not_called_an_unreachable_destination() -> None:
    key, event = failure_event(LeaderNotKnownError("no leader known yet for plain-1"))
    assert key == "no-leader"
    assert "unreachable" not in event and "no leader known yet" in event
    assert failure_event(KafkaConnectionError("connection refused")) == (
        "unreachable",
        "destination unreachable, retrying",
    )


def test_the_settings_come_from_the_mirror_section_with_the_config_models_defaults():
    from replicad.config import config_from_mapping
    from replicad.mirror.shell import MirrorSettings
    from replicad.protocol.client import ClientSettings

    required = {"source": {"bootstrap_servers": ["k:9092"]}, "topics": {"include": ["t"]}}
    plain = config_from_mapping({**required, "mirror": {"bootstrap_servers": ["d:9092"]}})
    settings = MirrorSettings.from_config(plain)
    by_hand = MirrorSettings(("d:9092",), settings.client, plain.data_dir)
    assert settings == by_hand
    tuned = config_from_mapping(
        {
            **required,
            "mirror": {
                "bootstrap_servers": ["d:9092"],
                "topic_prefix": "src.",
                "produce_timeout_ms": 7_000,
                "reconnect_backoff_ms": 7,
                "reconnect_backoff_max_ms": 700,
                "max_in_flight": 2,
                "retention_waits": False,
                "connections_per_broker": 2,
                "coalesce_bytes": 0,
            },
        }
    )
    settings = MirrorSettings.from_config(tuned)
    assert (settings.topic_prefix, settings.produce_timeout_ms) == ("src.", 7_000)
    assert (settings.retry_backoff_ms, settings.retry_backoff_max_ms) == (7, 700)
    assert (settings.max_in_flight, settings.retention_waits) == (2, False)
    assert (settings.connections_per_broker, settings.coalesce_bytes) == (2, 0)
    assert settings.client == ClientSettings.from_config(tuned.mirror)


def test_a_partition_always_takes_the_same_lane_and_partitions_spread_over_them() -> None:
    tps = [TopicPartition(t, p) for t in ("orders", "payments") for p in range(8)]
    assert {lane_of(tp, 1) for tp in tps} == {0}
    lanes = [lane_of(tp, 4) for tp in tps]
    # The same in another process whose string hashes differ: a restarted mirror puts a
    # partition on the lane it had (Python's hash() of a topic name would not).
    code = (
        "from replicad.mirror.shell import lane_of; from replicad.types import TopicPartition;"
        "print([lane_of(TopicPartition(t, p), 4) for t in ('orders', 'payments') "
        "for p in range(8)])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert other.stdout.strip() == str(lanes)
    assert set(lanes) == {0, 1, 2, 3}
    # One topic's consecutive partitions take every lane in turn.
    assert {lane_of(TopicPartition("orders", p), 4) for p in range(4)} == {0, 1, 2, 3}


def test_a_decompression_bomb_is_produced_as_stored_in_bounded_memory(tmp_path) -> None:
    """Small zstd batches of 4 MiB of zeros each (a few hundred bytes stored) among tiny
    ones: reading and coalescing hold at most a run's bound of decompressed bytes (the
    bombs are never decompressed in full, and go as stored), and every record reaches the
    destination's batches as the source holds it."""
    import tracemalloc

    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.mirror.coalesce import RunCut, run_plain_bytes
    from replicad.mirror.partition_mirror import MirrorTiming, PartitionMirror
    from replicad.mirror.shell import coalesced_runs, produced_batch, read_entries
    from replicad.records.batch import Compression, scan_batches
    from replicad.records.records import decode_batch
    from tools.logdata.batches import producer_batch

    bomb_bytes, bombs = 4 << 20, 12
    plog = PartitionLog.create(tmp_path / "t-0", A, LogConfig(), now_ms=0)
    source = []
    for i in range(3 * bombs):
        base = plog.log_end_offset
        value = bytes(bomb_bytes) if i % 3 == 1 else b"tiny %d " % i * 30
        batch = producer_batch(base, [value], codec=Compression.ZSTD, keys=[b"k%d" % i])
        assert len(batch) < 1024  # small: a candidate for coalescing
        assert scan_batches(batch).batches[0].attributes & 7 == Compression.ZSTD  # joins
        plog.append(batch, scan_batches(batch).batches, now_ms=0)
        source.append((b"k%d" % i, value))
    plog.high_watermark = plog.log_end_offset
    coalesce_bytes = 256 * 1024
    timing = MirrorTiming(coalesce_bytes=coalesce_bytes, first_batch_alone=False)
    core = PartitionMirror(position=0, timing=timing)
    assert core.log_end_wanted(0) and core.on_log_end(STAMP_OF_TEST, 0, 0, 0).done
    core.first_progress_saved()
    produced: list[bytes] = []
    cuts = 0
    tracemalloc.start()
    try:
        while core.scanned_to < plog.high_watermark:
            core.feed(read_entries(plog, core.scanned_to, plog.high_watermark, 1 << 20, True))
        while (send := core.next_send(0, STAMP_OF_TEST)) is not None:
            made = (
                coalesced_runs([send], run_plain_bytes(coalesce_bytes))[send] if send.more else None
            )
            if isinstance(made, RunCut):
                core.run_cut(send, made.joined)  # as the shell does: cut at the bomb
                cuts += 1
                continue
            produced.append(b"".join(produced_batch(send, made)))
            core.acked(send, -1, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    plog.close()
    # Unbounded, one bomb alone would have taken 4 MiB, the twelve 48 MiB.
    assert peak < 2 * run_plain_bytes(coalesce_bytes) + (1 << 20), peak
    assert core.position == plog.high_watermark
    got = []
    for batch in produced:
        (h,) = scan_batches(batch).batches
        records = decode_batch(batch, h).records
        if any(len(r.value or b"") == bomb_bytes for r in records):
            assert h.record_count == 1  # a bomb went alone, as stored
        got.extend((r.key, r.value) for r in records)
    assert got == source
    assert len(produced) < len(source)  # the tiny ones between bombs were still coalesced
    assert cuts >= bombs  # each bomb cut a run (and went alone, as stored)


async def test_metadata_asked_by_many_partitions_is_one_refresh_and_a_failed_one_goes_again(
    tmp_path,
) -> None:
    """The shell performs what its metadata chore (chore.py) decides: asks made before and
    during a refresh are one refresh; a failed refresh goes again after the back-off, with
    nobody asking; the chore is idle once one succeeds."""
    import asyncio
    from types import SimpleNamespace

    from replicad.mirror.chore import ChorePhase
    from replicad.mirror.partition_mirror import PartitionMirror
    from replicad.mirror.shell import Mirror, MirrorSettings
    from replicad.protocol.client import ClientSettings
    from tools.wait import until

    settings = MirrorSettings(
        bootstrap_servers=("127.0.0.1:9",),
        client=ClientSettings(),
        data_dir=tmp_path,
        retry_backoff_ms=20,
        retry_backoff_max_ms=40,
    )
    mirror = Mirror(settings, SimpleNamespace(client=None, logs=None))  # type: ignore[arg-type]
    mirror.cores = {A: PartitionMirror(position=0)}
    asked: list[list[str]] = []
    first_answer = asyncio.Event()

    async def metadata(topics: list[str]) -> object:
        asked.append(topics)
        if len(asked) == 1:
            await first_answer.wait()
            raise KafkaConnectionError("destination down")
        return mirror.dest_cluster

    mirror.client.metadata = metadata  # type: ignore[method-assign]
    stop = asyncio.Event()
    driver = asyncio.create_task(mirror._drive(stop))
    try:
        for _ in range(3):
            mirror._refresh_soon()
        await until(lambda: len(asked) == 1, what="a first refresh")
        mirror._refresh_soon()  # while it runs: folded into it
        assert mirror._metadata.phase is ChorePhase.RUNNING
        first_answer.set()
        await until(lambda: len(asked) == 2, what="a second refresh")
        await until(lambda: mirror._metadata.phase is ChorePhase.IDLE, what="the chore idle")
        assert asked == [["a"], ["a"]] and mirror._metadata.failures == 0
    finally:
        stop.set()
        await driver
        await mirror.client.close()


def test_the_status_loops_snapshot_holds_only_halted_rows_and_the_same_totals_and_health(
    tmp_path,
) -> None:
    """Every 2 s the status loop reads the mirror's health, which names halted partitions
    only: it gets their rows alone, the same lag and the same health as the full snapshot
    (`replicad status` and metrics still get every row)."""
    from types import SimpleNamespace

    from replicad.control.health import assess
    from replicad.mirror.partition_mirror import PartitionMirror
    from replicad.mirror.shell import Mirror, MirrorSettings
    from replicad.protocol.client import ClientSettings

    settings = MirrorSettings(
        bootstrap_servers=("127.0.0.1:9",), client=ClientSettings(), data_dir=tmp_path
    )
    mirror = Mirror(settings, SimpleNamespace(client=None, logs=None))  # type: ignore[arg-type]
    for p in range(5):
        tp = TopicPartition("orders", p)
        mirror.cores[tp] = PartitionMirror(position=10 * p)
        mirror._logs[tp] = SimpleNamespace(high_watermark=100, log_end_offset=120)  # type: ignore[assignment]
    mirror.cores[TopicPartition("orders", 3)].halt("destination refused the batch")
    full = mirror.snapshot()
    light = mirror.snapshot(problems_only=True)
    assert [row["partition"] for row in light["partitions"]] == [3]
    assert light["partitions"] == [row for row in full["partitions"] if row["partition"] == 3]
    assert light["lag"] == full["lag"] == sum(100 - 10 * p for p in range(5))
    assert {k: v for k, v in light.items() if k != "partitions"} == {
        k: v for k, v in full.items() if k != "partitions"
    }
    health = [assess({"ready": True, "mirror": snap}).as_dict() for snap in (full, light)]
    assert health[0] == health[1] and "mirror_halted" in str(health[0])


async def test_runs_are_coalesced_on_the_loop_a_run_at_a_time_and_a_rewound_one_is_not(
    tmp_path, monkeypatch
) -> None:
    """The send loop coalesces each run in the event loop's own thread (the work holds the
    GIL either way: a worker thread only fought the loop for it), one run at a time with a
    turn of the loop between runs, and a run rewound before its turn is not coalesced."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from replicad.mirror import shell
    from replicad.mirror.coalesce import run_plain_bytes
    from replicad.mirror.partition_mirror import Failure, MirrorTiming, PartitionMirror
    from replicad.mirror.shell import Mirror, MirrorSettings
    from replicad.protocol.client import ClientSettings
    from replicad.records.batch import Compression, scan_batches
    from tools.logdata.batches import producer_batch

    settings = MirrorSettings(
        bootstrap_servers=("127.0.0.1:9",),
        client=ClientSettings(),
        data_dir=tmp_path,
        coalesce_bytes=4096,
    )
    mirror = Mirror(settings, SimpleNamespace(client=None, logs=None))  # type: ignore[arg-type]
    timing = MirrorTiming(coalesce_bytes=4096, coalesce_records=2, first_batch_alone=False)
    sends = []
    for tp in (A, B, TopicPartition("c", 0)):
        core = PartitionMirror(position=0, timing=timing)
        assert core.log_end_wanted(0) and core.on_log_end(STAMP_OF_TEST, 0, 0, 0).done
        core.first_progress_saved()
        batches = [producer_batch(i, [b"v%d" % i], codec=Compression.LZ4) for i in range(2)]
        core.feed(LogEntry(scan_batches(b).batches[0], None, memoryview(b)) for b in batches)
        send = core.next_send(0, STAMP_OF_TEST)
        assert send is not None and len(send.entries) == 2
        mirror.cores[tp] = core
        sends.append((tp, send))
    rewound = sends[2]
    mirror.cores[rewound[0]].failed(rewound[1], Failure.RETRY, 0)
    threads: list[int] = []
    between: list[str] = []
    coalesced_run = shell.coalesced_run

    def on_this_thread(send: Send, plain_limit: int, reader: object = None) -> object:
        threads.append(threading.get_ident())
        between.append("run")
        return coalesced_run(send, plain_limit, reader)  # type: ignore[arg-type]

    async def other_task() -> None:
        between.append("other")

    monkeypatch.setattr(shell, "coalesced_run", on_this_thread)
    task = asyncio.create_task(other_task())
    made = await mirror._coalesce(sends)
    await task
    assert threads == [threading.get_ident()] * 2  # this loop's thread, the rewound one not
    assert between == ["run", "other", "run"]
    expected = shell.coalesced_runs([s for _, s in sends[:2]], run_plain_bytes(4096))
    assert made == expected and rewound[1] not in made
    await mirror.client.close()


async def test_a_timer_due_before_the_driver_waits_leaves_no_wait_unawaited(
    tmp_path, monkeypatch
) -> None:
    """Under load a core's timer can be due by the time the driver computes how long to
    wait (a negative timeout): the driver then goes round again without leaving a
    coroutine it made un-awaited (asyncio.wait_for with a past timeout cancelled its task
    before it started: "coroutine 'Event.wait' was never awaited"), and `stop` still ends
    it."""
    import asyncio
    import gc
    import heapq
    import itertools
    import warnings
    from types import SimpleNamespace

    from replicad.mirror import shell
    from replicad.mirror.shell import Mirror, MirrorSettings
    from replicad.protocol.client import ClientSettings
    from tools.wait import until

    clock = itertools.count(0, 10)  # each reading 10 ms after the one before
    monkeypatch.setattr(shell, "_now_ms", lambda: next(clock))
    settings = MirrorSettings(
        bootstrap_servers=("127.0.0.1:9",), client=ClientSettings(), data_dir=tmp_path
    )
    mirror = Mirror(settings, SimpleNamespace(client=None, logs=None))  # type: ignore[arg-type]
    # Not due when the driver's turn starts (at 0), due when it computes its wait (at 10).
    heapq.heappush(mirror._timers, (5, A))
    stop = asyncio.Event()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        driver = asyncio.create_task(mirror._drive(stop))
        await until(lambda: not mirror._timers, what="the timer taken by a second turn")
        stop.set()
        await asyncio.wait_for(driver, 60)
        gc.collect()
    await mirror.client.close()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
