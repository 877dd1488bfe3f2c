"""The group coordinator's shell in serve: a JoinGroup waits on its future until the
coordinator answers it, and the timer feeds the coordinator time (a fake clock here).

Every wait is bounded (asyncio.timeout), so a missed wake-up fails the test instead of
hanging it; the module has a pytest timeout too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from replicad.groups.coordinator import CoordinatorConfig
from replicad.groups.offset_store import OffsetStore
from replicad.leader.catalog import Catalog
from replicad.leader.group_wire import Node
from replicad.leader.groups import GroupService
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import DecodedRequest, RequestHead, request_type
from replicad.protocol.requests import make_entity
from tests.leader.test_group_wire import join_request
from tools.wait import until

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[GroupService, Clock]]:
    logs = LogManager.open(tmp_path / "data", LogConfig(), now_ms=0)
    clock = Clock()
    groups = GroupService(
        Catalog(logs, rng=random.Random(0)),
        lambda: Node(1, "127.0.0.1", 9092),
        config=CoordinatorConfig(initial_rebalance_delay_ms=0),
        now_ms=clock,
        store_dir=tmp_path / "data",
    )
    await groups.start()
    try:
        yield groups, clock
    finally:
        await groups.close()
        logs.close()


def decoded(api: ApiKey, version: int, **values: Any) -> DecodedRequest:
    body = make_entity(request_type(api, version), **values)
    return DecodedRequest(RequestHead(api, version, 1), "client", body)


def join(member_id: str = "", group_id: str = "g") -> DecodedRequest:
    body = join_request(9, member_id, group_id=group_id)
    return DecodedRequest(RequestHead(ApiKey.JOIN_GROUP, 9, 1), "client", body)


async def answered(service: GroupService, request: DecodedRequest) -> Any:
    async with asyncio.timeout(WAIT_S):
        return await service.answer(request, "127.0.0.1")


async def test_a_join_waits_for_the_coordinators_answer_and_gets_it(service) -> None:
    groups, _ = service
    required = await answered(groups, join())
    assert required.error_code == ErrorCode.member_id_required
    joined = await answered(groups, join(required.member_id))
    assert (joined.error_code, joined.generation_id) == (ErrorCode.none, 1)
    assert groups.metrics()["groups"]["CompletingRebalance"] == 1


async def test_a_second_members_join_is_answered_when_the_first_rejoins(service) -> None:
    groups, _ = service
    first_id = (await answered(groups, join())).member_id
    first = await answered(groups, join(first_id))
    sync = decoded(
        ApiKey.SYNC_GROUP,
        5,
        group_id="g",
        generation_id=1,
        member_id=first_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(),
    )
    assert (await answered(groups, sync)).error_code == ErrorCode.none
    second_id = (await answered(groups, join())).member_id
    waiting = asyncio.ensure_future(answered(groups, join(second_id)))
    await asyncio.sleep(0)
    assert not waiting.done()  # the rebalance waits for the first member
    rejoined = await answered(groups, join(first.member_id))
    second = await waiting
    assert rejoined.generation_id == second.generation_id == 2


async def test_the_timer_removes_a_member_whose_session_ran_out(service) -> None:
    groups, clock = service
    member_id = (await answered(groups, join())).member_id
    await answered(groups, join(member_id))
    clock.ms += 10_000
    groups.poke()
    await until(lambda: not groups.coordinator.groups["g"].members, timeout_s=WAIT_S)
    assert groups.coordinator.groups["g"].state.value == "Empty"


async def test_find_coordinator_answers_this_node(service) -> None:
    groups, _ = service
    body = await answered(
        groups, decoded(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g",))
    )
    assert [(c.key, c.node_id, c.port) for c in body.coordinators] == [("g", 1, 9092)]


async def test_a_joined_group_is_owned_on_disk_before_the_join_is_answered(
    service, tmp_path: Path
) -> None:
    groups, _ = service
    member_id = (await answered(groups, join())).member_id
    assert groups.store is not None and groups.store.owned_groups() == frozenset()
    await answered(groups, join(member_id))
    # Read back from the file, as a restart would: the mark is there already.
    reread = OffsetStore.open(tmp_path / "data")
    try:
        assert reread.owned_groups() == {"g"}
    finally:
        reread.close()


def test_the_initial_rebalance_delay_comes_from_the_groups_section(tmp_path: Path) -> None:
    """Kafka's group.initial.rebalance.delay.ms (default 3 s) as groups.initial_rebalance_
    delay_ms; a bad value is named with its path, and Kafka's name points to ours."""
    from replicad.config import load_config
    from replicad.errors import ConfigErrors
    from replicad.groups.coordinator import CoordinatorConfig

    base = "source: {bootstrap_servers: [k:9092]}\ntopics: {include: [t]}\n"
    path = tmp_path / "replicad.yaml"
    path.write_text(base)
    coordinator = CoordinatorConfig.from_config(load_config(path).groups)
    assert coordinator.initial_rebalance_delay_ms == 3_000
    path.write_text(base + "groups: {initial_rebalance_delay_ms: 0}\n")
    coordinator = CoordinatorConfig.from_config(load_config(path).groups)
    assert coordinator.initial_rebalance_delay_ms == 0
    for bad in ("-1", "soon"):
        path.write_text(base + f"groups: {{initial_rebalance_delay_ms: {bad}}}\n")
        with pytest.raises(ConfigErrors, match=r"groups\.initial_rebalance_delay_ms"):
            load_config(path)
    path.write_text(base + "group.initial.rebalance.delay.ms: 0\n")
    with pytest.raises(ConfigErrors, match=r"groups\.initial_rebalance_delay_ms"):
        load_config(path)
