"""Prometheus metrics from the status snapshot, parsed back with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from replicad.metrics import build_registry, on_loop, start_metrics_server
from tests.status_snapshot import leader_entry, partition_entry, status_snapshot


def snapshot(partitions: int = 2, **extra: Any) -> dict[str, Any]:
    return status_snapshot(
        totals={
            "leaders": 1,
            "partitions": partitions,
            "lag": 1000,
            "bytes_replicated": 123456,
            "bytes_per_s": 1.0e6,
            "crc_failures": 2,
            "session_recoveries": 3,
            "gaps": 2,
            "gap_offsets": 70,
            "damaged_reads": 5,
            "control_abandoned": 3,
            "partitions_by_state": {"fetching": partitions - 1, "halted": 1},
        },
        leaders=[
            leader_entry(
                partitions=partitions,
                last_fetch_latency_ms=2.5,
                errors=4,
                session_recoveries={
                    "fetch_session_id_not_found": 1,
                    "invalid_fetch_session_epoch": 2,
                },
            )
        ],
        partitions=[
            partition_entry(
                f"t{i % 2}",
                i // 2,
                10 * i,
                10 * i + i,
                bytes_replicated=100 * i,
                crc_failures=int(i % 3 == 0),
                gaps=int(i == 3),
                gap_offsets=70 if i == 3 else 0,
                damaged_reads=5 if i == 3 else 0,
            )
            for i in range(partitions)
        ],
        **extra,
    )


def scrape(snap: dict[str, Any], **options: Any) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}, via the text format and its parser."""
    text = generate_latest(build_registry(lambda: snap, **options)).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


LEADER = (("address", "h:9092"), ("leader", "1"))


def test_leader_fetch_metrics() -> None:
    samples = scrape(snapshot())
    assert samples[("replicad_fetch_requests_total", LEADER)] == 100
    assert samples[("replicad_fetch_errors_total", LEADER)] == 4
    assert samples[("replicad_fetch_latency_seconds", LEADER)] == pytest.approx(0.0025)
    assert samples[("replicad_leader_bytes_per_second", LEADER)] == 1.0e6
    assert samples[("replicad_fetch_session_active", LEADER)] == 1
    reason = ("reason", "invalid_fetch_session_epoch")
    key = tuple(sorted((*LEADER, reason)))
    assert samples[("replicad_session_recoveries_total", key)] == 2


def test_per_partition_series() -> None:
    samples = scrape(snapshot(partitions=4))
    t1p1 = (("partition", "1"), ("topic", "t1"))  # i == 3
    assert samples[("replicad_partition_lag", t1p1)] == 3
    assert samples[("replicad_partition_log_end_offset", t1p1)] == 30
    assert samples[("replicad_partition_high_watermark", t1p1)] == 33
    assert samples[("replicad_partition_bytes_replicated_total", t1p1)] == 300
    assert samples[("replicad_partition_crc_failures_total", t1p1)] == 1
    assert samples[("replicad_partition_gap_offsets_total", t1p1)] == 70
    assert samples[("replicad_partition_damaged_reads_total", t1p1)] == 5
    assert not any(name.startswith("replicad_topic_") for name, _ in samples)


def test_totals_and_daemon_state() -> None:
    samples = scrape(snapshot())
    assert samples[("replicad_lag", ())] == 1000
    assert samples[("replicad_bytes_replicated_total", ())] == 123456
    assert samples[("replicad_crc_failures_total", ())] == 2
    assert samples[("replicad_gaps_total", ())] == 2
    assert samples[("replicad_gap_offsets_total", ())] == 70
    assert samples[("replicad_damaged_reads_total", ())] == 5
    # Status requests whose client left before the reply was built (control/server.py).
    assert samples[("replicad_control_requests_abandoned_total", ())] == 3
    assert samples[("replicad_partitions", (("state", "halted"),))] == 1
    assert samples[("replicad_ready", ())] == 1
    assert samples[("replicad_build_info", (("version", "0.1.0"),))] == 1


def test_per_topic_aggregation_keeps_10000_partitions_to_a_few_series() -> None:
    samples = scrape(snapshot(partitions=10_000), per_topic=True)
    assert not any(name.startswith("replicad_partition_") for name, _ in samples)
    lag_t0 = samples[("replicad_topic_lag", (("topic", "t0"),))]
    assert lag_t0 == sum(range(0, 10_000, 2))
    assert samples[("replicad_topic_partitions", (("topic", "t1"),))] == 5000
    crc_t0 = samples[("replicad_topic_crc_failures_total", (("topic", "t0"),))]
    assert crc_t0 == sum(1 for i in range(0, 10_000, 2) if i % 3 == 0)
    assert len(samples) < 100


