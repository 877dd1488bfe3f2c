"""Exponential backoff with jitter (sans-I/O: it computes delays, it never sleeps)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delay before attempt n is base * 2^n, capped, with +-20% jitter so that
    many partitions or connections failing together don't retry in lockstep."""

    base_ms: int
    max_ms: int
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay_ms(self) -> int:
        raw = min(self.max_ms, self.base_ms * (2 ** min(self.failures, 30)))
        self.failures += 1
        spread = raw * self.jitter
        return max(0, int(raw + self.rng.uniform(-spread, spread)))

    def reset(self) -> None:
        self.failures = 0
