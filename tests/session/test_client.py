"""The follower's fetch-session handler: every client rule, then property tests against a
strict model leader that records any request a correct leader would refuse."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from replicad.errors import LocalProtocolError
from replicad.protocol.fetch_request import (
    FetchRequest,
    ForgottenPartition,
    RequestedPartition,
    fetch_request,
)
from replicad.session.client import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_EPOCH,
    FetchRequestPlan,
    FetchSessionHandler,
    PartitionFetch,
    RecoveryReason,
    ResponseVerdict,
    TopicIdPartition,
)
from replicad.session.metadata import FetchMetadata, next_epoch
from replicad.types import TopicPartition

SESSION = 4242
T_A = uuid.UUID(int=0xA)
T_A2 = uuid.UUID(int=0xA2)
T_B = uuid.UUID(int=0xB)


def tp(topic: str, partition: int = 0) -> TopicPartition:
    return TopicPartition(topic, partition)


def pf(offset: int = 0, **kwargs: object) -> PartitionFetch:
    return PartitionFetch(fetch_offset=offset, log_start_offset=0, max_bytes=1024, **kwargs)  # type: ignore[arg-type]


def wants(*names: str, offset: int = 0) -> dict[TopicPartition, PartitionFetch]:
    return {tp(n): pf(offset) for n in names}


def answer(
    handler: FetchSessionHandler,
    plan: FetchRequestPlan,
    *,
    error_code: int = 0,
    session_id: int | None = None,
    partitions: object = None,
    **kwargs: object,
) -> ResponseVerdict:
    """Answer `plan` as a correct leader would, unless told otherwise."""
    if session_id is None:
        session_id = plan.session_id if not plan.is_full else SESSION
    if partitions is None:
        partitions = list(plan.to_send) if plan.is_full else []
    return handler.handle_response(
        plan,
        error_code=error_code,
        session_id=session_id,
        partitions=partitions,  # type: ignore[arg-type]
        now_ms=1000,
        **kwargs,  # type: ignore[arg-type]
    )


def in_session(want: Mapping[TopicPartition, PartitionFetch]) -> FetchSessionHandler:
    """A handler whose session SESSION holds `want`, next request incremental at epoch 1."""
    handler = FetchSessionHandler(node_id=1)
    verdict = answer(handler, handler.build_request(want))
    assert verdict.accepted
    assert (handler.session_id, handler.epoch) == (SESSION, 1)
    return handler


# -- requests --------------------------------------------------------------------------


def test_first_request_is_full_and_asks_for_a_session() -> None:
    handler = FetchSessionHandler(node_id=1)
    want = wants("c", "a", "b")
    plan = handler.build_request(want)
    assert (plan.session_id, plan.epoch, plan.is_full) == (INVALID_SESSION_ID, INITIAL_EPOCH, True)
    # KIP-74: the caller's order is the request order.
    assert list(plan.to_send) == [tp("c"), tp("a"), tp("b")]
    assert plan.to_forget == ()
    assert dict(plan.session_partitions) == want


def test_full_response_with_session_id_starts_incremental_fetching_at_epoch_1() -> None:
    handler = FetchSessionHandler(node_id=1)
    want = wants("a", "b")
    verdict = answer(handler, handler.build_request(want))
    assert verdict == ResponseVerdict(
        accepted=True,
        reason=None,
        detail=verdict.detail,
        next_session_id=SESSION,
        next_epoch=1,
    )
    plan = handler.build_request(want)
    assert (plan.session_id, plan.epoch, plan.is_full) == (SESSION, 1, False)
    # Nothing changed: an idle incremental request carries no partitions at all.
    assert dict(plan.to_send) == {}
    assert plan.to_forget == ()
    assert dict(plan.session_partitions) == want


def test_epoch_advances_with_each_accepted_incremental_response() -> None:
    handler = in_session(wants("a"))
    for expected in (1, 2, 3, 4):
        plan = handler.build_request(wants("a"))
        assert plan.epoch == expected
        assert answer(handler, plan).accepted
    assert handler.epoch == 5


def test_epoch_wraps_from_max_to_one() -> None:
    handler = in_session(wants("a"))
    # Reaching 2^31-1 by fetching would take years; set the state as it would then be.
    handler._next = FetchMetadata(SESSION, MAX_EPOCH)
    plan = handler.build_request(wants("a"))
    assert plan.epoch == MAX_EPOCH
    verdict = answer(handler, plan)
    assert verdict.accepted
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, 1)
    assert handler.build_request(wants("a")).epoch == 1


def test_incremental_sends_added_partitions_in_caller_order() -> None:
    handler = in_session(wants("a"))
    plan = handler.build_request({tp("a"): pf(), tp("z"): pf(), tp("m"): pf()})
    assert list(plan.to_send) == [tp("z"), tp("m")]
    assert plan.to_forget == ()
    assert list(plan.session_partitions) == [tp("a"), tp("z"), tp("m")]


@pytest.mark.parametrize(
    "change",
    [
        {"fetch_offset": 10},
        {"log_start_offset": 5},
        {"max_bytes": 2048},
        {"current_leader_epoch": 3},
        {"last_fetched_epoch": 2},
    ],
)
def test_incremental_sends_a_partition_when_any_field_changed(change: dict[str, int]) -> None:
    handler = in_session(wants("a", "b"))
    changed = replace(pf(), **change)
    plan = handler.build_request({tp("a"): pf(), tp("b"): changed})
    assert dict(plan.to_send) == {tp("b"): changed}
    assert plan.to_forget == ()
    assert plan.session_partitions[tp("b")] == changed


def test_incremental_forgets_partitions_no_longer_wanted() -> None:
    handler = in_session(wants("a", "b", "c"))
    plan = handler.build_request(wants("b"))
    assert dict(plan.to_send) == {}
    assert list(plan.to_forget) == [tp("a"), tp("c")]
    assert list(plan.session_partitions) == [tp("b")]


def test_added_changed_and_forgotten_together() -> None:
    handler = in_session(wants("a", "b", "c"))
    plan = handler.build_request({tp("c"): pf(7), tp("a"): pf(), tp("d"): pf()})
    # Kafka's order: added first, then changed ones in session order.
    assert list(plan.to_send) == [tp("d"), tp("c")]
    assert list(plan.to_forget) == [tp("b")]
    assert list(plan.session_partitions) == [tp("a"), tp("c"), tp("d")]
    assert answer(handler, plan).accepted
    assert list(handler.session_partitions) == [tp("a"), tp("c"), tp("d")]


def test_a_plan_that_is_never_sent_leaves_no_trace() -> None:
    handler = in_session(wants("a"))
    first = handler.build_request(wants("a", "b"))
    # The shell gave up before sending; the next plan must still add "b".
    second = handler.build_request(wants("a", "b"))
    assert list(first.to_send) == list(second.to_send) == [tp("b")]
    assert (second.session_id, second.epoch) == (first.session_id, first.epoch)
    with pytest.raises(LocalProtocolError):
        answer(handler, first)


def _sessions_alike(handler: FetchSessionHandler) -> list[tuple[TopicPartition, PartitionFetch]]:
    return list(handler.session_partitions.items())


def test_planning_and_failing_a_request_leave_the_session_as_it_was() -> None:
    # Rule 1 without copies: a plan lays its changes over the session, it does not make
    # them. Built, not sent; built, sent, refused; both leave the session untouched.
    handler = in_session(wants("a", "b", "c"))
    held = _sessions_alike(handler)
    wanted = {tp("c"): pf(7), tp("a"): pf(), tp("d"): pf()}
    unsent = handler.build_request(wanted)
    assert _sessions_alike(handler) == held
    assert list(unsent.session_partitions.items()) == [
        (tp("a"), pf()),
        (tp("c"), pf(7)),
        (tp("d"), pf()),
    ]
    wanted[tp("e")] = pf()  # the caller's map changes after the build: the plan does not
    assert tp("e") not in unsent.session_partitions and len(unsent.session_partitions) == 3
    refused = handler.build_request(wanted)
    assert list(refused.to_send) == [tp("d"), tp("e"), tp("c")]
    assert _sessions_alike(handler) == held
    verdict = answer(handler, refused, partitions=[tp("zz")])  # a partition never asked
    assert not verdict.accepted
    # Reset to a full request; the refused plan still reads what it was built on.
    assert list(refused.session_partitions) == [tp("a"), tp("c"), tp("d"), tp("e")]
    retry = handler.build_request(wanted)
    assert retry.is_full and list(retry.to_send) == list(wanted)


def test_an_accepted_plan_is_the_session_in_its_order_and_a_stale_plan_is_not_read() -> None:
    handler = in_session(wants("a", "b", "c"))
    plan = handler.build_request({tp("c"): pf(7), tp("a"): pf(), tp("d"): pf(), tp("e"): pf()})
    expected = list(plan.session_partitions.items())
    assert answer(handler, plan).accepted
    # The view and the session after it agree, entry for entry and in order (what the
    # partition table reads right after the answer).
    assert list(plan.session_partitions.items()) == expected == _sessions_alike(handler)
    assert len(plan.session_partitions) == 4 and plan.session_partitions.get(tp("b")) is None
    later = handler.build_request({tp("a"): pf(3), tp("d"): pf()})
    assert answer(handler, later).accepted
    assert _sessions_alike(handler) == [(tp("a"), pf(3)), (tp("d"), pf())]
    # Two plans on, the first plan's view would read the second's changes: it refuses.
    with pytest.raises(LocalProtocolError):
        plan.session_partitions.get(tp("a"))
    assert list(later.session_partitions) == [tp("a"), tp("d")]


def test_full_request_after_reset_lists_everything_wanted() -> None:
    handler = in_session(wants("a", "b"))
    answer(
        handler,
        handler.build_request(wants("a", "b")),
        error_code=ErrorCode.invalid_fetch_session_epoch,
    )
    plan = handler.build_request(wants("b", "a", "c"))
    assert plan.is_full
    assert list(plan.to_send) == [tp("b"), tp("a"), tp("c")]
    assert plan.to_forget == ()


# -- reactions to errors -----------------------------------------------------------------


def test_session_id_not_found_goes_back_to_initial() -> None:
    handler = in_session(wants("a"))
    verdict = answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.fetch_session_id_not_found
    )
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.FETCH_SESSION_ID_NOT_FOUND
    assert (verdict.next_session_id, verdict.next_epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    assert "FETCH_SESSION_ID_NOT_FOUND" in verdict.detail
    plan = handler.build_request(wants("a"))
    assert (plan.session_id, plan.epoch, plan.is_full) == (0, 0, True)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ErrorCode.invalid_fetch_session_epoch, RecoveryReason.INVALID_FETCH_SESSION_EPOCH),
        (ErrorCode.fetch_session_topic_id_error, RecoveryReason.FETCH_SESSION_TOPIC_ID_ERROR),
        (ErrorCode.unknown_server_error, RecoveryReason.TOP_LEVEL_ERROR),
        (ErrorCode.not_leader_or_follower, RecoveryReason.TOP_LEVEL_ERROR),
    ],
)
def test_other_top_level_errors_close_and_recreate_with_the_same_id(
    error: ErrorCode, reason: RecoveryReason
) -> None:
    handler = in_session(wants("a"))
    answer(handler, handler.build_request(wants("a")))
    verdict = answer(handler, handler.build_request(wants("a")), error_code=error)
    assert not verdict.accepted
    assert verdict.reason is reason
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, INITIAL_EPOCH)
    plan = handler.build_request(wants("a"))
    assert (plan.session_id, plan.epoch, plan.is_full) == (SESSION, INITIAL_EPOCH, True)
    assert handler.status().recoveries == {reason: 1}


def test_send_error_closes_and_recreates() -> None:
    handler = in_session(wants("a"))
    handler.build_request(wants("a"))
    verdict = handler.handle_send_error(now_ms=5)
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.SEND_ERROR
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, INITIAL_EPOCH)
    assert handler.status().last_recovery_ms == 5


def test_send_error_without_a_session_retries_initial() -> None:
    handler = FetchSessionHandler(node_id=1)
    handler.build_request(wants("a"))
    verdict = handler.handle_send_error(now_ms=0)
    assert (verdict.next_session_id, verdict.next_epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)


def test_error_on_a_full_request_keeps_asking_to_close_the_named_session() -> None:
    handler = in_session(wants("a"))
    answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.invalid_fetch_session_epoch
    )
    plan = handler.build_request(wants("a"))
    verdict = answer(handler, plan, error_code=ErrorCode.unknown_server_error)
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, INITIAL_EPOCH)


# -- validation of full responses --------------------------------------------------------


def test_full_response_with_extra_partition_is_rejected_and_goes_initial() -> None:
    handler = FetchSessionHandler(node_id=1)
    plan = handler.build_request(wants("a"))
    verdict = answer(handler, plan, partitions=[tp("a"), tp("x")])
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_FULL_RESPONSE
    assert "extra (x-0)" in verdict.detail
    assert (verdict.next_session_id, verdict.next_epoch) == (0, 0)


def test_session_creating_full_response_must_not_omit_partitions() -> None:
    handler = in_session(wants("a"))
    answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.invalid_fetch_session_epoch
    )
    plan = handler.build_request(wants("a", "b"))
    verdict = answer(handler, plan, session_id=999, partitions=[tp("a")])
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_FULL_RESPONSE
    assert "omitted (b-0)" in verdict.detail
    # Kafka: an invalid full response goes all the way back to initial.
    assert (verdict.next_session_id, verdict.next_epoch) == (0, 0)


def test_sessionless_full_response_may_omit_partitions() -> None:
    handler = FetchSessionHandler(node_id=1)
    plan = handler.build_request(wants("a", "b", "c"))
    verdict = answer(handler, plan, session_id=0, partitions=[tp("b")])
    assert verdict.accepted
    assert verdict.reason is None
    assert verdict.omitted == {tp("a"), tp("c")}
    # Nothing is cached anywhere: the next full request names them all again.
    assert list(handler.build_request(wants("a", "b", "c")).to_send) == [tp("a"), tp("b"), tp("c")]


def test_full_response_with_session_id_0_stays_sessionless_and_tries_again() -> None:
    handler = FetchSessionHandler(node_id=1)
    for _ in range(3):
        plan = handler.build_request(wants("a"))
        assert (plan.session_id, plan.epoch, plan.is_full) == (0, 0, True)
        verdict = answer(handler, plan, session_id=0)
        assert verdict.accepted
        assert verdict.reason is None  # not a recovery: no log line, no counter
    status = handler.status()
    assert status.sessionless_responses == 3
    assert status.recoveries == {}
    assert not status.is_sessionful


def test_a_sessionless_so_far_until_it_makes_a_session_and_never_again_after() -> None:
    handler = FetchSessionHandler(node_id=1)
    assert not handler.sessionless_so_far  # not asked yet: it may keep one
    answer(handler, handler.build_request(wants("a")), session_id=0)
    assert handler.sessionless_so_far  # answered without one (Tansu)
    answer(handler, handler.build_request(wants("a")), session_id=5)
    assert not handler.sessionless_so_far
    answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.fetch_session_id_not_found
    )
    answer(handler, handler.build_request(wants("a")), session_id=0)  # its cache is full now
    assert not handler.sessionless_so_far  # it made one before: it can again
    assert FetchSessionHandler(node_id=1, sessions_enabled=False).sessionless_so_far


def test_a_full_request_that_got_no_answer_made_no_session_either() -> None:
    """A sessionless leader reading many partitions may take longer than the request
    timeout: the next request is a share (rule 6), until a session is made."""
    handler = FetchSessionHandler(node_id=1)
    handler.build_request(wants("a"))
    handler.handle_send_error(now_ms=0)
    assert handler.sessionless_so_far
    answer(handler, handler.build_request(wants("a")), session_id=5)
    assert not handler.sessionless_so_far
    handler.build_request(wants("a"))
    handler.handle_send_error(now_ms=0)  # an incremental request lost: a session was made
    assert not handler.sessionless_so_far


def test_empty_throttled_full_response_goes_initial_quietly() -> None:
    handler = in_session(wants("a"))
    answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.invalid_fetch_session_epoch
    )
    plan = handler.build_request(wants("a"))
    verdict = answer(handler, plan, session_id=0, partitions=[], throttle_time_ms=200)
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.THROTTLED
    assert (verdict.next_session_id, verdict.next_epoch) == (0, 0)


def test_full_response_naming_an_unknown_topic_id_is_rejected() -> None:
    handler = FetchSessionHandler(node_id=1)
    plan = handler.build_request({tp("a"): pf(topic_id=T_A)})
    assert plan.uses_topic_ids
    assert dict(plan.topic_names) == {T_A: "a"}
    verdict = answer(handler, plan, partitions=[tp("a")], topic_ids=[T_A, T_B])
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_FULL_RESPONSE
    assert str(T_B) in verdict.detail


# -- validation of incremental responses -------------------------------------------------


def test_incremental_response_naming_a_partition_outside_the_session_closes_and_recreates() -> None:
    handler = in_session(wants("a"))
    verdict = answer(handler, handler.build_request(wants("a")), partitions=[tp("zz")])
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_INCREMENTAL_RESPONSE
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, INITIAL_EPOCH)


def test_incremental_response_may_name_a_partition_added_by_the_same_request() -> None:
    handler = in_session(wants("a"))
    verdict = answer(handler, handler.build_request(wants("a", "b")), partitions=[tp("b")])
    assert verdict.accepted


def test_incremental_response_naming_a_just_forgotten_partition_is_rejected() -> None:
    handler = in_session(wants("a", "b"))
    verdict = answer(handler, handler.build_request(wants("a")), partitions=[tp("b")])
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_INCREMENTAL_RESPONSE


def test_incremental_response_with_session_id_0_means_the_leader_closed_it() -> None:
    handler = in_session(wants("a"))
    verdict = answer(handler, handler.build_request({}), session_id=0)
    assert verdict.accepted
    assert verdict.reason is RecoveryReason.SESSION_CLOSED_BY_LEADER
    assert (verdict.next_session_id, verdict.next_epoch) == (0, 0)


def test_incremental_response_for_another_session_is_rejected() -> None:
    handler = in_session(wants("a"))
    verdict = answer(handler, handler.build_request(wants("a")), session_id=SESSION + 1)
    assert not verdict.accepted
    assert verdict.reason is RecoveryReason.INVALID_INCREMENTAL_RESPONSE
    assert (verdict.next_session_id, verdict.next_epoch) == (SESSION, INITIAL_EPOCH)


# -- sessions disabled, shutdown ---------------------------------------------------------


def test_sessions_disabled_always_sends_legacy_full_requests() -> None:
    handler = FetchSessionHandler(node_id=1, sessions_enabled=False)
    for error in (0, ErrorCode.fetch_session_id_not_found, 0, ErrorCode.unknown_server_error):
        plan = handler.build_request(wants("a", "b"))
        assert (plan.session_id, plan.epoch, plan.is_full) == (0, FINAL_EPOCH, True)
        # Even a leader that hands out a session id does not make us use it.
        answer(handler, plan, error_code=error, session_id=77)
    assert handler.build_request(wants("a")).epoch == FINAL_EPOCH
    handler.build_request(wants("a"))
    assert handler.handle_send_error(now_ms=0).next_epoch == FINAL_EPOCH
    assert handler.close_request() is None


def test_close_sends_final_epoch_with_no_partitions_and_drops_the_session() -> None:
    handler = in_session(wants("a", "b"))
    plan = handler.close_request()
    assert plan is not None
    assert (plan.session_id, plan.epoch, plan.is_full, plan.is_close) == (
        SESSION,
        FINAL_EPOCH,
        True,
        True,
    )
    assert dict(plan.to_send) == {}
    assert (handler.session_id, handler.epoch) == (0, 0)
    assert handler.status().partition_count == 0
    # Its response carries nothing to act on, whatever it says.
    verdict = answer(handler, plan, session_id=0, partitions=[])
    assert verdict.accepted
    assert handler.close_request() is None


def test_close_without_a_session_sends_nothing() -> None:
    assert FetchSessionHandler(node_id=1).close_request() is None


def test_close_after_reset_still_closes_the_named_session() -> None:
    handler = in_session(wants("a"))
    answer(
        handler, handler.build_request(wants("a")), error_code=ErrorCode.invalid_fetch_session_epoch
    )
    plan = handler.close_request()
    assert plan is not None
    assert (plan.session_id, plan.epoch) == (SESSION, FINAL_EPOCH)


# -- topic ids (Fetch v13+) --------------------------------------------------------------


def test_topic_ids_used_only_when_every_partition_has_one() -> None:
    handler = FetchSessionHandler(node_id=1)
    plan = handler.build_request({tp("a"): pf(topic_id=T_A), tp("b"): pf()})
    assert not plan.uses_topic_ids
    assert dict(plan.topic_names) == {}


def test_a_session_of_names_keeps_them_while_a_partition_without_an_id_stays() -> None:
    # Rule 4, where the handler reads ids O(changes): forgetting or adding partitions
    # with ids beside one without keeps the session by names (as does forgetting the one
    # without: v13 would forget it by an id it has not); once none is left without, the
    # next change could use ids, a flip the handler makes a full request of.
    a, d = pf(topic_id=T_A), pf(topic_id=T_B)
    handler = in_session({tp("a"): a, tp("b"): pf(topic_id=T_B), tp("c"): pf()})
    plan = handler.build_request({tp("a"): a, tp("c"): pf()})
    assert not plan.is_full and list(plan.to_forget) == [tp("b")]
    assert not plan.uses_topic_ids and dict(plan.topic_names) == {}
    assert answer(handler, plan).accepted
    plan = handler.build_request({tp("a"): a, tp("c"): pf(), tp("d"): d})
    assert not plan.is_full and not plan.uses_topic_ids
    assert answer(handler, plan).accepted
    plan = handler.build_request({tp("a"): a, tp("d"): d})
    assert not plan.is_full and not plan.uses_topic_ids and list(plan.to_forget) == [tp("c")]
    assert answer(handler, plan).accepted
    plan = handler.build_request({tp("a"): a, tp("d"): d, tp("e"): pf(topic_id=T_A2)})
    assert plan.is_full and plan.uses_topic_ids
    assert dict(plan.topic_names) == {T_A: "a", T_B: "d", T_A2: "e"}


def test_recreated_topic_is_replaced_in_the_session() -> None:
    handler = in_session({tp("a"): pf(topic_id=T_A), tp("b"): pf(topic_id=T_B)})
    plan = handler.build_request({tp("a"): pf(topic_id=T_A2), tp("b"): pf(topic_id=T_B)})
    assert not plan.is_full
    assert dict(plan.to_send) == {tp("a"): pf(topic_id=T_A2)}
    assert plan.to_replace == (TopicIdPartition(T_A, tp("a")),)
    assert plan.to_forget == ()
    assert plan.forgotten_for_topic_ids() == [TopicIdPartition(T_A, tp("a"))]
    assert dict(plan.topic_names) == {T_A2: "a", T_B: "b"}


def test_forgotten_partitions_carry_their_session_topic_id() -> None:
    handler = in_session({tp("a"): pf(topic_id=T_A), tp("b"): pf(topic_id=T_B)})
    plan = handler.build_request({tp("b"): pf(topic_id=T_B)})
    assert plan.to_forget == (tp("a"),)
    assert plan.to_forget_ids == (TopicIdPartition(T_A, tp("a")),)
    assert plan.uses_topic_ids


def test_a_flip_in_topic_id_use_makes_the_request_full_instead_of_provoking_106() -> None:
    handler = in_session({tp("a"): pf(topic_id=T_A)})
    # A partition without a topic id joins: the request must go back to names (v12).
    plan = handler.build_request({tp("a"): pf(topic_id=T_A), tp("b"): pf()})
    assert (plan.session_id, plan.epoch, plan.is_full) == (SESSION, INITIAL_EPOCH, True)
    assert not plan.uses_topic_ids
    assert list(plan.to_send) == [tp("a"), tp("b")]
    assert handler.status().recoveries == {RecoveryReason.TOPIC_ID_USAGE_CHANGED: 1}


# -- status ------------------------------------------------------------------------------


def test_status_snapshot() -> None:
    handler = in_session(wants("a", "b"))
    answer(handler, handler.build_request(wants("a", "b")))
    status = handler.status()
    assert status.node_id == 1
    assert status.sessions_enabled
    assert (status.session_id, status.next_epoch, status.is_sessionful) == (SESSION, 2, True)
    assert status.partition_count == 2
    assert (status.full_requests, status.incremental_requests) == (1, 1)
    assert status.sessions_created == 1
    assert status.last_recovery is None


def test_plan_repr_is_a_summary() -> None:
    handler = FetchSessionHandler(node_id=1)
    text = repr(handler.build_request({tp("t", i): pf() for i in range(1000)}))
    assert "to_send=1000" in text
    assert len(text) < 300


# -- property tests against a strict model leader ----------------------------------------

POOL = [tp(t, p) for t in ("a", "b", "c") for p in range(3)]
TOPIC_IDS = {"a": [None, T_A, T_A2], "b": [T_B], "c": [None]}
FAULTS = [
    "none",
    "evict",  # the leader evicted the session before this request arrived
    "lose_response",  # the leader handled it, then the connection broke
    "lose_request",  # the connection broke before the leader saw it
    "duplicate_epoch",  # the leader answers 71 as if it saw a duplicate
    "server_error",  # some other top-level error, nothing applied
    "no_slot",  # a full request finds the cache full: sessionless answer
    "extra_partition",  # a buggy leader names a partition we never asked for
    "omit_partition",  # a full response leaves a partition out
    "throttle",  # KIP-219: an empty throttled full response
]


# Like Kafka's leader, the model keys a v13+ session by (topic id, partition) and an older
# one by name (topic id None): under v13 a recreated topic is a different partition.
ModelKey = tuple[uuid.UUID | None, TopicPartition]


@dataclass
class ModelSession:
    epoch: int
    partitions: dict[ModelKey, PartitionFetch]
    uses_topic_ids: bool

    def key(self, partition: TopicPartition, topic_id: uuid.UUID | None) -> ModelKey:
        return (topic_id if self.uses_topic_ids else None, partition)

    def by_name(self) -> dict[TopicPartition, PartitionFetch]:
        view = {part: data for (_, part), data in self.partitions.items()}
        assert len(view) == len(self.partitions), "a partition is held twice (stale topic id)"
        return view


@dataclass
class ModelLeader:
    """A correct, strict leader: it notes every request a real leader would refuse or that
    a correct client never sends, and otherwise behaves like Kafka's FetchManager."""

    sessions: dict[int, ModelSession] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    next_id: int = 100

    def fetch(
        self, plan: FetchRequestPlan, fault: str
    ) -> tuple[int, int, list[TopicPartition], int]:
        """(error_code, session_id, partitions, throttle_time_ms) for `plan`."""
        if fault == "evict":
            self.sessions.pop(plan.session_id, None)
        if fault in ("duplicate_epoch", "server_error"):
            code = (
                ErrorCode.invalid_fetch_session_epoch
                if fault == "duplicate_epoch"
                else ErrorCode.unknown_server_error
            )
            return code, 0, [], 0
        if plan.is_full:
            return self._full(plan, fault)
        return self._incremental(plan, fault)

    def _full(
        self, plan: FetchRequestPlan, fault: str
    ) -> tuple[int, int, list[TopicPartition], int]:
        if plan.to_forget or plan.to_replace:
            self.violations.append("full request with forgotten partitions")
        self.sessions.pop(plan.session_id, None)
        if fault == "throttle":
            return 0, 0, [], 100
        returned = list(plan.to_send)
        if fault == "omit_partition" and returned:
            returned = returned[1:]
        if fault == "extra_partition":
            returned.append(tp("zzz"))
        if plan.epoch == FINAL_EPOCH or fault == "no_slot":
            return 0, 0, returned, 0
        self.next_id += 1
        session = ModelSession(epoch=1, partitions={}, uses_topic_ids=plan.uses_topic_ids)
        for part, data in plan.to_send.items():
            session.partitions[session.key(part, data.topic_id)] = data
        self.sessions[self.next_id] = session
        return 0, self.next_id, returned, 0

    def _incremental(
        self, plan: FetchRequestPlan, fault: str
    ) -> tuple[int, int, list[TopicPartition], int]:
        session = self.sessions.get(plan.session_id)
        if session is None:
            return ErrorCode.fetch_session_id_not_found, 0, [], 0
        if session.epoch != plan.epoch:
            self.violations.append(f"epoch {plan.epoch}, leader expects {session.epoch}")
            return ErrorCode.invalid_fetch_session_epoch, 0, [], 0
        if session.uses_topic_ids != plan.uses_topic_ids:
            self.violations.append("topic id use flipped inside a session")
            return ErrorCode.fetch_session_topic_id_error, 0, [], 0
        held = session.partitions
        forgotten = (
            plan.forgotten_for_topic_ids()
            if plan.uses_topic_ids
            else [TopicIdPartition(None, part) for part in plan.to_forget]
        )
        forget_keys = [session.key(f.partition, f.topic_id) for f in forgotten]
        for key in forget_keys:
            if key not in held:
                self.violations.append(f"forgets {key}, not in the session")
        for part, data in plan.to_send.items():
            key = session.key(part, data.topic_id)
            if key in forget_keys:
                self.violations.append(f"sends and forgets {key}")
            if held.get(key) == data:
                self.violations.append(f"incremental request re-sends unchanged {key}")
            held[key] = data
        for key in forget_keys:
            held.pop(key, None)
        if not held:
            # Nothing left: the session is removed and the answer is sessionless.
            del self.sessions[plan.session_id]
            session_id, returned = 0, list(plan.to_send)
        else:
            session.epoch = next_epoch(session.epoch)
            names = list(session.by_name())
            session_id, returned = plan.session_id, names[::2]
        if fault == "extra_partition":
            returned.append(tp("zzz"))
        return 0, session_id, returned, 0