def test_memory_pool_and_serve_metrics_only_when_present() -> None:
    plain = scrape(snapshot())
    assert not any("memory_pool" in name or "serve_" in name for name, _ in plain)
    samples = scrape(
        snapshot(
            memory_pool={"capacity": 104857600, "used": 5242880, "peak": 73400320, "waits": 4},
            serve={
                "sessions": 3,
                "partitions_cached": 120,
                "evictions_total": 7,
                "groups": {"Empty": 2, "Stable": 1},
                "group_rebalances_total": 4,
                "offset_commits_total": 30,
            },
        )
    )
    assert samples[("replicad_serve_groups", (("state", "Stable"),))] == 1
    assert samples[("replicad_serve_groups", (("state", "Empty"),))] == 2
    assert samples[("replicad_serve_group_rebalances_total", ())] == 4
    assert samples[("replicad_serve_offset_commits_total", ())] == 30
    assert samples[("replicad_memory_pool_capacity_bytes", ())] == 104857600
    assert samples[("replicad_memory_pool_used_bytes", ())] == 5242880
    assert samples[("replicad_memory_pool_peak_bytes", ())] == 73400320
    assert samples[("replicad_memory_pool_waits_total", ())] == 4
    assert samples[("replicad_serve_incremental_fetch_sessions", ())] == 3
    assert samples[("replicad_serve_incremental_fetch_partitions_cached", ())] == 120
    assert samples[("replicad_serve_incremental_fetch_session_evictions_total", ())] == 7
    assert not any("group_sync" in name or "groups_synced" in name for name, _ in samples)


def test_serves_group_sync_metrics_when_it_runs() -> None:
    sync = {
        "groups_synced": 3,
        "groups_failed_over": 1,
        "offsets_synced_total": 40,
        "held_offsets": 2,
        "errors_total": 5,
        "sync_lag_ms": 2500,
    }
    samples = scrape(snapshot(serve={"sessions": 0, "group_sync": sync}))
    assert samples[("replicad_serve_group_sync_lag_seconds", ())] == 2.5
    assert samples[("replicad_serve_groups_synced", ())] == 3
    assert samples[("replicad_serve_groups_failed_over", ())] == 1
    assert samples[("replicad_serve_group_sync_offsets_total", ())] == 40
    assert samples[("replicad_serve_group_held_back_offsets", ())] == 2
    assert samples[("replicad_serve_group_sync_errors_total", ())] == 5


def test_serves_reads_of_the_bucket_only_with_an_archive() -> None:
    assert not any("remote" in name for name, _ in scrape(snapshot(serve={"sessions": 0})))
    remote = {
        "remote_fetches_total": 12,
        "remote_fetch_bytes_total": 4096,
        "remote_fetches_in_flight": 1,
        "remote_cache_bytes": 2048,
        "remote_get_requests_total": 7,
    }
    samples = scrape(snapshot(serve={"sessions": 0, **remote}))
    assert samples[("replicad_serve_remote_fetches_total", ())] == 12
    assert samples[("replicad_serve_remote_fetch_bytes_total", ())] == 4096
    assert samples[("replicad_serve_remote_fetch_errors_total", ())] == 0
    assert samples[("replicad_serve_remote_fetches_in_flight", ())] == 1
    assert samples[("replicad_serve_remote_cache_bytes", ())] == 2048
    assert samples[("replicad_serve_remote_get_requests_total", ())] == 7


async def test_http_endpoint_reads_the_snapshot_on_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    seen_threads: list[int] = []

    def snap() -> dict[str, Any]:
        seen_threads.append(threading.get_ident())
        return snapshot()

    server = start_metrics_server("127.0.0.1", 0, snap)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    finally:
        server.close()
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {"replicad_fetch_requests", "replicad_partition_lag", "process_open_fds"} <= names
    assert seen_threads == [loop_thread]


def test_a_wedged_loop_fails_the_scrape() -> None:
    loop = asyncio.new_event_loop()  # never run: as good as wedged
    try:
        read = on_loop(loop, snapshot, timeout_s=0.2)
        with pytest.raises(TimeoutError):
            read()
    finally:
        loop.close()


def test_http_endpoint_without_a_loop_and_close_frees_the_port() -> None:
    server = start_metrics_server("127.0.0.1", 0, snapshot)
    url = f"http://127.0.0.1:{server.port}/metrics"
    assert b"replicad_lag 1000.0" in urllib.request.urlopen(url, timeout=5).read()
    server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_serve_counts_what_clients_do_wrong_under_fixed_names() -> None:
    samples = scrape(
        snapshot(
            serve={
                "connections": 2,
                "request_pool_used_bytes": 1048576,
                "protocol_errors_total": 5,
                "refused_connections_per_ip_total": 41,
                "requests_total": {"unsupported": 32763},
            }
        )
    )
    assert samples[("replicad_serve_connections", ())] == 2
    assert samples[("replicad_serve_request_pool_used_bytes", ())] == 1048576
    assert samples[("replicad_serve_protocol_errors_total", ())] == 5
    assert samples[("replicad_serve_refused_connections_per_ip_total", ())] == 41
    assert samples[("replicad_serve_frame_timeouts_total", ())] == 0
    # No serve sample carries a label: nothing a client sends becomes one.
    assert all(labels == () for name, labels in samples if name.startswith("replicad_serve_"))


