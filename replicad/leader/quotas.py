"""Request quotas of `replicad serve` (Kafka's request_percentage quota, KIP-124, and its
throttling, KIP-219), per client address: sans-I/O, time passed in.

Rules:
- A client (its IP address: every connection from it shares the quota) may use
  `percentage` percent of the event loop's time. What a request used is charged when its
  answer is ready: the loop's CPU time spent decoding and answering it, never the time it
  waited (a long-poll Fetch waiting for data, a frame decoded on a thread).
- Use is kept in `windows` samples of `window_ms` each (Kafka's quota.window.num = 11 and
  quota.window.size.seconds = 1); the rate is what the samples hold over the time they
  span (at least `windows - 1` windows, so a first burst is not judged over a few ms).
- Over the quota, the throttle time is how long the client must stay idle for its rate to
  fall back to the quota: (used - quota * span) / quota, Kafka's formula, at most the span
  of all windows. The server puts it in the answer's throttle_time_ms and reads nothing
  more from that connection until it has passed (KIP-219: clients wait as well).
- A client's samples are dropped when its last connection closes (`forget`), so the
  state held is one small record per connected address.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

# Kafka's quota.window.num and quota.window.size.seconds.
DEFAULT_WINDOWS = 11
DEFAULT_WINDOW_MS = 1000


@dataclass(slots=True)
class _Sample:
    start_ms: int
    used_ms: float


class RequestQuota:
    def __init__(
        self,
        percentage: float,
        *,
        windows: int = DEFAULT_WINDOWS,
        window_ms: int = DEFAULT_WINDOW_MS,
    ) -> None:
        if percentage <= 0:
            raise ValueError(f"percentage must be positive, not {percentage}")
        self.share = percentage / 100
        self.windows = windows
        self.window_ms = window_ms
        self._samples: dict[str, collections.deque[_Sample]] = {}

    def record(self, client: str, used_ms: float, now_ms: int) -> int:
        """Charge `used_ms` of loop time to `client`; the throttle time (ms) it has earned."""
        samples = self._samples.setdefault(client, collections.deque())
        window_start = now_ms - now_ms % self.window_ms
        if samples and samples[-1].start_ms == window_start:
            samples[-1].used_ms += used_ms
        else:
            samples.append(_Sample(window_start, used_ms))
        oldest_kept = window_start - (self.windows - 1) * self.window_ms
        while samples and samples[0].start_ms < oldest_kept:
            samples.popleft()
        used = sum(s.used_ms for s in samples)
        span = max(now_ms - samples[0].start_ms, (self.windows - 1) * self.window_ms)
        over = used - self.share * span
        if over <= 0:
            return 0
        return int(min(over / self.share, self.windows * self.window_ms))

    def forget(self, client: str) -> None:
        self._samples.pop(client, None)

    @property
    def clients(self) -> int:
        return len(self._samples)
