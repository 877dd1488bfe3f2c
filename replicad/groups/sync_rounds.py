"""The loop both consumer-group syncs run (the asyncio shell they share): the mirror's into
the destination Kafka (mirror/group_sync_shell.py) and serve's into its own coordinator
(leader/source_group_sync.py). One round every `groups.sync_interval_ms` until stopped,
and the source listing each round begins with; what a round does is each sync's own.

Rules:
- A round that fails for a reason outside replicad (`OUTSIDE`: a cluster unreachable or
  answering wrongly, a timeout, the disk) is `problem` until a round succeeds, is said at
  most once a minute, and is tried again next interval.
- Any other exception is a bug of ours: said with its traceback, named in `problem`
  ("internal error: ..."), and the loop goes on: replication, mirroring and serving never
  wait for a group sync.
- The listing: every source broker's groups, those `groups.include`/`exclude` choose whose
  protocol is a consumer's or none. A broker that did not answer is said (at most once a
  minute); its groups wait for a later round, and the listing says it is not complete.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from replicad.clock import monotonic_ms
from replicad.config.model import GroupsConfig
from replicad.errors import KafkaConnectionError, ProtocolError, ReplicadError
from replicad.groups.cluster_reader import ClusterGroupsReader, GroupListing
from replicad.ratelimit import RateLimitedLog

# Failures that are not ours: said briefly, tried again. ReplicadError covers the state
# files' errors (they name the file); KafkaConnectionError and ProtocolError are among them.
OUTSIDE = (KafkaConnectionError, ProtocolError, ReplicadError, TimeoutError, OSError)
SAY_EVERY_MS = 60_000


class SyncRounds:
    """One sync's loop, its `problem` and its rate-limited warnings (see the module
    docstring). `name` begins its log lines ("group sync", "serve's group sync")."""

    def __init__(self, config: GroupsConfig, log: Any, name: str) -> None:
        self.config = config
        self.log = log
        self.name = name
        self.problem: str | None = None
        self._said = RateLimitedLog(interval_ms=SAY_EVERY_MS)

    async def run(
        self,
        round_: Callable[[], Awaitable[None]],
        stop: asyncio.Event,
        failed: Callable[[str], None] | None = None,
    ) -> None:
        """`round_()` every interval until `stop`; `failed(problem)` after each failure."""
        while not stop.is_set():
            try:
                await round_()
                self.problem = None
            except OUTSIDE as exc:
                self.problem = str(exc)
                self.warn("round", f"{self.name}: round failed; tried again", error=str(exc))
            except Exception as exc:
                self.problem = f"internal error: {type(exc).__name__}: {exc}"
                self.log.exception(f"{self.name}: round failed")
            if self.problem is not None and failed is not None:
                failed(self.problem)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.sync_interval_ms / 1000)

    async def chosen(self, reader: ClusterGroupsReader) -> tuple[GroupListing, list[str]]:
        """The source's listing and the ids of the groups the config chooses in it."""
        listing = await reader.list_groups()
        if not listing.complete:
            self.warn(
                "listing",
                "source brokers did not list their groups; those groups wait",
                brokers=dict(listing.unreachable),
            )
        return listing, listing.consumer_groups(self.config.selects)

    def warn(self, key: str, event: str, **fields: Any) -> None:
        """`event` as a warning, at most once a minute per `key`."""
        if self._said.should_emit(key, monotonic_ms()).emit:
            self.log.warning(event, **fields)
