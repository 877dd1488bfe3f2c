"""control/stalls.py: which partitions are stalled, reported once per stall."""

from __future__ import annotations

from typing import Any

from replicad.control.stalls import (
    STALL_LINES_AT_ONCE,
    STALL_NAMES_IN_SUMMARY,
    StallWatch,
    is_stalled,
    one_line_each,
    summary_names,
)

AFTER = 5_000
CONNECTED = {1: True, 2: False}


def row(number: int, **fields: Any) -> dict[str, Any]:
    return {
        "topic": "t",
        "partition": number,
        "leader": 1,
        "state": "fetching",
        "lag": 10,
        "idle_ms": AFTER,
        **fields,
    }


def test_the_rule_needs_lag_a_connected_leader_fetching_and_no_progress() -> None:
    assert is_stalled(row(0), CONNECTED, AFTER)
    assert not is_stalled(row(0, idle_ms=AFTER - 1), CONNECTED, AFTER)  # still moving
    assert not is_stalled(row(0, lag=0), CONNECTED, AFTER)  # caught up, idle is fine
    assert not is_stalled(row(0, leader=2), CONNECTED, AFTER)  # unreachable: another reason
    assert not is_stalled(row(0, leader=-1), CONNECTED, AFTER)  # offline
    assert not is_stalled(row(0, state="halted"), CONNECTED, AFTER)  # halted: says why
    assert not is_stalled(row(0, state="truncating"), CONNECTED, AFTER)


def test_a_stall_is_reported_once_and_ends_when_the_partition_moves() -> None:
    watch = StallWatch(AFTER)
    leaders = [{"node_id": 1, "connected": True}]
    first = watch.check([row(0), row(1, idle_ms=10)], leaders)
    assert [r["partition"] for r in first.began] == [0] and first.ended == ()
    again = watch.check([row(0, idle_ms=AFTER * 3), row(1, idle_ms=20)], leaders)
    assert again.began == () and again.ended == ()  # still the same stall: not again
    assert watch.status() == {
        "stall_after_ms": AFTER,
        "stalled": 1,
        "stalls_total": 1,
        "partitions": ["t-0"],
    }
    moved = watch.check([row(0, idle_ms=0), row(1, idle_ms=30)], leaders)
    assert moved.ended == ("t-0",) and watch.status()["stalled"] == 0
    later = watch.check([row(0), row(1)], leaders)  # both stall: new stalls, counted
    assert sorted(r["partition"] for r in later.began) == [0, 1]
    assert watch.status()["stalls_total"] == 3


# -- a stall planted in a real replication ------------------------------------------------

PARTITIONS = 3
STALL_AFTER_MS = 2_000


def records_withheld_from_partition_0(head: Any, body: bytes) -> bytes:
    """A Fetch answer whose partition 0 carries no records, its high watermark intact: the
    leader looks reachable and ahead, and the partition never moves."""
    import dataclasses

    from replicad.protocol.apis import ApiKey
    from replicad.protocol.codec import encode_entities
    from tools.chaos.frames import decode_response

    header, entity = decode_response(body, ApiKey.FETCH, head.api_version)
    responses = tuple(
        dataclasses.replace(
            topic,
            partitions=tuple(
                dataclasses.replace(p, records=None) if p.partition_index == 0 else p
                for p in topic.partitions
            ),
        )
        for topic in entity.responses
    )
    return encode_entities(header, dataclasses.replace(entity, responses=responses))


def test_a_wedged_partition_is_detected_once_and_the_others_are_not(
    kafka_broker, unique_topic, tmp_path
):
    from replicad.control.client import query
    from replicad.protocol.apis import ApiKey
    from tools.chaos.proxy import ChaosProxy
    from tools.peers.produce import produce_numbered
    from tools.replica import replicad_run, topic_ends

    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    produce_numbered(kafka_broker.bootstrap, topic, PARTITIONS, 20)
    data_dir, sock = tmp_path / "data", tmp_path / "replicad.sock"
    with (
        ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy,
        replicad_run(
            proxy.address,
            topic,
            data_dir,
            config={"control": {"stall_after_ms": STALL_AFTER_MS}},
            control_socket=sock,
        ) as proc,
    ):
        proc.wait_caught_up(PARTITIONS * 20)
        proxy.rewrite_responses(ApiKey.FETCH, records_withheld_from_partition_0)
        produce_numbered(kafka_broker.bootstrap, topic, PARTITIONS, 20, tag=b"w")
        proc.wait_for(
            lambda: query(sock)["stalls"]["partitions"] == [f"{topic}-0"],
            timeout_s=60,
            what="partition 0 to be seen as stalled",
        )
        snap = query(sock)
        assert topic_ends(data_dir, topic) == {0: 20, 1: 40, 2: 40}  # the others moved on
        assert snap["totals"]["partitions_stalled"] == 1
        assert snap["health"]["state"] == "degraded"
        assert any(r["code"] == "partitions_stalled" for r in snap["health"]["reasons"])
        assert "max_block_ms" in snap["event_loop"]

        def idle_ms_of_partition_0() -> int:
            (p,) = [p for p in query(sock)["partitions"] if p["partition"] == 0]
            return int(p["idle_ms"])

        # Still stalled for three stall periods: not reported again (stalls_total below).
        proc.wait_for(
            lambda: idle_ms_of_partition_0() >= 3 * STALL_AFTER_MS,
            what="partition 0 still stalled after three stall periods",
        )
        proxy.heal()
        proc.wait_for(
            lambda: (
                query(sock)["stalls"]["stalled"] == 0
                and topic_ends(data_dir, topic) == dict.fromkeys(range(PARTITIONS), 40)
            ),
            timeout_s=60,
            what="partition 0 to move again once the leader sends its records",
        )
        assert query(sock)["stalls"]["stalls_total"] == 1
    log = proc.output()
    assert log.count("partition stalled") == 1, log
    (line,) = [entry for entry in log.splitlines() if "partition stalled" in entry]
    for field in ("last_request_bytes", "last_response_bytes", "high_watermark", f"{topic}-0"):
        assert field in line
    assert "partition moving again after a stall" in log


def test_a_check_where_thousands_stall_logs_a_line_each_for_the_first_and_one_for_the_rest() -> (
    None
):
    names = [f"t-{i}" for i in range(10_000)]
    each, rest = one_line_each(names)
    assert list(each) == names[:STALL_LINES_AT_ONCE]
    assert list(rest) == names[STALL_LINES_AT_ONCE:]
    summary = summary_names(rest)
    assert summary.startswith(f"t-{STALL_LINES_AT_ONCE}, t-{STALL_LINES_AT_ONCE + 1}, ")
    assert summary.endswith(f" and {len(rest) - STALL_NAMES_IN_SUMMARY} more")
    few = ["a-0", "a-1"]
    assert (list(one_line_each(few)[0]), list(one_line_each(few)[1])) == (few, [])
    assert summary_names(few) == "a-0, a-1"
