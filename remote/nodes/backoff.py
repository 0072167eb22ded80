"""Capped exponential backoff with jitter, so twenty nodes that drop together do not retry in step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.25
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """The delay before the next attempt: base·factor^n capped, then spread by ±jitter."""
        delay = min(self.cap, self.base * self.factor ** self.attempt)
        self.attempt += 1
        return delay * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self.attempt = 0
