"""A ticket source held in memory, for fast unit tests of everything that draws ids.

It is a real implementation of the source protocol (``next_id``/``next_block``), not a stand-in
for a ticket server: one counter per ``(sequence, bits)``, thread safe, with every
``next_block`` call recorded so tests can count the blocks a flush or an executemany asked for.
``max_block`` makes it return short blocks, as a cache or a tier may. ``give_back`` takes back any
range it issued (``takes_back=False``: none), and issues ids given back before new ones, lowest
first.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockCall:
    """One ``next_block`` call: what was asked, and the ids given."""

    sequence: str | None
    count: int
    bits: int
    ids: range


class MemorySource:
    """Ids ``start, start + increment, ...`` per ``(sequence, bits)``, never the same one twice."""

    def __init__(
        self,
        *,
        start: int = 1,
        increment: int = 1,
        max_block: int | None = None,
        takes_back: bool = True,
    ):
        if start < 1 or increment < 1 or (max_block is not None and max_block < 1):
            raise ValueError("start, increment and max_block must be positive")
        self.start = start
        self.increment = increment
        self.max_block = max_block
        self.takes_back = takes_back
        self.calls: list[BlockCall] = []
        self.given_back: list[BlockCall] = []  # every give_back call, taken or not
        # Per (sequence, bits): ids given back and not issued again, kept sorted.
        self._returned: dict[tuple[str | None, int], list[int]] = {}
        self._last: dict[tuple[str | None, int], int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemorySource(start={self.start}, increment={self.increment})"

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive integer, not {count!r}")
        if bits not in (32, 64):
            raise ValueError(f"bits must be 32 or 64, not {bits!r}")
        given = count if self.max_block is None else min(count, self.max_block)
        with self._lock:
            returned = self._returned.get((sequence, bits))
            if returned:
                # Ids given back first, as one run of the stride from the lowest.
                run = [returned.pop(0)]
                while returned and len(run) < given and returned[0] == run[-1] + self.increment:
                    run.append(returned.pop(0))
                ids = range(run[0], run[-1] + self.increment, self.increment)
                self.calls.append(BlockCall(sequence, count, bits, ids))
                return ids
            first = self._last.get((sequence, bits), self.start - self.increment) + self.increment
            last = first + (given - 1) * self.increment
            if last >= 2 ** (bits - 1):
                raise ValueError(f"sequence {sequence!r} would pass {bits} bits")
            self._last[sequence, bits] = last
            ids = range(first, last + 1, self.increment)
            self.calls.append(BlockCall(sequence, count, bits, ids))
        return ids

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ids this source issued (all of them, or none with ``takes_back=False``)."""
        with self._lock:
            self.given_back.append(BlockCall(sequence, len(ids), bits, ids))
            if not self.takes_back or not ids:
                return 0
            last = self._last.get((sequence, bits))
            issued = {i for call in self.calls for i in call.ids}
            returned = self._returned.setdefault((sequence, bits), [])
            if (
                ids.step != self.increment
                or last is None
                or ids[-1] > last
                or not set(ids) <= issued
                or any(i in returned for i in ids)
            ):
                raise ValueError(f"{ids!r} was not issued by {self!r} for {sequence!r}/{bits}")
            for i in ids:
                bisect.insort(returned, i)
            return len(ids)

    def issued(self) -> list[int]:
        """Every id handed out, in the order the calls were made."""
        with self._lock:
            return [i for call in self.calls for i in call.ids]
