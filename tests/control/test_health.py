"""The health model: each state, its reasons and its exit code, from snapshots."""

from __future__ import annotations

from typing import Any

from replicad.control.health import (
    EXIT_DEGRADED,
    EXIT_DOWN,
    EXIT_HEALTHY,
    STALL_AFTER_MS,
    Health,
    assess,
)


def partition(name: str, number: int, **fields: Any) -> dict[str, Any]:
    return {
        "topic": name,
        "partition": number,
        "leader": 1,
        "lag": 0,
        "state": "fetching",
        "idle_ms": 0,
        **fields,
    }


def snapshot(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "ready": True,
        "source_problem": None,
        "missing_topics": [],
        "partitions": [partition("orders", 0), partition("orders", 1)],
        "leaders": [{"node_id": 1, "address": "h:9092", "connected": True}],
        "memory_pool": {"capacity": 100, "used": 0, "waiting": 0},
    }
    base.update(fields)
    return base


def test_a_daemon_replicating_everything_is_healthy() -> None:
    verdict = assess(snapshot())
    assert verdict.health is Health.HEALTHY and verdict.reasons == ()
    assert verdict.health.exit_code == EXIT_HEALTHY
    assert verdict.headline() == "HEALTHY"


def test_an_unreachable_source_is_down_with_its_error_and_since_when() -> None:
    problem = {
        "kind": "unreachable",
        "error": "no broker reachable: cannot connect to localhost:9",
        "since_s_ago": 75.0,
    }
    verdict = assess(snapshot(ready=False, partitions=[], leaders=[], source_problem=problem))
    assert verdict.health is Health.DOWN and verdict.health.exit_code == EXIT_DOWN
    assert [r.code for r in verdict.reasons] == ["source_unreachable"]  # not also "starting"
    assert "localhost:9" in verdict.reasons[0].text and "75 s" in verdict.reasons[0].text


def test_a_source_that_refuses_our_credentials_is_down() -> None:
    problem = {"kind": "refused", "error": "SASL authentication failed", "since_s_ago": 3}
    verdict = assess(snapshot(source_problem=problem))
    assert verdict.health is Health.DOWN
    assert verdict.reasons[0].code == "source_refused"


def test_a_missing_topic_is_named_and_degrades_while_others_replicate() -> None:
    verdict = assess(snapshot(missing_topics=["ordrs"]))
    assert verdict.health is Health.DEGRADED and verdict.health.exit_code == EXIT_DEGRADED
    assert verdict.reasons[0].code == "topic_missing"
    assert "'ordrs'" in verdict.reasons[0].text


def test_only_missing_topics_is_down() -> None:
    verdict = assess(snapshot(missing_topics=["ordrs", "paymnts"], partitions=[]))
    assert verdict.health is Health.DOWN
    assert "'ordrs', 'paymnts'" in verdict.reasons[0].text


def test_partitions_offline_halted_diverging_and_stalled_are_each_a_reason() -> None:
    parts = [
        partition("t", 0, leader=-1),
        partition("t", 1, state="halted"),
        partition("t", 2, state="truncating"),
        partition("t", 3, lag=10, idle_ms=STALL_AFTER_MS),
        partition("t", 4, lag=10, idle_ms=STALL_AFTER_MS - 1),  # lagging, still moving
        partition("t", 5, lag=0, idle_ms=10 * STALL_AFTER_MS),  # idle but caught up
    ]
    verdict = assess(snapshot(partitions=parts))
    assert verdict.health is Health.DEGRADED
    by_code = {r.code: r.text for r in verdict.reasons}
    assert set(by_code) == {
        "partitions_offline",
        "partitions_halted",
        "partitions_diverging",
        "partitions_stalled",
    }
    assert by_code["partitions_offline"].endswith(": t-0")
    assert by_code["partitions_stalled"].endswith(": t-3")
    # The same partition of a leader fetched in shares, answered once since its last move:
    # it waits for its turn in the next pass (control/stalls.py), health names no stall.
    shares = [{"node_id": 1, "address": "h:9092", "connected": True, "in_shares": True}]
    waiting = partition("t", 3, lag=10, idle_ms=STALL_AFTER_MS, answers_since_move=1)
    assert assess(snapshot(partitions=[waiting], leaders=shares)).health is Health.HEALTHY


