"""Pauses after failures in a row: one formula for every part of the library that tries again
(a cache's or a tier's refills, a pair's server skipped, ``retry_session``): the first pause,
doubling per failure up to a cap, with jitter where many callers would otherwise try again in
step (psycopg_pool's ``AttemptWithBackoff``, as one small object)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: Doublings counted at most: the pause has reached any sane cap long before.
_MOST_DOUBLINGS = 64


@dataclass(frozen=True)
class Backoff:
    """``first`` seconds after one failure, doubling per failure in a row, at most ``cap``.

    ``jitter`` (0 to 1) takes that share of the pause at random: 0.5 pauses between half and
    all of it."""

    first: float
    cap: float
    jitter: float = 0.0

    def pause(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after ``failures`` failures in a row (``failures`` >= 1)."""
        doublings = min(max(0, failures - 1), _MOST_DOUBLINGS)
        full = min(self.cap, self.first * 2.0**doublings)
        if self.jitter:
            full *= (1 - self.jitter) + self.jitter * rand()
        return full