FIELDS = [
    "fetch_offset",
    "log_start_offset",
    "max_bytes",
    "current_leader_epoch",
    "last_fetched_epoch",
]
# Partitions to change, remove or re-id are picked among those wanted (index modulo size),
# so most mutations hit the session rather than missing it.
mutation = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(POOL)),
    st.tuples(st.just("remove"), st.integers(0, 8)),
    st.tuples(st.just("change"), st.integers(0, 8), st.sampled_from(FIELDS)),
    st.tuples(st.just("topic_id"), st.integers(0, 8), st.integers(0, 2)),
    st.tuples(st.just("rotate"), st.integers(0, 8)),
)
# Most rounds go well, so sessions live long enough to be tested; faults are the spice.
fault = st.one_of(st.just("none"), st.just("none"), st.just("none"), st.sampled_from(FAULTS))
steps = st.lists(
    st.tuples(st.lists(mutation, max_size=3), fault, st.booleans()),
    min_size=1,
    max_size=40,
)


def mutate(
    want: dict[TopicPartition, PartitionFetch], op: tuple
) -> dict[TopicPartition, PartitionFetch]:  # type: ignore[type-arg]
    want = dict(want)
    kind, *args = op
    if kind == "add":
        key = args[0]
        if key not in want:
            want[key] = pf(topic_id=TOPIC_IDS[key.topic][1 % len(TOPIC_IDS[key.topic])])
        return want
    if not want:
        return want
    keys = list(want)
    key = keys[args[0] % len(keys)]
    if kind == "remove":
        del want[key]
    elif kind == "change":
        name = args[1]
        want[key] = replace(want[key], **{name: getattr(want[key], name) + 1})
    elif kind == "topic_id":
        ids = TOPIC_IDS[key.topic]
        want[key] = replace(want[key], topic_id=ids[args[1] % len(ids)])
    elif kind == "rotate":
        n = args[0] % len(keys)
        want = {k: want[k] for k in keys[n:] + keys[:n]}
    return want


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, sessions_enabled=st.booleans())
def test_random_sequences_never_build_a_request_a_correct_leader_refuses(
    steps: list,
    sessions_enabled: bool,  # type: ignore[type-arg]
) -> None:
    leader = ModelLeader()
    handler = FetchSessionHandler(node_id=7, sessions_enabled=sessions_enabled)
    want: dict[TopicPartition, PartitionFetch] = {}
    now = 0
    for mutations, fault, _ in steps:
        for op in mutations:
            want = mutate(want, op)
        now += 10
        plan = handler.build_request(want)
        assert {**plan.session_partitions} == want, "the plan lost track of a partition"
        planned = list(plan.session_partitions.items())
        # Topic ids (rule 4), against the whole session after the plan: what the handler
        # keeps O(changes) uses ids only where every partition has one, and then names
        # every topic. (A session that could use ids but did not keeps not using them:
        # a flip would need a full request.)
        names: dict[uuid.UUID, str] = {}
        for part, data in planned:
            if data.topic_id is not None:
                names.setdefault(data.topic_id, part.topic)
        if plan.uses_topic_ids:
            assert all(pf.topic_id is not None for _, pf in planned)
            assert all(f.topic_id is not None for f in plan.to_forget_ids)
            assert dict(plan.topic_names) == names
        else:
            assert dict(plan.topic_names) == {}
        if not sessions_enabled:
            assert (plan.session_id, plan.epoch) == (0, FINAL_EPOCH)
        if fault == "lose_request":
            verdict = handler.handle_send_error(now_ms=now)
            assert not verdict.accepted
            continue
        error, session_id, returned, throttle = leader.fetch(plan, fault)
        if fault == "lose_response":
            handler.handle_send_error(now_ms=now)
            continue
        verdict = handler.handle_response(
            plan,
            error_code=error,
            session_id=session_id,
            partitions=returned,
            now_ms=now,
            throttle_time_ms=throttle,
        )
        if fault == "extra_partition" or error != 0:
            assert not verdict.accepted
        if verdict.accepted and handler.is_sessionful:
            # The leader fetches exactly what the follower wants, field for field.
            assert leader.sessions[handler.session_id].by_name() == want
            assert dict(handler.session_partitions) == want
            # ...in the order the plan said (rule 1: changes applied in place).
            assert list(handler.session_partitions.items()) == planned
            assert leader.sessions[handler.session_id].epoch == handler.epoch
        elif verdict.accepted and plan.is_full:
            # Sessionless: the request itself named everything wanted.
            assert dict(plan.to_send) == want
        elif verdict.accepted:
            # The leader closed the session because the request forgot everything.
            assert verdict.reason is RecoveryReason.SESSION_CLOSED_BY_LEADER
            assert want == {}
    assert leader.violations == []
    if not sessions_enabled:
        assert leader.sessions == {}