def test_mirror_metrics_only_when_mirroring() -> None:
    assert not any(name.startswith("replicad_mirror") for name, _ in scrape(snapshot()))
    mirror = {
        "produce_requests": 7,
        "produce_errors": 1,
        "bytes_produced": 4096,
        "session_resets": 0,
        "lag": 40,
        "problem": "no destination broker reachable",
        "partitions": [
            {"topic": "t", "partition": 0, "lag": 40, "mirrored_offset": 60,
             "destination_next_offset": 58, "records_mirrored": 58, "gap_offsets": 0,
             "offsets_kept": False, "state": "halted"},
        ],
    }  # fmt: skip
    samples = scrape(snapshot(mirror=mirror))
    t0 = (("partition", "0"), ("topic", "t"))
    assert samples[("replicad_mirror_produce_requests_total", ())] == 7
    assert samples[("replicad_mirror_lag", ())] == 40
    assert samples[("replicad_mirror_destination_unreachable", ())] == 1
    assert samples[("replicad_mirror_partition_lag", t0)] == 40
    assert samples[("replicad_mirror_mirrored_offset", t0)] == 60
    assert samples[("replicad_mirror_records_total", t0)] == 58
    assert samples[("replicad_mirror_offsets_kept", t0)] == 0
    assert samples[("replicad_mirror_halted", t0)] == 1
    per_topic = scrape(snapshot(mirror=mirror), per_topic=True)
    assert ("replicad_mirror_lag", ()) in per_topic
    assert not any(name == "replicad_mirror_partition_lag" for name, _ in per_topic)


def test_archive_metrics_only_when_archiving() -> None:
    assert not any(name.startswith("replicad_archive") for name, _ in scrape(snapshot()))
    archive = {
        "bucket": "s3://replica/east", "uploaded_segments": 12, "uploaded_bytes": 1 << 20,
        "pending_segments": 3, "failures": 2, "retrying_partitions": ["t-0"],
        "last_error": "s3://replica/east/t-0/manifest.json: GET failed: SlowDown",
        "requests": {"PUT": 48, "GET": 1, "LIST": 0},
    }  # fmt: skip
    samples = scrape(snapshot(archive=archive))
    assert samples[("replicad_archive_uploaded_segments_total", ())] == 12
    assert samples[("replicad_archive_uploaded_bytes_total", ())] == 1 << 20
    assert samples[("replicad_archive_pending_segments", ())] == 3
    assert samples[("replicad_archive_upload_failures_total", ())] == 2
    assert samples[("replicad_archive_retrying_partitions", ())] == 1
    assert samples[("replicad_archive_put_requests_total", ())] == 48


def test_group_sync_metrics_only_when_groups_are_synced() -> None:
    mirror = {"produce_requests": 0, "partitions": [], "groups": {"enabled": False}}
    assert not any("group" in name for name, _ in scrape(snapshot(mirror=mirror)))
    mirror["groups"] = {
        "enabled": True, "groups_synced": 2, "groups_failed_over": 1, "sync_lag_ms": 2_500,
        "held_back_offsets": 30, "commits_total": 12, "sync_errors_total": 1,
    }  # fmt: skip
    samples = scrape(snapshot(mirror=mirror))
    assert samples[("replicad_mirror_groups_synced", ())] == 2
    assert samples[("replicad_mirror_groups_failed_over", ())] == 1
    assert samples[("replicad_mirror_group_sync_lag_seconds", ())] == 2.5
    assert samples[("replicad_mirror_group_held_back_offsets", ())] == 30
    assert samples[("replicad_mirror_group_commits_total", ())] == 12
    assert samples[("replicad_mirror_group_sync_errors_total", ())] == 1


def test_verify_metrics_per_partition_and_in_all() -> None:
    verify = {
        "passes": 3,
        "bytes_fetched": 4096,
        "batches_compared": 12,
        "unverified_offsets": 40,
        "mismatches_total": 1,
        "partitions": [
            {"topic": "t", "partition": 0, "verified_offset": 100, "mismatch_count": 0},
            {"topic": "t", "partition": 1, "verified_offset": 60, "mismatch_count": 1},
        ],
    }
    samples = scrape(snapshot(verify=verify))
    t0, t1 = (("partition", "0"), ("topic", "t")), (("partition", "1"), ("topic", "t"))
    assert samples[("replicad_verified_offset", t0)] == 100
    assert samples[("replicad_verified_offset", t1)] == 60
    assert samples[("replicad_verify_partition_mismatches", t1)] == 1
    assert samples[("replicad_verify_mismatches", ())] == 1
    assert samples[("replicad_verify_unverified_offsets", ())] == 40
    assert samples[("replicad_verify_passes_total", ())] == 3
    per_topic = scrape(snapshot(verify=verify), per_topic=True)
    assert ("replicad_verified_offset", t0) not in per_topic
    assert per_topic[("replicad_verify_mismatches", ())] == 1
