"""High-water marks: what a ticket server issued of each table in this process, by which a block
offered at or below it is recognised as a rewind (the database went back in time) rather than
handed out a second time. Pure bookkeeping: no SQL, no threads of its own."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator

from .._naming import TicketTable


class Mark:
    """What a server issued of one table in this process, for telling a rewind from ids it
    gave back: the most recent blocks it kept, the highest id of older ones, and a floor it
    was told (ids in use elsewhere). ``high`` is the highest of them: a block at or below it is
    a rewind. Changed under :class:`Marks`' lock (give-backs and floors also under its gate)."""

    __slots__ = ("floor", "recent", "settled", "high")

    #: Blocks kept one by one; older ones only count by their highest id. A give-back takes
    #: back the table's last ids, so it only ever reaches recent blocks.
    KEPT = 64

    def __init__(self) -> None:
        self.floor = 0
        self.recent: deque[range] = deque()
        self.settled = 0
        self.high = 0

    def issued(self, block: range) -> None:
        self.recent.append(block)
        if len(self.recent) > self.KEPT:
            self.settled = max(self.settled, self.recent.popleft()[-1])
        if block[-1] > self.high:
            self.high = block[-1]

    def returned(self, ids: range) -> None:
        """``ids`` were taken back: they are no longer this process's (the tail of one block,
        or of several that follow on)."""
        kept = deque(above_not_in(block, ids) for block in self.recent)
        self.recent = deque(block for block in kept if block)
        self.high = max(self.floor, self.settled, *(block[-1] for block in self.recent))

    def raise_floor(self, floor: int) -> None:
        self.floor = max(self.floor, floor)
        self.high = max(self.high, floor)


def above_not_in(block: range, ids: range) -> range:
    """``block`` less the ids of ``ids`` at its end (a give-back takes back the table's last
    ids, so it only ever cuts blocks from their end)."""
    if not block or not ids or block[-1] < ids.start or block.step != ids.step or (
        (block.start - ids.start) % ids.step
    ):
        return block
    return block[: max(0, (ids.start - block.start + block.step - 1) // block.step)]


class MarkGate:
    """Takes run together; what moves a high-water mark otherwise (a give-back lowers it, a
    floor raises it) waits for the takes in flight and holds new ones back. A take compares
    its block with the mark as it was when it started: a mark moved under it would make a
    legitimate block look like a rewind, or a rewind look legitimate."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._takes = 0
        self._movers = 0  # waiting or moving: new takes wait for them
        self._moving = threading.Lock()  # one mover at a time

    @contextlib.contextmanager
    def taking(self) -> Iterator[None]:
        with self._changed:
            while self._movers:
                self._changed.wait()
            self._takes += 1
        try:
            yield
        finally:
            with self._changed:
                self._takes -= 1
                if not self._takes:
                    self._changed.notify_all()

    @contextlib.contextmanager
    def moving(self) -> Iterator[None]:
        with self._changed:
            self._movers += 1
            try:
                while self._takes:
                    self._changed.wait()
            except BaseException:
                self._movers -= 1
                self._changed.notify_all()
                raise
        try:
            with self._moving:
                yield
        finally:
            with self._changed:
                self._movers -= 1
                self._changed.notify_all()


class Marks:
    """The marks of every table of one ticket database, and the gate their takes and moves go
    through. A forked child keeps the parent's marks (ids the parent issued are still issued),
    with fresh locks (:meth:`after_fork`)."""

    def __init__(self) -> None:
        self._by_table: dict[TicketTable, Mark] = {}
        #: Held to change a mark (callers hold it around :meth:`Mark.issued` and the like).
        self.lock = threading.Lock()
        self._making = threading.Lock()  # apart: a caller holding ``lock`` may make a mark
        self.gate = MarkGate()

    def get(self, table: TicketTable) -> Mark | None:
        return self._by_table.get(table)

    def of(self, table: TicketTable) -> Mark:
        """The mark of ``table``, made on first use."""
        mark = self._by_table.get(table)
        if mark is None:
            with self._making:
                mark = self._by_table.setdefault(table, Mark())
        return mark

    def high(self, table: TicketTable) -> int:
        """The highest id issued here or known in use for ``table`` (0: none)."""
        mark = self._by_table.get(table)
        return mark.high if mark is not None else 0

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self._making = threading.Lock()
        self.gate = MarkGate()