@settings(max_examples=200, deadline=None)
@given(steps=steps)
def test_after_any_failure_the_next_request_is_full_and_complete(steps: list) -> None:  # type: ignore[type-arg]
    leader = ModelLeader()
    handler = FetchSessionHandler(node_id=7)
    want: dict[TopicPartition, PartitionFetch] = {}
    for mutations, fault, change_before_retry in steps:
        for op in mutations:
            want = mutate(want, op)
        plan = handler.build_request(want)
        if fault in ("lose_request", "lose_response"):
            if fault == "lose_response":
                leader.fetch(plan, "none")
            verdict = handler.handle_send_error(now_ms=0)
        else:
            error, session_id, returned, throttle = leader.fetch(plan, fault)
            verdict = handler.handle_response(
                plan,
                error_code=error,
                session_id=session_id,
                partitions=returned,
                now_ms=0,
                throttle_time_ms=throttle,
            )
        if not verdict.accepted:
            if change_before_retry and want:
                want = mutate(want, ("remove", 0))
            retry = handler.build_request(want)
            assert retry.is_full
            assert dict(retry.to_send) == want
            assert retry.epoch == INITIAL_EPOCH
            # Closing the old session, if there was one, is part of the same request.
            assert retry.session_id in (0, plan.session_id)
            handler.handle_send_error(now_ms=0)