def test_partitions_waiting_for_disk_space_say_so_and_when_the_disk_refused_them() -> None:
    """Paused on a full disk (or retrying since the disk refused them): their own reason,
    with the last refusal's age, never stalled; once the disk has had room for the stall
    time and one still does not move, it is stalled."""
    long_idle = 10 * STALL_AFTER_MS
    parts = [
        partition(
            "t", 0, lag=5, state="paused-disk-full", idle_ms=long_idle, disk_full_ago_ms=3_000
        ),
        # Retrying: refused 4 s ago, tried again 1 s ago.
        partition(
            "t", 1, lag=5, idle_ms=long_idle, disk_full_ago_ms=4_000, disk_retry_ago_ms=1_000
        ),
        # Tried again the stall time ago, not refused since, still not moving.
        partition(
            "t",
            2,
            lag=5,
            idle_ms=long_idle,
            disk_full_ago_ms=STALL_AFTER_MS + 5_000,
            disk_retry_ago_ms=STALL_AFTER_MS,
        ),
    ]
    verdict = assess(snapshot(partitions=parts))
    assert verdict.health is Health.DEGRADED
    by_code = {r.code: r.text for r in verdict.reasons}
    assert set(by_code) == {"partitions_disk_full", "partitions_stalled"}
    assert by_code["partitions_disk_full"] == (
        "2 partitions paused: the disk is full (it refused an append 3 s ago; retried): t-0, t-1"
    )
    assert by_code["partitions_stalled"].endswith(": t-2")


def test_many_partitions_are_counted_and_a_few_named() -> None:
    parts = [partition("t", p, leader=-1) for p in range(12)]
    text = assess(snapshot(partitions=parts)).reasons[0].text
    assert text.startswith("12 partitions") and text.endswith("and 7 more")


def test_an_unreachable_leader_and_a_saturated_pool_degrade() -> None:
    leaders = [
        {"node_id": 1, "address": "h:9092", "connected": True},
        {"node_id": 2, "address": "g:9092", "connected": False, "last_error": "refused"},
    ]
    pool = {"capacity": 100, "used": 100, "waiting": 3}
    verdict = assess(snapshot(leaders=leaders, memory_pool=pool))
    assert [r.code for r in verdict.reasons] == ["leader_unreachable", "pool_saturated"]
    assert "2 (g:9092)" in verdict.reasons[0].text


def test_starting_is_degraded_and_down_comes_first() -> None:
    assert [r.code for r in assess(snapshot(ready=False)).reasons] == ["starting"]
    problem = {"kind": "unreachable", "error": "x", "since_s_ago": 1}
    verdict = assess(snapshot(missing_topics=["a"], source_problem=problem))
    assert [r.health for r in verdict.reasons] == [Health.DOWN, Health.DEGRADED]
    assert verdict.headline().startswith("DOWN: source unreachable")


def test_the_assessment_round_trips_through_json() -> None:
    verdict = assess(snapshot(missing_topics=["x"]))
    as_dict = verdict.as_dict()
    assert as_dict["state"] == "degraded"
    assert as_dict["reasons"][0] == {
        "health": "degraded",
        "code": "topic_missing",
        "text": "topic 'x' not found on the source",
    }


def mirror_snapshot(**fields: Any) -> dict[str, Any]:
    mirror = {
        "running": True,
        "problem": None,
        "topic_errors": {},
        "partitions": [
            {"topic": "orders", "partition": 0, "state": "mirroring", "lag": 0},
            {"topic": "orders", "partition": 1, "state": "mirroring", "lag": 5},
        ],
    }
    mirror.update(fields)
    return snapshot(mirror=mirror)


def test_a_mirror_keeping_up_is_healthy() -> None:
    assert assess(mirror_snapshot()).health is Health.HEALTHY


def test_an_unreachable_destination_halted_partitions_and_refused_topics_degrade() -> None:
    halted = [{"topic": "orders", "partition": 1, "state": "halted", "error": "x"}]
    verdict = assess(
        mirror_snapshot(
            problem="no destination broker reachable",
            partitions=halted,
            topic_errors={"pay": "destination topic 'pay' has 2 partitions, the source 4"},
        )
    )
    assert verdict.health is Health.DEGRADED
    codes = {r.code for r in verdict.reasons}
    assert codes == {"destination_unreachable", "mirror_halted", "mirror_topic"}
    assert "orders-1" in verdict.headline() and "pay" in verdict.headline()


