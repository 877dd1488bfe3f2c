"""tools/bench/spark_stream_cost.py: its synthetic replica, and a stream's time split by its
query progress. The queries run from the tool (`python -m tools.bench.spark_stream_cost`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.log.checkpoint import parse_offsets
from replicad.log.config import LogConfig
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.bench.spark_stream_cost import RECORDS_PER_BATCH, stream_phases, write_replica


def test_the_replica_holds_the_records_its_high_watermarks_say(tmp_path: Path):
    rows = write_replica(tmp_path, partitions=2, mb=0.8)
    assert rows == 2 * 400  # whole producer batches per partition
    checkpoint = (tmp_path / "replication-offset-checkpoint").read_text()
    ends = parse_offsets(checkpoint, source="test")
    assert ends == {TopicPartition("cost", 0): 400, TopicPartition("cost", 1): 400}
    for p in (0, 1):
        (segment,) = (tmp_path / f"cost-{p}").glob("*.log")
        batches = scan_batches(segment.read_bytes()).batches
        assert [b.base_offset for b in batches] == list(range(0, 400, RECORDS_PER_BATCH))
        assert batches[-1].last_offset == 399
        (index,) = (tmp_path / f"cost-{p}").glob("*.index")
        assert index.stat().st_size == LogConfig().segment_index_bytes  # as while active


def test_a_streams_time_is_split_before_in_and_after_its_micro_batches():
    progress = [
        {
            "timestamp": "2026-11-26T21:00:01.500Z",
            "durationMs": {"latestOffset": 100, "addBatch": 800, "triggerExecution": 1000},
        },
        {
            "timestamp": "2026-11-26T21:00:02.500Z",
            "durationMs": {"latestOffset": 10, "triggerExecution": 20},
        },
    ]
    started_ms = 1_795_726_800_000.0  # 2026-11-26T21:00:00Z
    phases = stream_phases(progress, started_ms, started_ms + 3_000)
    assert phases["start"] == pytest.approx(1.5)
    assert phases["addBatch"] == pytest.approx(0.8)
    assert phases["latestOffset"] == pytest.approx(0.11)
    assert phases["triggerExecution"] == pytest.approx(1.02)
    assert phases["stop"] == pytest.approx(3.0 - 2.52)


def test_a_processs_own_cpu_leaves_out_the_children_it_reaped():
    """The JVM's own threads apart from its Python workers: a reaped child's CPU is in the
    tree's count (cutime) and not in the process's own."""
    import os
    import subprocess
    import sys

    from tools.bench.measure import tree_cpu_seconds
    from tools.bench.spark_stream_cost import own_cpu_seconds

    before_own, before_tree = own_cpu_seconds(os.getpid()), tree_cpu_seconds(os.getpid())
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # waited for: reaped
    own = own_cpu_seconds(os.getpid()) - before_own
    tree = tree_cpu_seconds(os.getpid()) - before_tree
    # timing-ok: CPU the kernel counted for a reaped child (it burnt 0.3 s; ticks round), not
    # a duration waited for or a speed
    assert tree - own >= 0.25


def test_a_thread_that_ends_during_a_read_is_counted_under_its_name():
    """A stream's execution thread ends with its query: the sampler keeps what it last saw
    of each thread, by name with digits as #."""
    import ctypes
    import os
    import threading
    import time

    from tools.bench.spark_stream_cost import ThreadSampler
    from tools.wait import wait_until

    seen = threading.Event()

    def burn() -> None:
        ctypes.CDLL(None).prctl(15, b"burner 12", 0, 0, 0)  # PR_SET_NAME, as the JVM names
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        seen.wait(60)  # ends only once a poll has seen what it burnt

    sampler = ThreadSampler(os.getpid(), every_s=0.02)
    thread = threading.Thread(target=burn)
    thread.start()
    # On a loaded machine the polling thread may not run between the burner's last tick and
    # its end (the suite's run saw 0.15 of 0.3 s): the thread ends after a poll saw it burn.
    # timing-ok: CPU seconds the kernel counted, not a duration waited for
    wait_until(
        lambda: any(
            n.startswith("burner") and cpu >= 0.25 for n, cpu in list(sampler.last.values())
        ),
        what="a poll that saw the burner's CPU",
    )
    seen.set()
    thread.join()
    spent = dict(part.rsplit(" ", 1) for part in sampler.stop().split(", "))
    # timing-ok: CPU the kernel counted for a thread that burnt 0.3 s (the last poll may
    # miss up to 0.02 s of it; ticks round), not a duration waited for or a speed
    assert float(spent["burner #"]) >= 0.2


def test_python_is_split_by_process_with_what_the_jvm_and_the_forkserver_reaped_apart():
    from tools.bench.spark_cpu import Spent
    from tools.bench.spark_stream_cost import python_by_process

    python = b"/v/bin/python\0"
    spent = [
        Spent(10, b"java\0", own=5.0, reaped=0.25),  # the JVM: a stand-in it reaped
        Spent(20, python + b"-m\0replicad.spark.forkserver\0/s\0" + b"1\0", own=0.01, reaped=0.5),
        Spent(21, python + b"-m\0replicad.spark.forkserver\0/s\0" + b"1\0", own=0.125, reaped=0),
        Spent(30, python + b"-m\0pyspark.daemon\0pyspark.worker\0", own=0.75, reaped=0),
        Spent(31, python + b"-m\0pyspark.daemon\0pyspark.worker\0", own=0.5, reaped=0),
    ]
    assert python_by_process(spent, jvm=10, servers=[20]) == (
        "pyspark.daemon pyspark.worker 1.250, forkserver's forks, reaped 0.500, "
        "reaped by the JVM 0.250, forkserver's forks, live 0.125, forkserver 0.010"
    )