# -- against a real Apache Kafka broker ----------------------------------------------------


class KafkaFetcher:
    """The least a shell needs to put plans on the wire: Fetch v12, topics by name."""

    VERSION = 12

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def send(self, plan: FetchRequestPlan) -> Any:
        spec = FetchRequest(
            max_wait_ms=50,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            partitions=tuple(
                RequestedPartition.of(
                    key, data.fetch_offset, data.max_bytes, log_start_offset=data.log_start_offset
                )
                for key, data in plan.to_send.items()
            ),
            forgotten=tuple(
                ForgottenPartition(tp.topic, None, tp.partition) for tp in plan.to_forget
            ),
        )
        return await self.connection.request(fetch_request(self.VERSION, spec))

    async def round(
        self, handler: FetchSessionHandler, want: Mapping[TopicPartition, PartitionFetch]
    ) -> tuple[FetchRequestPlan, ResponseVerdict, dict[TopicPartition, Any]]:
        plan = handler.build_request(want)
        body = await self.send(plan)
        returned = {
            TopicPartition(topic.topic, int(part.partition_index)): part
            for topic in body.responses
            for part in topic.partitions
        }
        verdict = handler.handle_response(
            plan,
            error_code=int(body.error_code),
            session_id=int(body.session_id),
            partitions=list(returned),
            now_ms=0,
        )
        return plan, verdict, returned


