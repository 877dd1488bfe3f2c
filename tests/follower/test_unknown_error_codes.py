"""A broker newer than us: an error code this version does not know, in one partition of a
ListOffsets, OffsetForLeaderEpoch or Metadata answer, is read as UNKNOWN_SERVER_ERROR for
that partition alone (Kafka's rule). It is counted and retried there, while the leader's
other partitions replicate on the same connections.

Real peer: Apache Kafka, behind the chaos proxy, which puts code 777 into partition 0 of
every answer of one API until it is healed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from replicad.control.client import query
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import RequestHead, encode_entities
from tools.chaos.frames import (
    NewerErrorCode,
    decode_response,
    with_partition_error,
)
from tools.chaos.proxy import ChaosProxy
from tools.peers.produce import produce_numbered
from tools.replica import ReplicadProcess, replicad_run, topic_ends

NEWER = 777
PARTITIONS = 3
UNKNOWN_LOGGED = "error code unknown to this version, read as UNKNOWN_SERVER_ERROR"


def produce(bootstrap: str, topic: str, per_partition: int) -> None:
    produce_numbered(bootstrap, topic, PARTITIONS, per_partition)


def newer_code_in_partition_0(api_key: ApiKey) -> Callable[[RequestHead, bytes], bytes]:
    def rewrite(head: RequestHead, body: bytes) -> bytes:
        header, entity = decode_response(body, api_key, head.api_version)
        entity = with_partition_error(entity, 0, NewerErrorCode(NEWER))
        return encode_entities(header, entity)

    return rewrite


def fetch_below_v12(head: RequestHead, body: bytes) -> bytes:
    """ApiVersions saying Fetch v11 at most: the follower asks OffsetForLeaderEpoch."""
    header, entity = decode_response(body, ApiKey.API_VERSIONS, head.api_version)
    keys = tuple(
        dataclasses.replace(k, max_version=type(k.max_version)(11))
        if int(k.api_key) == ApiKey.FETCH
        else k
        for k in entity.api_keys
    )
    return encode_entities(header, dataclasses.replace(entity, api_keys=keys))


def partition_status(sock: Path, topic: str, partition: int) -> dict:
    for p in query(sock)["partitions"]:
        if p["topic"] == topic and p["partition"] == partition:
            return p
    raise AssertionError(f"{topic}-{partition} not in the status")


def replicad(bootstrap: str, topic: str, tmp_path: Path, name: str) -> ReplicadProcess:
    return replicad_run(
        bootstrap,
        topic,
        tmp_path / "data",
        log_path=tmp_path / f"{name}.log",
        control_socket=tmp_path / "replicad.sock",
    )


def all_replicated(proc: ReplicadProcess, data_dir: Path, topic: str, end: int, what: str) -> None:
    """Wait for every partition of `topic` to be replicated up to `end`."""
    proc.wait_for(
        lambda: topic_ends(data_dir, topic) == dict.fromkeys(range(PARTITIONS), end),
        timeout_s=60,
        what=what,
    )


def others_replicate_while_0_fails(
    proc: ReplicadProcess, tmp_path: Path, topic: str, end: int, api: str
) -> None:
    """Partitions 1 and 2 replicate up to `end` while partition 0 reports that `api` answered
    it UNKNOWN_SERVER_ERROR."""
    data_dir, sock = tmp_path / "data", tmp_path / "replicad.sock"
    proc.wait_for(
        lambda: {p: e for p, e in topic_ends(data_dir, topic).items() if p} == {1: end, 2: end},
        timeout_s=60,
        what=f"partitions 1 and 2 to replicate up to {end}",
    )
    proc.wait_for(
        lambda: partition_status(sock, topic, 0)["last_error"] == f"{api} unknown_server_error",
        timeout_s=30,
        what="partition 0 to report the error",
    )


def test_list_offsets(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    produce(kafka_broker.bootstrap, topic, 50)
    data_dir, sock = tmp_path / "data", tmp_path / "replicad.sock"
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        proxy.rewrite_responses(ApiKey.LIST_OFFSETS, newer_code_in_partition_0(ApiKey.LIST_OFFSETS))
        with replicad(proxy.address, topic, tmp_path, "run") as proc:
            others_replicate_while_0_fails(proc, tmp_path, topic, 50, "ListOffsets")
            assert partition_status(sock, topic, 0)["state"] == "needs-offset"
            assert topic_ends(data_dir, topic).get(0, 0) == 0
            assert proc.logged(UNKNOWN_LOGGED)
            assert proxy.stats().rewritten >= 2  # asked more than once: retried
            proxy.heal()
            all_replicated(proc, data_dir, topic, 50, "partition 0 once the broker answers it")


def test_offset_for_leader_epoch(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    produce(kafka_broker.bootstrap, topic, 50)
    data_dir = tmp_path / "data"
    with replicad(kafka_broker.bootstrap, topic, tmp_path, "first") as first:
        all_replicated(first, data_dir, topic, 50, "the first run to replicate")
    produce(kafka_broker.bootstrap, topic, 20)
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        # Below Fetch v12 a restarted follower checks its data with OffsetForLeaderEpoch.
        proxy.rewrite_responses(ApiKey.API_VERSIONS, fetch_below_v12)
        proxy.rewrite_responses(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            newer_code_in_partition_0(ApiKey.OFFSET_FOR_LEADER_EPOCH),
        )
        with replicad(proxy.address, topic, tmp_path, "second") as proc:
            others_replicate_while_0_fails(proc, tmp_path, topic, 70, "OffsetForLeaderEpoch")
            assert topic_ends(data_dir, topic)[0] == 50
            assert proc.logged(UNKNOWN_LOGGED)
            proxy.heal()  # connections made since keep Fetch v11: asked again, answered
            all_replicated(proc, data_dir, topic, 70, "partition 0 once the broker answers it")


def test_metadata(kafka_broker, unique_topic, tmp_path):
    topic = unique_topic()
    kafka_broker.create_topic(topic, PARTITIONS)
    produce(kafka_broker.bootstrap, topic, 30)
    data_dir = tmp_path / "data"
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        proxy.rewrite_responses(ApiKey.METADATA, newer_code_in_partition_0(ApiKey.METADATA))
        with replicad(proxy.address, topic, tmp_path, "run") as proc:
            # The partition's leader is in the answer: its error alone does not stop it.
            all_replicated(proc, data_dir, topic, 30, "every partition to replicate")
            assert proc.logged(UNKNOWN_LOGGED)
            assert proxy.stats().rewritten >= 1
