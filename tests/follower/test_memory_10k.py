"""Issue 9's memory target, end to end: `replicad run` replicating partitions that all
lag, led by 3 real Kafka nodes, under a small `fetch.buffer_memory` and a low
RLIMIT_NOFILE.

The scenario and its measurements live in tools/bench/memory.py (which prints the
same figures as a table); it runs once per module and each test asserts one part:
- every partition is replicated to the source's end offset, from 3 leaders, each over
  an incremental fetch session;
- the memory pool's high-water mark never passed its capacity, and the pool bound:
  responses waited for room (each of the 3 leaders alone may answer with nearly a
  whole pool's worth);
- segment-file descriptors, sampled, stay within `log.max_open_files` (plus the
  slack log/handles.py documents), and the open-file limit was never hit;
- peak RSS (the kernel's VmHWM of the daemon, exact) <= buffer.memory + 64 MiB, the
  target, plus the gap not closed yet (NOT_YET_MET_BY below; issue 32).

The partition count is `REPLICAD_MEMORY_PARTITIONS`: 1,000 in the suite, where every
bound above still binds (the same 128 MiB of data, nearly 4 pools' worth, each leader's
share over a pool's worth; 3,000 segment files against a cap of 256); 2,000, the count
until session 12, bound nothing more and took longer to set up. The issue's figure is
10,000 (`REPLICAD_MEMORY_PARTITIONS=10000`, 2-4 minutes on 2 cores, most of it Kafka
creating the partitions), run by `python -m tools.bench.memory`, which prints the same
figures as a table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.bench.memory import KIB, MIB, RSS_HEADROOM, SHM, MemoryRun, Scenario, run
from tools.peers.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = int(os.environ.get("REPLICAD_MEMORY_PARTITIONS", "1000"))
TOPICS = 4 if PARTITIONS % 4 == 0 else 3
LEADERS = 3
SCENARIO = Scenario(
    partitions=PARTITIONS,
    topics=TOPICS,
    # At least 3 pools' worth in total, so that the pool has to bind at any count.
    bytes_per_partition=max(32 * KIB, 4 * 32 * MIB // PARTITIONS // (4 * KIB) * (4 * KIB)),
    buffer_memory=32 * MIB,
    max_open_files=256,
    nofile_limit=1024,
)
# log/handles.py: a sync fsyncs a duplicate descriptor, and an open while every cached
# handle is pinned goes over the cap by one; both outside the LRU's count.
HANDLE_SLACK = 2
# What the daemon logs when the descriptor LRU runs into RLIMIT_NOFILE (log/handles.py).
EMFILE_FALLBACK = "open file limit reached below log.max_open_files"


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemoryRun, str, Counter]]:
    """One run of the scenario: its figures, the daemon's log, and who leads what."""
    # tmpfs: Kafka and replicad create a directory per partition, thousands; on a real
    # disk their fsyncs alone take minutes (disk speed is tools/bench/replicate's business).
    tmp = tmp_path_factory.mktemp("memory")
    base = Path(tempfile.mkdtemp(prefix="replicad-mem-", dir=SHM)) if SHM.is_dir() else tmp
    try:
        with KafkaCluster(base / "kafka", nodes=LEADERS) as cluster:
            result = run(cluster, base, SCENARIO)
            led = Counter(
                node for i in range(TOPICS) for node in cluster.leaders(f"mem-{i}").values()
            )
        print(figures(result))  # shown with -s, and with any failure
        yield result, (base / "replicad.log").read_text(errors="replace"), led
    finally:
        shutil.rmtree(base, ignore_errors=True)


def figures(result: MemoryRun) -> str:
    return (
        f"{result.scenario.partitions:,} partitions: peak RSS {result.peak_rss / MIB:.1f} MiB "
        f"(before the status reply {result.peak_rss_replicating / MIB:.1f}, RSS when caught up "
        f"{result.rss_at_end / MIB:.1f}), pool peak {result.pool_peak / MIB:.1f} "
        f"of {result.pool_capacity / MIB:.0f} MiB, waits {result.pool_waits}, {result.fds}, "
        f"leaders {result.leaders}"
    )


def test_every_lagging_partition_is_replicated_from_3_leaders_over_sessions(measured) -> None:
    result, _, led = measured
    assert result.mismatched == (), f"{len(result.mismatched)} partitions differ"
    assert result.source_bytes >= 3 * SCENARIO.buffer_memory  # far more than the pool
    assert len(result.leaders) == LEADERS, figures(result)
    assert result.sessionful_leaders == LEADERS, figures(result)
    # Each leader was fetched from for exactly the partitions it leads.
    assert result.leaders == dict(led), figures(result)
    assert sum(result.leaders.values()) == PARTITIONS


def test_memory_pool_bound_is_never_exceeded_and_binds(measured) -> None:
    result, _, _ = measured
    assert result.pool_capacity == SCENARIO.buffer_memory
    assert 0 < result.pool_peak <= result.pool_capacity, figures(result)
    # Three leaders each answering with nearly a pool's worth: some had to wait.
    assert result.pool_waits > 0, figures(result)


def test_open_segment_files_stay_within_log_max_open_files(measured) -> None:
    result, output, _ = measured
    assert result.fds.samples > 10, figures(result)
    # 3 files a partition, thousands of partitions: the LRU was full and held its cap.
    assert result.fds.max_segment_files >= SCENARIO.max_open_files, figures(result)
    assert result.fds.max_segment_files <= SCENARIO.max_open_files + HANDLE_SLACK
    assert result.fds.max_open < SCENARIO.nofile_limit
    assert EMFILE_FALLBACK not in output


# Issue 32's target is buffer.memory + 64 MiB at 10,000 partitions; not met yet. What the
# suite's run holds today, and must keep holding, is this much above it. Measured at 2,000
# partitions, the suite's count until session 12 (1,000 now: about 2.6 MB fewer partition
# objects under the same pool), by tools/bench/memory.py in one lead's runs of 2026-11-26:
# VmHWM 90.1 to 102.0 MiB against the 96 MiB target, so a strict xfail flipped from run to
# run (the last stop's CI failed on an XPASS). The spread is a transient of pool buffers
# alive past the pool's count (tracemalloc at the peak: 43 MiB of pool-lent bytearrays
# against a 32 MiB pool), not steady state: RSS when caught up was 69.1-70.4 MiB in every
# run.
NOT_YET_MET_BY = 8 * MIB
# From this many partitions on, the bound itself is asserted, without the slack. At
# 10,000 it holds since session 16 (VmHWM 93.9 MiB against 96, load 18-23, 8313202's slimmer
# log store: about 57 MiB before the first response, the 32 MiB pool lent at once, ~4.7 MiB
# of heap while catching up); session 15 missed it by 0.9 (96.9 MiB, load 14-19).
OVER_SLACK_FROM = 5_000


def test_peak_rss_is_within_buffer_memory_plus_64_mib_and_the_known_gap(measured) -> None:
    result, _, _ = measured
    slack = NOT_YET_MET_BY if PARTITIONS < OVER_SLACK_FROM else 0
    assert result.peak_rss <= SCENARIO.buffer_memory + RSS_HEADROOM + slack, figures(result)