async def test_a_real_kafka_broker_accepts_every_plan_and_the_recoveries_work(
    kafka_broker: Any, unique_topic: str
) -> None:
    from replicad.protocol.connection import BrokerAddress, BrokerConnection
    from tools.peers.produce import CheckedProducer

    partitions = 20
    kafka_broker.create_topic(unique_topic, partitions)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap})
    keys = [tp(unique_topic, p) for p in range(partitions)]
    address = BrokerAddress(1, "127.0.0.1", kafka_broker.port)
    ours = BrokerConnection(address, client_id="h", connect_timeout_s=10, request_timeout_s=30)
    other = BrokerConnection(address, client_id="x", connect_timeout_s=10, request_timeout_s=30)
    await ours.connect()
    await other.connect()
    try:
        fetcher, meddler = KafkaFetcher(ours), KafkaFetcher(other)
        handler = FetchSessionHandler(node_id=1)
        want = {key: pf() for key in keys}

        plan, verdict, returned = await fetcher.round(handler, want)
        assert plan.is_full and verdict.accepted and verdict.next_session_id != 0
        assert set(returned) == set(keys)
        first_id = handler.session_id
        idle_sent = ours.bytes_sent
        plan, verdict, returned = await fetcher.round(handler, want)
        assert not plan.is_full and verdict.accepted and returned == {}
        assert ours.bytes_sent - idle_sent < 100  # no partitions named at all

        # Someone else advances our session's epoch: Kafka answers 71 to our next request.
        stale = FetchRequestPlan(handler.session_id, handler.epoch, False, {}, (), {})
        assert (await meddler.send(stale)).error_code == 0
        plan, verdict, _ = await fetcher.round(handler, want)
        assert verdict.reason is RecoveryReason.INVALID_FETCH_SESSION_EPOCH
        assert (verdict.next_session_id, verdict.next_epoch) == (first_id, INITIAL_EPOCH)
        plan, verdict, returned = await fetcher.round(handler, want)
        assert plan.is_full and verdict.accepted and set(returned) == set(keys)
        assert handler.session_id not in (0, first_id)

        # Someone else closes our session: Kafka answers 70, we start over.
        close = FetchRequestPlan(handler.session_id, FINAL_EPOCH, True, {}, (), {})
        assert (await meddler.send(close)).error_code == 0
        plan, verdict, _ = await fetcher.round(handler, want)
        assert verdict.reason is RecoveryReason.FETCH_SESSION_ID_NOT_FOUND
        plan, verdict, _ = await fetcher.round(handler, want)
        assert (plan.session_id, plan.epoch) == (0, 0) and verdict.accepted

        # Forget half; new data arrives only for partitions still wanted.
        kept = {key: pf() for key in keys[:10]}
        plan, verdict, _ = await fetcher.round(handler, kept)
        assert len(plan.to_forget) == 10 and verdict.accepted
        producer.produce(unique_topic, b"kept", partition=3)
        producer.produce(unique_topic, b"dropped", partition=15)
        producer.flush(10)
        seen: set[TopicPartition] = set()
        for _ in range(50):
            plan, verdict, returned = await fetcher.round(handler, kept)
            assert not plan.is_full and verdict.accepted
            seen |= {key for key, part in returned.items() if part.records}
            if seen:
                break
        assert seen == {tp(unique_topic, 3)}

        # Shutdown: FINAL_EPOCH closes it on the broker.
        session_id, epoch = handler.session_id, handler.epoch
        closing = handler.close_request()
        assert closing is not None
        assert (await fetcher.send(closing)).error_code == 0
        gone = FetchRequestPlan(session_id, epoch, False, {}, (), {})
        assert (await meddler.send(gone)).error_code == ErrorCode.fetch_session_id_not_found
    finally:
        await ours.close()
        await other.close()


