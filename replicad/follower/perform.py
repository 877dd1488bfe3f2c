"""Perform a PartitionTable's actions on the log store, and tell the table how each went.

Shared by the asyncio shell (`fetcher.py`) and the deterministic simulation
(`tools/sim`), so both run the same path from decision to disk. Synchronous: appends
and truncations run without awaiting, so a checkpoint never sees half of one.

Rules:
- Actions run in the order given; each log-changing action is followed by the table's
  outcome handler before the next one (a Truncate's new log end is what the next
  decision about that partition sees).
- A failed append is the table's to handle (`append_failed`); nothing a disk does
  raises out of here except a bug.
- Every append, truncation or high-watermark move is reported through `changed`
  (replicad serve wakes its long-polls and its session cache from it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from replicad.errors import DiskFullError, LogError
from replicad.follower.actions import (
    Action,
    Append,
    Halt,
    RequestMetadata,
    SetHighWatermark,
    StartAt,
    Truncate,
)
from replicad.follower.partition_table import PartitionTable
from replicad.types import TopicPartition


class ActionPerformer:
    def __init__(
        self,
        table: PartitionTable,
        *,
        request_metadata: Callable[[str], None],
        changed: Callable[[TopicPartition], None],
        wall_ms: Callable[[], int],
    ) -> None:
        self.table = table
        self._request_metadata = request_metadata
        self._changed = changed
        self._wall_ms = wall_ms

    def perform(self, actions: Iterable[Action], now_ms: int) -> None:
        todo = deque(actions)
        table = self.table
        while todo:
            action = todo.popleft()
            if isinstance(action, RequestMetadata):
                self._request_metadata(action.reason)
                continue
            state = table.partitions.get(action.tp)
            if state is None:
                continue  # moved to another leader since the decision
            local = state.log
            match action:
                case Append(fetched=fetched):
                    try:
                        if fetched.restart_at is not None:
                            local.truncate_fully_and_start_at(fetched.restart_at)
                        local.append(fetched.data, fetched.batches, now_ms=self._wall_ms())
                    except DiskFullError as exc:
                        table.append_failed(action, str(exc), now_ms, disk_full=True)
                        continue
                    except LogError as exc:
                        table.append_failed(action, str(exc), now_ms, disk_full=False)
                        continue
                    todo.extendleft(reversed(table.appended(action, now_ms)))
                case Truncate(offset=offset):
                    local.truncate_to(offset)
                    todo.extendleft(reversed(table.truncated(action)))
                case StartAt(offset=offset):
                    local.truncate_fully_and_start_at(offset)
                    todo.extendleft(reversed(table.truncated(action)))
                case SetHighWatermark(high_watermark=hw):
                    local.high_watermark = hw
                case Halt():
                    pass  # the table logged why; status shows it (changed below)
            self._changed(action.tp)
