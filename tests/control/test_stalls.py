"""control/stalls.py: which partitions are stalled, reported once per stall."""

from __future__ import annotations

import os
from typing import Any

import pytest

from replicad.control.stalls import (
    PAUSED_DISK_FULL,
    STALL_LINES_AT_ONCE,
    STALL_NAMES_IN_SUMMARY,
    StallWatch,
    is_stalled,
    one_line_each,
    sharing_leaders,
    summary_names,
    waits_for_disk,
    waits_for_turn,
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


def test_a_partition_waiting_for_disk_space_is_not_stalled_until_the_disk_took_appends() -> None:
    """Paused on a full disk, or fetching again since it left that pause (the disk refused
    its last append after its last move, and it retried less than the stall time ago): not
    stalled, however long its log has not moved. Retried the stall time ago with no move
    and no refusal since: the disk has had room and the partition still does not move, so it
    is stalled again."""
    long_idle = 10 * AFTER
    paused = row(0, state=PAUSED_DISK_FULL, idle_ms=long_idle, disk_full_ago_ms=long_idle)
    retrying = row(0, idle_ms=long_idle, disk_full_ago_ms=2 * AFTER, disk_retry_ago_ms=AFTER - 1)
    room_since = row(0, idle_ms=long_idle, disk_full_ago_ms=2 * AFTER, disk_retry_ago_ms=AFTER)
    refused_before_its_last_move = row(
        0, idle_ms=AFTER, disk_full_ago_ms=AFTER + 1, disk_retry_ago_ms=1
    )
    assert waits_for_disk(paused, AFTER) and not is_stalled(paused, CONNECTED, AFTER)
    assert waits_for_disk(retrying, AFTER) and not is_stalled(retrying, CONNECTED, AFTER)
    assert not waits_for_disk(room_since, AFTER) and is_stalled(room_since, CONNECTED, AFTER)
    assert not waits_for_disk(refused_before_its_last_move, AFTER)
    assert is_stalled(refused_before_its_last_move, CONNECTED, AFTER)
    assert not waits_for_disk(row(0, disk_full_ago_ms=None), AFTER)  # never refused


def test_a_partition_of_a_leader_fetched_in_shares_waits_for_its_turn_until_answered() -> None:
    """A leader that keeps no session is asked a share of its partitions at a time, in
    passes (the follower's R11): a partition moved by an answer that left it behind, or
    answered once without records (the leader's wait ran out), waits for its turn in the
    next pass, however long that takes; answered twice since its last move, it is judged as
    any other (and a leader asked everything at once never waits)."""
    sharing = sharing_leaders(
        [{"node_id": 1, "in_shares": True}, {"node_id": 2, "in_shares": False}]
    )
    assert sharing == frozenset({1})
    long_idle = 10 * AFTER
    waiting = [row(0, idle_ms=long_idle, answers_since_move=n) for n in (None, 0, 1)]
    judged = row(0, idle_ms=long_idle, answers_since_move=2)
    for one in waiting:
        assert waits_for_turn(one, sharing)
        assert not is_stalled(one, CONNECTED, AFTER, sharing)
        assert is_stalled(one, CONNECTED, AFTER)  # a leader asked everything at once
        assert is_stalled({**one, "leader": 3}, {3: True}, AFTER, sharing)
    assert not waits_for_turn(judged, sharing)
    assert is_stalled(judged, CONNECTED, AFTER, sharing)
    watch = StallWatch(AFTER)
    leaders = [{"node_id": 1, "connected": True, "in_shares": True}]
    change = watch.check([waiting[2], row(1, answers_since_move=2)], leaders)
    assert [p["partition"] for p in change.began] == [1]
    assert watch.status()["partitions"] == ["t-1"]


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
    # The stall rules' inputs, so that a soak's stall lines explain themselves.
    for field in ("answers_since_move", "disk_full_ago_ms", "disk_retry_ago_ms"):
        assert field in line
    assert "partition moving again after a stall" in log


DISK_BYTES = 1024 * 1024


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_partitions_paused_on_a_full_disk_are_named_not_stalled_until_the_disk_has_room(
    kafka_broker, unique_topic, tmp_path
):
    """The daemon's side of the full-disk rule: on a 1 MiB data dir holding less than the
    source, status and health name the partitions paused on a full disk and when the disk
    last refused an append, and the stall watch counts none, however long the disk stays
    full; once the disk has room, a partition the leader still sends nothing is stalled (and
    only it), and moves again when the records come."""
    from replicad.control.client import query
    from replicad.protocol.apis import ApiKey
    from tools.chaos.disk import SmallFilesystem
    from tools.chaos.proxy import ChaosProxy
    from tools.peers.produce import produce_numbered
    from tools.replica import replicad_run, topic_ends

    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    # 2 x 40 records of 64 KiB: five times the data dir.
    produce_numbered(kafka_broker.bootstrap, topic, 2, 40, tag=bytes(64 * 1024))
    sock = tmp_path / "replicad.sock"

    def reasons() -> dict[str, str]:
        return {r["code"]: r["text"] for r in query(sock)["health"]["reasons"]}

    with (
        SmallFilesystem(tmp_path / "fs", DISK_BYTES) as fs,
        ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy,
        replicad_run(
            proxy.address,
            topic,
            fs.path / "data",
            log_path=tmp_path / "replicad.log",
            config={"control": {"stall_after_ms": STALL_AFTER_MS}},
            control_socket=sock,
        ) as proc,
    ):
        proc.wait_ready()  # its control socket answers from here on
        proc.wait_for(
            lambda: "partitions_disk_full" in reasons(),
            timeout_s=600,
            what="health to name partitions paused on a full disk",
        )
        snap = query(sock)
        assert snap["totals"]["last_disk_full_ago_ms"] is not None
        assert any("the disk is full" in r["text"] for r in snap["health"]["reasons"])
        paused = [p for p in snap["partitions"] if p["disk_full_ago_ms"] is not None]
        assert paused and all(p["last_error"] == "disk full" for p in paused)

        def idle_ms_of_partition_0() -> int:
            rows = [p for p in query(sock)["partitions"] if p["partition"] == 0]
            return int(rows[0]["idle_ms"]) if rows else 0

        # Full for three stall periods (the status loop checks every 2 s): none stalled.
        proc.wait_for(
            lambda: idle_ms_of_partition_0() >= 3 * STALL_AFTER_MS,
            timeout_s=600,
            what="partition 0 paused on the full disk for three stall periods",
        )
        snap = query(sock)
        assert snap["stalls"]["stalls_total"] == 0, snap["stalls"]
        assert "partitions_stalled" not in {r["code"] for r in snap["health"]["reasons"]}

        # Room again; the leader sends partition 0 nothing: it stalls, partition 1 moves on.
        proxy.rewrite_responses(ApiKey.FETCH, records_withheld_from_partition_0)
        fs.resize(64 * DISK_BYTES)
        proc.wait_for(
            lambda: query(sock)["stalls"]["partitions"] == [f"{topic}-0"],
            timeout_s=600,
            what="partition 0 stalled once the disk has room",
        )
        proc.wait_for(
            lambda: topic_ends(fs.path / "data", topic).get(1) == 40,
            timeout_s=600,
            what="partition 1 to catch up",
        )
        proxy.heal()
        proc.wait_for(
            lambda: (
                topic_ends(fs.path / "data", topic) == {0: 40, 1: 40}
                and query(sock)["stalls"]["stalled"] == 0
            ),
            timeout_s=600,
            what="partition 0 to move again once the leader sends its records",
        )
        assert "partitions_disk_full" not in reasons()


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