# -- changes reported by the caller (rule 3, O(changes)) -------------------------------

_PARTS = [tp(t, p) for t in ("a", "b") for p in range(4)]
_IDS = {"a": T_A, "b": T_B}
_step = st.tuples(
    st.sampled_from(["offset", "add", "remove", "recreate", "unsent", "reject"]),
    st.sampled_from(_PARTS),
    st.integers(0, 50),
)


def _plan_facts(plan: FetchRequestPlan) -> tuple[object, ...]:
    return (
        plan.session_id,
        plan.epoch,
        plan.is_full,
        dict(plan.to_send),
        set(plan.to_forget),
        set(plan.to_replace),
        list(plan.session_partitions.items()),
        plan.uses_topic_ids,
        dict(plan.topic_names),
    )


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_step, min_size=1, max_size=25))
def test_reported_changes_build_the_same_requests_as_comparing_everything(steps) -> None:
    """Two handlers, one told what changed, one comparing every partition, fed the same
    wanted partitions and answers: their requests hold the same partitions, the same
    forgotten and replaced ones, the same session, in the same session order."""
    told, compares = FetchSessionHandler(node_id=1), FetchSessionHandler(node_id=1)
    wanted = {p: pf(0, topic_id=_IDS[p.topic]) for p in _PARTS[:3]}
    answer(told, told.build_request(wanted, changed=list(wanted)))
    answer(compares, compares.build_request(wanted))
    changed: list[TopicPartition] = []
    for action, part, value in steps:
        if action == "offset" and part in wanted:
            wanted[part] = replace(wanted[part], fetch_offset=value)
        elif action == "add" and part not in wanted:
            wanted[part] = pf(value, topic_id=_IDS[part.topic])
        elif action == "remove":
            wanted.pop(part, None)
        elif action == "recreate" and part in wanted:
            wanted[part] = replace(wanted[part], topic_id=uuid.UUID(int=value + 100))
        else:
            changed.append(part)  # a report of no change costs nothing
        changed.append(part)
        ours = told.build_request(wanted, changed=changed)
        theirs = compares.build_request(wanted)
        changed = []
        assert _plan_facts(ours) == _plan_facts(theirs)
        if action == "unsent":
            continue  # built, never sent: the next build must still carry these changes
        error = ErrorCode.invalid_fetch_session_epoch if action == "reject" else 0
        assert answer(told, ours, error_code=error) == answer(compares, theirs, error_code=error)


def test_a_change_in_a_plan_never_sent_is_sent_with_the_next_one() -> None:
    want = wants("a", "b")
    handler = in_session(want)
    want[tp("a")] = pf(7)
    handler.build_request(want, changed=[tp("a")])  # lost before it was sent
    plan = handler.build_request(want, changed=[])
    assert dict(plan.to_send) == {tp("a"): pf(7)}