def test_a_destination_refusing_batches_is_named_as_refusing_not_unreachable() -> None:
    problem = "orders-1: destination refused a batch (not_enough_replicas); retrying"
    verdict = assess(mirror_snapshot(problem=problem, problem_kind="refusing"))
    assert verdict.health is Health.DEGRADED
    assert [r.code for r in verdict.reasons] == ["destination_refusing"]
    assert "not_enough_replicas" in verdict.headline() and "orders-1" in verdict.headline()
    assert "unreachable" not in verdict.headline()


def test_failing_archive_uploads_degrade_and_name_the_partitions() -> None:
    archive = {"bucket": "s3://b/p", "retrying_partitions": [], "last_error": None}
    assert assess(snapshot(archive=archive)).health is Health.HEALTHY
    archive = {**archive, "retrying_partitions": ["t-0", "t-1"], "last_error": "PUT: SlowDown"}
    verdict = assess(snapshot(archive=archive))
    assert verdict.health is Health.DEGRADED
    assert [r.code for r in verdict.reasons] == ["archive_retrying"]
    assert "t-0, t-1" in verdict.headline() and "SlowDown" in verdict.headline()


def test_serve_failing_to_read_the_bucket_degrades() -> None:
    serve = {
        "remote_fetches_in_flight": 0,
        "remote_read_failing": 0,
        "remote_fetch_errors_total": 3,
    }
    assert assess({"ready": True, "serve": serve}).health is Health.HEALTHY
    serve = {**serve, "remote_read_failing": 1, "remote_last_error": "GET: SlowDown"}
    verdict = assess({"ready": True, "serve": serve})
    assert verdict.health is Health.DEGRADED
    assert [r.code for r in verdict.reasons] == ["serve_remote_failing"]
    assert "3 failed reads" in verdict.headline() and "SlowDown" in verdict.headline()


def verify_snapshot(mismatched: dict[int, int]) -> dict[str, Any]:
    """The `verify:` section as the daemon's core makes it: partitions 0..2 of "orders"
    walked to 100, those in `mismatched` with a batch differing at the offset given."""
    from replicad.types import TopicPartition
    from replicad.verify.compare import Kind, Mismatch, OffsetRange, PartitionResult
    from replicad.verify.progress import VerifyProgress

    progress = VerifyProgress()
    tps = [TopicPartition("orders", p) for p in range(3)]
    progress.plan(dict.fromkeys(tps, OffsetRange(0, 100)))
    for tp in tps:
        at = mismatched.get(tp.partition)
        found = [] if at is None else [Mismatch(at, at, Kind.DIFFERENT_BYTES, "x")]
        progress.walked(PartitionResult(tp, OffsetRange(0, 100), 100, mismatches=found))
    return progress.snapshot()


def test_a_replica_that_differs_from_its_source_degrades_naming_partition_and_offset() -> None:
    assert assess(snapshot(verify=verify_snapshot({}))).health is Health.HEALTHY
    verdict = assess(snapshot(verify=verify_snapshot({2: 57, 0: 12})))
    assert verdict.health is Health.DEGRADED and verdict.health.exit_code == EXIT_DEGRADED
    (reason,) = verdict.reasons
    assert reason.code == "verify_mismatch"
    assert reason.text == (
        "2 partitions of the replica differ from the source: "
        "orders-0 at offset 12 (different_bytes), orders-2 at offset 57 (different_bytes)"
    )


def test_a_damaged_local_log_degrades_naming_partition_and_offset() -> None:
    rows = [
        partition("orders", 0, damaged_reads=0, damaged_offset=None),
        partition("orders", 1, damaged_reads=3, damaged_offset=4096),
    ]
    verdict = assess(snapshot(partitions=rows))
    assert verdict.health is Health.DEGRADED and verdict.health.exit_code == EXIT_DEGRADED
    (reason,) = verdict.reasons
    assert reason.code == "replica_damaged"
    assert reason.text == (
        "1 partition of the replica has a damaged batch on disk: orders-1 at offset 4096"
    )


def test_a_long_list_names_the_first_five_and_counts_the_rest() -> None:
    rows = [partition("orders", n, damaged_reads=1, damaged_offset=n) for n in range(8)]
    (reason,) = assess(snapshot(partitions=rows)).reasons
    assert reason.text == (
        "8 partitions of the replica have a damaged batch on disk: orders-0 at offset 0, "
        "orders-1 at offset 1, orders-2 at offset 2, orders-3 at offset 3, "
        "orders-4 at offset 4 and 3 more"
    )
