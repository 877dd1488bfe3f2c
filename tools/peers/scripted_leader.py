"""A scripted single-partition Kafka leader, for what no real broker does on cue:
change its history (a leader change with divergence) while a follower watches.

It speaks just enough of the protocol, with kio's message types: ApiVersions,
Metadata v12, ListOffsets v7, OffsetForLeaderEpoch v4, and Fetch up to
`max_fetch_version` (12 by default, so DivergingEpoch is reported; 11 makes the
follower fall back to OffsetForLeaderEpoch). No sessions (session id 0).

Its log is a list of whole record batches; the test replaces it with
`set_log(batches, leader_epoch)`, as if another broker had taken over.

`fetch_faults` scripts how the next Fetches fail, one entry each, in order: "close" closes
the connection instead of answering (a broker going away), "silent" never answers it (a
broker that has the request and does not answer in time); `list_offsets_faults` the same
for ListOffsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import struct
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from replicad.protocol.apis import ApiKey
from replicad.protocol.requests import make_entity, nested_type
from replicad.records.batch import scan_batches

ZERO = datetime.timedelta(0)


@dataclass
class _Log:
    data: bytes = b""
    leader_epoch: int = 0
    # (epoch, start offset) from the batches' partition leader epochs, like Kafka's cache
    epochs: list[tuple[int, int]] = field(default_factory=list)
    end: int = 0


class ScriptedLeader:
    def __init__(self, topic: str, *, node_id: int = 1, max_fetch_version: int = 12) -> None:
        self.topic = topic
        self.topic_id = uuid.uuid4()
        self.node_id = node_id
        self.max_fetch_version = max_fetch_version
        self.log = _Log()
        self.port = 0
        self.requests: list[tuple[int, int]] = []  # (api key, version) as received
        self.diverging_answers = 0
        self.fetch_faults: list[str] = []
        self.list_offsets_faults: list[str] = []
        self._server: asyncio.Server | None = None

    def set_log(self, batches: list[bytes], leader_epoch: int) -> None:
        data = b"".join(batches)
        scan = scan_batches(memoryview(data))
        assert scan.valid_bytes == len(data), "the scripted log must be whole batches"
        epochs: list[tuple[int, int]] = []
        for b in scan.batches:
            if not epochs or b.partition_leader_epoch > epochs[-1][0]:
                epochs.append((b.partition_leader_epoch, b.base_offset))
        end = scan.batches[-1].next_offset if scan.batches else 0
        self.log = _Log(data, leader_epoch, epochs, end)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # -- the log's epoch arithmetic (Kafka's LeaderEpochFileCache.endOffsetFor) --------

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        entries = self.log.epochs
        if entries and entries[-1][0] == epoch:
            return epoch, self.log.end
        higher = [e for e in entries if e[0] > epoch]
        if not higher:
            return -1, -1
        floor = [e for e in entries if e[0] <= epoch]
        return (floor[-1][0] if floor else epoch), higher[0][1]

    # -- protocol -----------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                api_key, version = struct.unpack_from(">hh", frame)
                self.requests.append((api_key, version))
                faults = {
                    ApiKey.FETCH: self.fetch_faults,
                    ApiKey.LIST_OFFSETS: self.list_offsets_faults,
                }.get(api_key)
                if faults:
                    fault = faults.pop(0)
                    if fault == "close":
                        break
                    assert fault == "silent", fault
                    continue
                req_cls = load_request_schema(api_key, version)
                header, used = entity_reader(req_cls.__header_schema__)(frame, 0)
                body, _ = entity_reader(req_cls)(frame, used)
                resp_cls = load_response_schema(api_key, version)
                answer = self._answer(api_key, resp_cls, body)
                buf = io.BytesIO()
                entity_writer(resp_cls.__header_schema__)(
                    buf, resp_cls.__header_schema__(correlation_id=header.correlation_id)
                )
                entity_writer(resp_cls)(buf, answer)
                out = buf.getvalue()
                writer.write(struct.pack(">i", len(out)) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, api_key: int, cls: type, body: Any) -> Any:
        if api_key == ApiKey.API_VERSIONS:
            av = nested_type(cls, "ApiVersion")
            keys = [
                (ApiKey.FETCH, 4, self.max_fetch_version),
                (ApiKey.LIST_OFFSETS, 1, 7),
                (ApiKey.METADATA, 4, 12),
                (ApiKey.API_VERSIONS, 0, 3),
                (ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4),
            ]
            return make_entity(
                cls,
                error_code=ErrorCode.none,
                api_keys=tuple(
                    make_entity(av, api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys
                ),
                throttle_time=ZERO,
                supported_features=(),
                finalized_features_epoch=-1,
                finalized_features=(),
                zk_migration_ready=False,
            )
        if api_key == ApiKey.METADATA:
            part = make_entity(
                nested_type(cls, "MetadataResponsePartition"),
                error_code=ErrorCode.none,
                partition_index=0,
                leader_id=self.node_id,
                leader_epoch=self.log.leader_epoch,
                replica_nodes=(self.node_id,),
                isr_nodes=(self.node_id,),
                offline_replicas=(),
            )
            topic = make_entity(
                nested_type(cls, "MetadataResponseTopic"),
                error_code=ErrorCode.none,
                name=self.topic,
                topic_id=self.topic_id,
                is_internal=False,
                partitions=(part,),
                topic_authorized_operations=-2147483648,
            )
            broker = make_entity(
                nested_type(cls, "MetadataResponseBroker"),
                node_id=self.node_id,
                host="127.0.0.1",
                port=self.port,
                rack=None,
            )
            return make_entity(
                cls,
                throttle_time=ZERO,
                brokers=(broker,),
                cluster_id="scripted",
                controller_id=self.node_id,
                topics=(topic,),
                cluster_authorized_operations=-2147483648,
            )
        if api_key == ApiKey.LIST_OFFSETS:
            p = body.topics[0].partitions[0]
            offset = 0 if p.timestamp == -2 else self.log.end
            part = make_entity(
                nested_type(cls, "ListOffsetsPartitionResponse"),
                partition_index=0,
                error_code=ErrorCode.none,
                timestamp=-1,
                offset=offset,
                leader_epoch=self.log.leader_epoch,
            )
            topic = make_entity(
                nested_type(cls, "ListOffsetsTopicResponse"), name=self.topic, partitions=(part,)
            )
            return make_entity(cls, throttle_time=ZERO, topics=(topic,))
        if api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            p = body.topics[0].partitions[0]
            epoch, end = self.end_offset_for(int(p.leader_epoch))
            part = make_entity(
                nested_type(cls, "EpochEndOffset"),
                error_code=ErrorCode.none,
                partition=0,
                leader_epoch=epoch,
                end_offset=end,
            )
            topic = make_entity(
                nested_type(cls, "OffsetForLeaderTopicResult"), topic=self.topic, partitions=(part,)
            )
            return make_entity(cls, throttle_time=ZERO, topics=(topic,))
        if api_key == ApiKey.FETCH:
            return self._fetch(cls, body)
        raise AssertionError(f"scripted leader got api {api_key}")

    def _fetch(self, cls: type, body: Any) -> Any:
        req = body.topics[0].partitions[0]
        offset = int(req.fetch_offset)
        error = ErrorCode.none
        records = b""
        diverging = None
        current = int(getattr(req, "current_leader_epoch", -1))
        last_fetched = int(getattr(req, "last_fetched_epoch", -1))
        if current > self.log.leader_epoch:
            error = ErrorCode.unknown_leader_epoch
        elif 0 <= current < self.log.leader_epoch:
            error = ErrorCode.fenced_leader_epoch
        elif (
            last_fetched >= 0
            and self.end_offset_for(last_fetched)[1] != -1
            and (
                self.end_offset_for(last_fetched)[1] < offset
                or self.end_offset_for(last_fetched)[0] < last_fetched
            )
        ):
            diverging = self.end_offset_for(last_fetched)
            self.diverging_answers += 1
        elif offset > self.log.end:
            error = ErrorCode.offset_out_of_range
        else:
            scan = scan_batches(memoryview(self.log.data))
            kept = [b for b in scan.batches if b.last_offset >= offset]
            budget = int(req.partition_max_bytes)
            out = []
            for b in kept:
                if out and sum(x.size for x in out) + b.size > budget:
                    break
                out.append(b)
            if out:
                records = self.log.data[out[0].position : out[-1].position + out[-1].size]
        epoch_cls = getattr(sys.modules[cls.__module__], "EpochEndOffset", None)  # v12+
        values: dict[str, Any] = dict(
            partition_index=0,
            error_code=error,
            high_watermark=self.log.end,
            last_stable_offset=self.log.end,
            log_start_offset=0,
            aborted_transactions=(),
            preferred_read_replica=-1,
            records=records,
        )
        if epoch_cls is not None:
            epoch, end = diverging if diverging else (-1, -1)
            values["diverging_epoch"] = epoch_cls(epoch=epoch, end_offset=end)
        part = make_entity(nested_type(cls, "PartitionData"), **values)
        topic = make_entity(
            nested_type(cls, "FetchableTopicResponse"),
            topic=self.topic,
            topic_id=self.topic_id,
            partitions=(part,),
        )
        return make_entity(
            cls,
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(topic,),
            node_endpoints=(),
        )
