"""A cache's lane: the ids it holds for one (sequence, bits), and the few steps on them that
must be atomic. See :mod:`~sqlalchemy_tickets.sources.cache` for how they are used: the hot path
calls the chunk's ``__next__`` and nothing else."""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ._lanes import Lane

_EMPTY: Iterator[int] = iter(range(0))


@dataclass(eq=False)
class CacheLane(Lane):
    """The cache of one (sequence, bits). Everything but ``chunk`` is guarded by ``lock``."""

    #: The ids ready for ``next_id``: an iterator over part of ``rest``'s block.
    chunk: Iterator[int] = _EMPTY
    chunk_step: int = 1
    rest: range = range(0)
    ahead: deque[range] = field(default_factory=deque)
    #: The keys this lane is reached by in the cache's hot-path dicts (every spelling).
    keys: list[str | None] = field(default_factory=list)
    refilling: bool = False
    pending: int = 0  # ids asked for by the refill in flight: held as soon as asked
    wanted: int = 0  # ids a caller of next_block is short of: the next refill includes them
    # Counters.
    moved: int = 0  # ids put in chunks
    carved: int = 0  # ids handed out through next_block
    round_trips: int = 0
    blocking_waits: int = 0
    refills: int = 0
    burned: int = 0
    given_back: int = 0  # ids given back to the source (on close)
    taken_back: int = 0  # ids a cache above gave back to this one, to be issued again
    # Ids at or below it are in use (ensure_above): blocks still on their way are cut above it.
    floor: int = 0
    # Set when close() has taken what the lane held: a block landing afterwards goes straight
    # back to the source, never into the lane (a caller could otherwise still be handed it).
    harvested: bool = False
    late: int = 0  # ids of the refill that was still on its way when close() harvested
    # Estimates.
    rate: float = 0.0  # ids per second, EWMA
    latency: float = 0.0  # seconds per refill, EWMA
    block_size: int = 0  # the target the last refill was sized for
    grown: int = 0  # a doubled block, while the rate lags behind use
    asked_at: float = -math.inf  # when the last refill was asked for (the cache's clock)
    rate_time: float = 0.0
    rate_count: int = 0
    last_issued: int = 0

    @property
    def ready(self) -> int:
        return operator.length_hint(self.chunk)

    @property
    def issued(self) -> int:
        return self.moved - self.ready + self.carved

    @property
    def in_hand(self) -> int:
        return self.ready + len(self.rest) + sum(len(b) for b in self.ahead)

    def take_chunk(self, count: int | None = None) -> range:
        """Up to ``count`` (``None``: all) ids from the front of the chunk, as a range (lock
        held). One atomic step under the GIL: a ``next_id`` racing it gets the ids before or
        after them, so each id goes to one of the two, and what this takes follows on."""
        got = list(self.chunk) if count is None else list(itertools.islice(self.chunk, count))
        if not got:
            return range(0)
        return range(got[0], got[-1] + self.chunk_step, self.chunk_step)

    def take_all(self) -> list[range]:
        """Everything the lane holds, as ranges in the order it would hand them out; the lane
        is left empty (lock held)."""
        ready = self.take_chunk()
        self.moved -= len(ready)  # back in hand, unissued: ``issued`` stays true
        held = [ready, self.rest, *self.ahead]
        self.rest = range(0)
        self.ahead.clear()
        return [block for block in held if block]
