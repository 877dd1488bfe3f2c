"""The shell of `replicad run`'s continuous check (`verify:` with enabled: true).

Pass after pass, `interval_ms` apart: the partitions the daemon's log store holds are
handed to the core (progress.py), which says what to walk; each walk is compare.py's
`PartitionCheck` driven by source.py's `SourceReader` (its own client and connections,
sessionless fetches paced at `max_bytes_per_second`), the replica read through its
`PartitionLog` on a worker thread (log_replica.py), never on the event loop. One partition
and one request at a time: memory is one answer and the replica's bytes for it, plus a
small record per partition.

A new mismatch is logged as an error at once; status (and the metrics) show the core's
snapshot. The verified offsets are saved after a pass that moved them
(`verify-offset-checkpoint` in the data directory, Kafka's checkpoint format, written on a
worker thread) and read back at the first pass. A pass that fails for a reason nobody
planned for is logged and the next pass tried: the check must never stop the replication
it watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from replicad.clock import monotonic_ms
from replicad.config.model import Config, VerifyConfig
from replicad.errors import KafkaConnectionError, LogError, ProtocolError
from replicad.log.checkpoint import format_offsets, parse_offsets, read_text, write_atomically
from replicad.protocol.client import ClientSettings
from replicad.types import TopicPartition
from replicad.verify.compare import Mismatch, OffsetRange, PartitionCheck, PartitionResult
from replicad.verify.log_replica import LogReplica, ReplicaMoved
from replicad.verify.progress import VerifyProgress
from replicad.verify.source import SourceReader

if TYPE_CHECKING:
    from replicad.log.manager import LogManager

log = structlog.get_logger("replicad.verify")

# In the data directory, beside Kafka's own checkpoint files (which nothing else reads).
VERIFY_CHECKPOINT = "verify-offset-checkpoint"


@dataclass(frozen=True, slots=True)
class ContinuousSettings:
    bootstrap_servers: tuple[str, ...]
    client: ClientSettings
    verify: VerifyConfig

    @classmethod
    def from_config(cls, config: Config) -> ContinuousSettings:
        """The source as `replicad run` reaches it (its TLS and SASL too), and `verify:`."""
        return cls(
            tuple(str(b) for b in config.source.bootstrap_servers),
            ClientSettings.from_config(config.source),
            config.verify,
        )


class ContinuousVerifier:
    def __init__(self, settings: ContinuousSettings, *, seed: int | None = None) -> None:
        self.settings = settings
        self.progress = VerifyProgress(settings.verify.topics, settings.verify.sample)
        self._rng = random.Random(seed)
        self.running = False
        self.source: SourceReader | None = None
        self._saved: dict[TopicPartition, int] | None = None  # None: not read yet

    async def run(self, logs: Callable[[], LogManager | None], stop: asyncio.Event) -> None:
        config = self.settings.verify
        self.source = SourceReader(
            self.settings.bootstrap_servers,
            self.settings.client,
            fetch_max_bytes=config.fetch_max_bytes,
            max_bytes_per_second=config.max_bytes_per_second,
        )
        self.running = True
        try:
            while not stop.is_set():
                manager = logs()
                if manager is not None:
                    try:
                        await self._pass(self.source, manager, stop)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # see the module's docstring
                        log.exception("verify: the pass failed; trying again next pass")
                        self.progress.problem = f"the last pass failed: {exc!r}"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), config.interval_ms / 1000)
        finally:
            self.running = False
            await self.source.close()

    async def _pass(self, source: SourceReader, manager: LogManager, stop: asyncio.Event) -> None:
        path = manager.data_dir / VERIFY_CHECKPOINT
        if self._saved is None:
            self._saved = await asyncio.to_thread(_read_checkpoint, path)
            self.progress.resume(self._saved)
        await self._walk_all(source, manager, stop)
        saved = self.progress.checkpoint()
        if saved != self._saved:
            await asyncio.to_thread(write_atomically, path, format_offsets(saved))
            self._saved = saved

    async def _walk_all(
        self, source: SourceReader, manager: LogManager, stop: asyncio.Event
    ) -> None:
        read_bytes = self.settings.verify.fetch_max_bytes
        replicas = {tp: LogReplica(plog, read_bytes) for tp, plog in manager.partitions().items()}
        plan = self.progress.plan({tp: r.offsets() for tp, r in replicas.items()})
        walks = {w.tp: w for w in plan}
        seed = self._rng.randrange(1 << 31)
        rechecks = {tp: self.progress.sample_offsets(tp, seed) for tp in self.progress.partitions}
        todo = sorted(set(walks) | {tp for tp, offsets in rechecks.items() if offsets})
        if not todo:
            self.progress.pass_done(monotonic_ms())
            return
        topics = sorted({tp.topic for tp in todo})
        try:
            await source.load_metadata(topics)
            compacted = await source.compacted(topics)
        except (KafkaConnectionError, ProtocolError, OSError) as exc:
            self.progress.problem = f"the source cannot be asked: {exc}"
            return
        self.progress.problem = None
        for tp in todo:
            if stop.is_set():
                return
            replica = replicas[tp]
            walk = walks.get(tp)
            if walk is not None:
                check = PartitionCheck(
                    tp, walk.replica, compacted=tp.topic in compacted, start=walk.start
                )
                result = await self._walk(source, check, replica)
                if result is not None:
                    self._found(self.progress.walked(result), tp, None)
            targets = await self._batch_starts(replica, rechecks.get(tp, []))
            if targets:
                proof = self.progress.partitions[tp]
                checked = OffsetRange(proof.log_start_offset, proof.verified_offset)
                check = PartitionCheck(
                    tp, checked, compacted=tp.topic in compacted, targets=targets
                )
                result = await self._walk(source, check, replica)
                if result is not None:
                    self._found(self.progress.walked(result, sampled=True), tp, seed)
        self.progress.pass_done(monotonic_ms())

    async def _walk(
        self, source: SourceReader, check: PartitionCheck, replica: LogReplica
    ) -> PartitionResult | None:
        async def read_replica(low: int, high: int) -> Any:
            return await asyncio.to_thread(replica.slice, low, high)

        try:
            return await source.walk(check, read_replica)
        except (ReplicaMoved, LogError, OSError) as exc:
            # Local retention (or a truncation) changed the log under the walk: nothing is
            # concluded from it; the next pass starts from the log as it is then.
            self.progress.skipped(check.result.tp, f"the replica moved during the walk: {exc}")
            return None

    async def _batch_starts(self, replica: LogReplica, offsets: Sequence[int]) -> list[int]:
        if not offsets:
            return []
        try:
            found = await asyncio.to_thread(lambda: [replica.batch_start(o) for o in offsets])
        except (ReplicaMoved, LogError, OSError):
            return []
        return sorted({o for o in found if o is not None})

    def _found(self, mismatches: list[Mismatch], tp: TopicPartition, seed: int | None) -> None:
        for m in mismatches:
            log.error(
                "verify: the replica differs from the source",
                tp=str(tp),
                offset=m.offset,
                last_offset=m.last_offset,
                kind=m.kind.value,
                detail=m.detail,
                **({"recheck_seed": seed} if seed is not None else {}),
            )

    def snapshot(self) -> dict[str, Any]:
        source = self.source
        return {
            **self.progress.snapshot(),
            "running": self.running,
            "max_bytes_per_second": self.settings.verify.max_bytes_per_second,
            "fetches": source.fetches if source is not None else 0,
            "bytes_fetched": source.fetched_bytes if source is not None else 0,
        }


def _read_checkpoint(path: Path) -> dict[TopicPartition, int]:
    try:
        text = read_text(path)
        return {} if text is None else parse_offsets(text, source=str(path))
    except LogError as exc:
        # Only where to start: a bad file costs walking the replica again, nothing else.
        log.warning("verify: saved offsets unreadable; walking from the log starts", error=str(exc))
        return {}
