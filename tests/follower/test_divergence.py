"""A leader change with divergence: the follower's log ends equal to the new leader's.

The leader is scripted (tools/peers/scripted_leader.py): no real broker can be
made to rewrite its history on cue. With Fetch v12 the leader reports
DivergingEpoch; capped at v11 the follower must ask OffsetForLeaderEpoch.
"""

from __future__ import annotations

import asyncio

import pytest

from replicad.protocol.apis import ApiKey
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.scripted_leader import ScriptedLeader
from tools.replica import end_offsets, replicad_run, segment_bytes
from tools.wait import until


def batches(first_offset: int, count: int, epoch: int, tag: bytes) -> list[bytes]:
    return [
        producer_batch(
            first_offset + 10 * i,
            [tag + b"-%d" % (first_offset + 10 * i + j) for j in range(10)],
            leader_epoch=epoch,
        )
        for i in range(count)
    ]


def fetches(leader: ScriptedLeader) -> int:
    return sum(api_key == ApiKey.FETCH for api_key, _ in leader.requests)


@pytest.mark.parametrize("fetch_version", [12, 11])
async def test_follower_truncates_to_the_new_leaders_history(tmp_path, fetch_version):
    topic = "diverge"
    old = batches(0, 10, epoch=1, tag=b"old")  # offsets 0..99, all epoch 1
    leader = ScriptedLeader(topic, max_fetch_version=fetch_version)
    leader.set_log(old, leader_epoch=1)
    port = await leader.start()
    data_dir = tmp_path / "data"
    proc = replicad_run(f"127.0.0.1:{port}", topic, data_dir)
    pdir = data_dir / f"{topic}-0"
    try:
        await until(
            lambda: end_offsets(data_dir).get(TopicPartition(topic, 0)) == 100,
            what="the old history to be replicated",
        )
        assert segment_bytes(pdir) == b"".join(old)

        # Another broker takes over: it has offsets 0..49 of epoch 1, then its own
        # epoch 2 from offset 50; our 50..99 never happened there.
        new = old[:5] + batches(50, 3, epoch=2, tag=b"new")
        leader.set_log(new, leader_epoch=2)
        await until(
            lambda: segment_bytes(pdir) == b"".join(new),
            what="the follower's log to equal the new leader's",
        )
        # And it stays that way while the follower goes on fetching.
        fetched = fetches(leader)
        await until(lambda: fetches(leader) >= fetched + 3, what="three more fetches")
        assert segment_bytes(pdir) == b"".join(new)
    finally:
        rc = await asyncio.to_thread(proc.stop)
        await leader.close()
    assert rc == 0, proc.output()
    out = proc.output()
    assert "log diverged from leader, truncating" in out
    assert "Traceback" not in out
    if fetch_version >= 12:
        assert leader.diverging_answers >= 1
    else:
        assert any(key == ApiKey.OFFSET_FOR_LEADER_EPOCH for key, _ in leader.requests)
        assert leader.diverging_answers == 0
    # The epoch cache on disk follows the truncation: epoch 1 from 0, epoch 2 from 50.
    checkpoint = (pdir / "leader-epoch-checkpoint").read_text().split("\n")
    assert checkpoint[:4] == ["0", "2", "1 0", "2 50"]
