"""Steady production into the source while faults happen: `produce_mixed` rounds (every
codec, transactions committed and aborted) from a background thread.

Each round is one `produce_mixed` call per topic with a new seed; a failed round (the
broker went away mid-round) is counted and the loop goes on after a pause. `pause()`
returns once the round in progress has finished, so a test can take the broker down
without a producer in the middle of a transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from tools.peers.produce import CODECS, produce_mixed

_log = logging.getLogger(__name__)

RETRY_PAUSE_S = 1.0

T = TypeVar("T")


class SteadyLoad:
    def __init__(
        self,
        bootstrap: str,
        topics: Mapping[str, int],
        *,
        records_per_round: int = 400,
        pause_s: float = 0.2,
        seed: int = 10_000,
        codecs: Sequence[str] = CODECS,
        max_batch_bytes: int | None = 256 * 1024,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = dict(topics)
        self.records_per_round = records_per_round
        self.pause_s = pause_s
        self.codecs = tuple(codecs)
        self.max_batch_bytes = max_batch_bytes
        self._seed = seed
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.records = 0
        self.failures: list[str] = []

    def start(self) -> SteadyLoad:
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)
        self._thread.start()
        return self

    def pause(self, timeout_s: float = 120) -> None:
        """Stop producing; returns once no round is in progress."""
        self._running.clear()
        self._idle.wait(timeout_s)

    def resume(self) -> None:
        self._running.set()

    def stop(self, timeout_s: float = 120) -> None:
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                return
            self._idle.clear()
            try:
                for topic, partitions in self.topics.items():
                    self._seed += 1
                    summary = produce_mixed(
                        self.bootstrap,
                        topic,
                        partitions=partitions,
                        records=self.records_per_round,
                        seed=self._seed,
                        codecs=self.codecs,
                        max_batch_bytes=self.max_batch_bytes,
                    )
                    self.records += summary.records
                self.rounds += 1
            except Exception as exc:  # the broker may be down: count it, go on
                self.failures.append(f"{type(exc).__name__}: {exc}")
                _log.warning("steady load round failed: %s", exc)
                self._idle.set()
                self._stop.wait(RETRY_PAUSE_S)
                continue
            self._idle.set()
            self._stop.wait(self.pause_s)


def wait_stable(read: Callable[[], T], *, settle_s: float = 1.0, timeout_s: float = 30) -> T:
    """Call `read()` until two results `settle_s` apart are equal; returns the last.

    Transaction markers land shortly after a commit returns, so the source's end is
    read until it stops moving.
    """
    deadline = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = read()
        if now == last:
            return now
        last = now
    return last
