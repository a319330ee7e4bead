"""A ticket server's guard against rewinds (``_rewind.py`` says what the layers share): each
table's identity compared with the one seen last (first contact: the one recorded in the
database), and a database that went back in time healed above every floor known — once per
rewind, however many threads see it — or refused with :class:`RewindError`."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._naming import TicketTable
from ..dialects._types import CLOCK_SKEW_MS, SYNC_LEASE_MS, SYNC_RECHECK, SYNC_RENEWAL
from ..dialects.base import Identity, TableInfo
from ..errors import RewindError, TicketsError
from . import _rewind
from ._marks import Marks
from ._rewind import RewindPolicy
from ._stamps import Stamps
from ._ticket_db import TicketDatabase

logger = logging.getLogger("sqlalchemy_tickets")

__all__ = ["SYNC_LEASE_MS", "SYNC_RECHECK", "IdentityGuard", "Known", "leased"]


@dataclass(eq=False)
class Known:
    """A table a server has seen, the stride it was last seen with, and its identity when
    last checked (at ``checked`` on the monotonic clock, after the engine's ``epoch``-th
    connection)."""

    table: TicketTable
    info: TableInfo
    identity: Identity | None = None
    checked: float = 0.0
    epoch: int = 0
    #: No block of it goes out before this moment (monotonic clock): see
    #: :meth:`IdentityGuard.follow`.
    hold_until: float = 0.0


@dataclass(eq=False)
class Heals:
    """One table's heals in this process: made one at a time (``lock``: a thread that meets
    the rewind another is healing waits for it), how many were made, and the table's identity
    as the last one left it. A thread that looked before a heal and finds, once it holds the
    lock, that a heal happened since, or that the identity it saw is the one healed, met the
    same rewind: it goes on with the healed table."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0
    identity: Identity | None = None


class IdentityGuard:
    """The rewind guard of one ticket database.

    Args:
        db: its statements.
        stamps: the identities recorded there.
        marks: what this process issued of each table.
        policy, margin: ``on_rewind`` and ``rewind_margin`` (``TicketServer``).
        floors: the floors of a table known outside the database (the other servers of a
            pair), asked when a rewind is healed.
        healed: told ``(table, target)`` after a heal (the other servers of a pair move above
            it too).
        url: the database's URL for the command a refusal prints.
    """

    def __init__(
        self,
        db: TicketDatabase,
        stamps: Stamps,
        marks: Marks,
        *,
        policy: RewindPolicy,
        margin: int,
        floors: Callable[[TicketTable], list[int]],
        healed: Callable[[TicketTable, int], None],
        url: str,
    ) -> None:
        self.db = db
        self.stamps = stamps
        self.marks = marks
        self.policy = policy
        self.margin = margin
        self._floors_outside = floors
        self._healed = healed
        self._url = url
        self._lock = threading.Lock()
        self._heals: dict[TicketTable, Heals] = {}
        #: Rewinds healed here.
        self.rewinds = 0
        #: The last synchronous identity seen here (``None``: the last one seen was not):
        #: whose replication settings the leases are renewed under.
        self._lease_from: Identity | None = None
        self._renew_at = 0.0
        #: Tables refused, with the floor they were refused below: see :meth:`refusing`.
        self._refused: dict[TicketTable, tuple[int, int | None, str]] = {}

    def __repr__(self) -> str:
        return repr(self.db)

    def _of(self, table: TicketTable) -> Heals:
        heals = self._heals.get(table)
        if heals is None:
            with self._lock:
                heals = self._heals.setdefault(table, Heals())
        return heals

    def heals(self, table: TicketTable) -> int:
        """How many heals of ``table`` this process made: read before a take, and handed to
        :meth:`rewound` (``heals_seen``) if the block is a rewind."""
        heals = self._heals.get(table)
        return heals.count if heals is not None else 0

    def check(self, known: Known) -> bool:
        """Compare the table's identity with the one last seen (first contact: the one recorded
        in the database); a change that may have lost issued ids is a rewind. Returns whether
        there was one (healed: the sequence moved)."""
        table = known.table
        heals = self.heals(table)  # before the identity is read: see rewound
        live = self.db.identity(table)
        epoch = self.db.own.connections
        if live is None:
            return False  # no table: the take says so
        rewound = False
        reference = known.identity
        row: Identity | None = None
        if reference is None:
            # First contact: the recorded identity, or this one recorded (one connection).
            reference = row = self.stamps.stored_or_recorded(
                table, leased(live), known.info.last_id)
        if reference is None:
            pass
        elif live.same(reference):
            if row is not None or reference.synchronous != live.synchronous:
                self.follow(known, live, row if row is not None else self.stamps.read(table))
        else:
            if row is None:
                row = self.stamps.read(table)
            if known.identity is not None and row is not None and live.same(row):
                # Changed since this process looked, but already vouched for in the database:
                # by an operator's sync, or by the process that healed it first. This
                # process's own high-water mark still guards what it issued.
                logger.info("%s: %s is on %s now, as recorded since", self, table.label, live)
                self.follow(known, live, row)
            elif row is not None and live.promoted_from(row):
                logger.info("%s: %s is on %s now, after a failover to a synchronous standby "
                            "(was %s): no issued id was lost", self, table.label, live, row)
                self.stamps.record(table, leased(live), None)
            else:
                # A rewind, whoever heals it: a block taken before this check is burned.
                self.rewound(known, f"its identity changed from {reference} to {live} "
                             "(restored from a backup, or a replica promoted)", live=live,
                             heals_seen=heals)
                rewound = True
        known.identity = live
        known.checked = time.monotonic()
        known.epoch = epoch
        self.seen(live)
        return rewound

    def check_many(self, knowns: Sequence[Known]) -> bool:
        """:meth:`check` of many tables in one round trip; a table that changed is checked
        (and healed or refused) alone. Whether any changed."""
        lives = self.db.identities([k.table for k in knowns])
        changed = False
        epoch, now = self.db.own.connections, time.monotonic()
        for known in knowns:
            live = lives.get(known.table)
            seen = known.identity
            if (live is not None and seen is not None and live.same(seen)
                    and live.synchronous == seen.synchronous):
                known.checked, known.epoch = now, epoch
            else:
                changed = self.check(known) or changed
        return changed

    # -- synchronous replication --------------------------------------------------------------

    @staticmethod
    def to_follow(live: Identity, row: Identity) -> bool:
        """Whether the replication of a table whose identity ``live`` is as ``row`` records
        asks :meth:`follow` for more than a plain first contact."""
        return live.synchronous != row.synchronous or (
            not live.synchronous and _hold_ms(live, row) > 0)

    def follow(self, known: Known, live: Identity, row: Identity | None) -> None:
        """Keep the table's record of its replication true to ``live``. Synchronous now (every
        commit waits for every standby that may be promoted) where the record says not: the
        record says so, with a lease (committed as every commit now is: once the standbys
        have it). Not synchronous where the record still trusts a failover: the record says
        not, and no block goes out until the lease the standbys may hold ran out — a failover
        before then would trust a standby that never saw those blocks."""
        table = known.table
        if live.synchronous:
            if row is None or not row.synchronous:
                logger.info("%s: every commit of %s waits for its standbys now: a failover "
                            "will be trusted to lose nothing", self, table.label)
                self.stamps.record(table, leased(live), None)
            return
        if row is None:
            return
        if row.synchronous:
            logger.info("%s: the commits of %s no longer wait for every standby that may be "
                        "promoted: a failover is a possible rewind from now on", self,
                        table.label)
            self.stamps.record(table, dataclasses.replace(
                live, trusted_until=row.trusted_until), None)
        wait = _hold_ms(live, row) / 1000
        if wait > 0:
            known.hold_until = max(known.hold_until, time.monotonic() + wait)
            logger.info("%s: %s issues again in %.1f s, once a failover can no longer be "
                        "trusted to have lost nothing", self, table.label, wait)

    def seen(self, live: Identity) -> None:
        """Note the replication ``live`` shows: the leases are renewed while it waits for
        the standbys (and not after a table showed that it no longer does)."""
        self._lease_from = live if live.synchronous else None

    def renew(self) -> None:
        """Renew the leases of this database's synchronous tables (one statement, at most
        every ``SYNC_RENEWAL`` seconds, and only while this process saw its commits wait)."""
        live = self._lease_from
        if live is None:
            return  # the common case, on every block: no clock read
        now = time.monotonic()
        if now < self._renew_at or not self.stamps.kept:
            return
        self._renew_at = now + SYNC_RENEWAL
        self.db.own.run(lambda conn: self.db.backend.renew_leases(conn, live, SYNC_LEASE_MS))

    def refuses(self, table: TicketTable) -> bool:
        """Whether ``table`` was refused below a floor (:meth:`refusing` says until when)."""
        return table in self._refused

    def refusing(self, table: TicketTable) -> None:
        """Raise :class:`RewindError` again for a table this process refused below a floor,
        without taking a block, until the sequence's next id is above that floor (an operator's
        ``sync --above``, or another process's heal). Taking would burn a block each call,
        and enough of them walk the sequence past this process's floor but not past ids other
        processes issued: it would resume, unsynced, on theirs."""
        refused = self._refused.get(table)
        if refused is None:
            return
        floor, left_at, message = refused
        info = self.db.describe(table)
        last = info.last_id if info is not None else None
        # At the floor: the next id is above it, unless the refused take itself left it there.
        if last is None or last < floor or (last == left_at == floor):
            raise RewindError(message)
        with self._lock:
            self._refused.pop(table, None)
        logger.info("%s: %s is above %d now: issuing again", self, table.label, floor)

    def floors(self, table: TicketTable) -> list[int]:
        """What is known to be issued or in use, from this process and outside the database."""
        high = self.marks.high(table)
        found = [high] if high else []
        try:
            found += self._floors_outside(table)
        except TicketsError as error:
            logger.debug("a floor of %s is out of reach: %s", table.label, error)
        return found

    def rewound(
        self,
        known: Known,
        seen: str,
        *,
        live: Identity | None = None,
        high_seen: int | None = None,
        heals_seen: int | None = None,
        in_use: bool = False,
    ) -> None:
        """The database went back in time for ``known`` (``seen``: how it showed): move the
        sequence above the highest floor plus the margin (``on_rewind="heal"``), or raise
        :class:`RewindError`. Once per rewind, however many threads meet it: one heals while
        the others wait for it, and a thread that finds it healed since it looked leaves it:
        a heal made since it read the count (``heals_seen``, :meth:`heals`) that left the
        identity it saw (``live``), or any such heal where it saw no identity but a block; the
        identity it saw recorded (by another process); the mark above the one it compared
        with (``high_seen``). A later rewind is healed again.
        ``in_use``: not a rewind, the tables the sequence serves hold ids it has not reached
        (a table moved from auto-increment). The caller burns what it was offered either
        way."""
        table = known.table
        heals = self._of(table)
        with heals.lock:
            since = heals_seen is not None and heals.count != heals_seen
            if live is not None:
                if since and heals.identity is not None and live.same(heals.identity):
                    known.identity = live  # healed by another thread since this one looked
                    return
                recorded = self.stamps.read(table)
                if recorded is not None and recorded.same(live):
                    # Healed (and vouched for) by another thread or process since this one
                    # looked; the marks still guard what this process issued.
                    known.identity = live
                    return
            elif since:
                return  # healed by another thread since this one read its mark
            if high_seen is not None and self.marks.high(table) > high_seen:
                return  # another thread healed it: its floor moved the mark
            heals.identity = self._heal(known, seen, live=live, in_use=in_use)
            heals.count += 1

    def _heal(
        self, known: Known, seen: str, *, live: Identity | None, in_use: bool
    ) -> Identity | None:
        """:meth:`rewound`'s move (or refusal), under the table's heal lock. Returns the
        table's identity as the heal leaves it (``None``: unknown)."""
        table = known.table
        floors = self.floors(table)
        if self.policy == "refuse" or not floors:
            refusal = _rewind.refusal(repr(self), self._url, table, seen, floors)
            if floors:
                info = self.db.describe(table)
                with self._lock:
                    self._refused[table] = (
                        max(floors), info.last_id if info is not None else None, str(refusal))
            raise refusal
        floor = max(floors)
        target = min(floor + self.margin * known.info.increment, table.max_id)
        self.db.raise_above(table, target)
        with self._lock:
            self.rewinds += 1
        with self.marks.lock:
            # The target, not the floor: the ids issued from here on are this process's
            # too, and a second restore of the same backup must not be healed onto them.
            self.marks.of(table).raise_floor(target)
        _rewind.counted(table)
        self._healed(table, target)
        if in_use:
            logger.warning(
                "%s: %s: %s; moved it above %d (that id, %d, plus a margin) before its "
                "first block: no id is issued twice (run `sqlalchemy-tickets sync` or "
                "op.sync_ticket_sequence() when moving a table to TicketId)",
                self, table.label, seen, target, floor,
            )
        else:
            logger.warning(
                "%s: %s went back in time: %s; moved it above %d (the highest id known in "
                "use, %d, plus a margin): no id is issued twice",
                self, table.label, seen, target, floor,
            )
        if live is None:
            live = self.db.identity(table)
        if live is not None:
            # Vouched for as it is now: other processes need not heal it again.
            self.stamps.record(table, leased(live), target)
            known.identity = live
        return live


def leased(live: Identity) -> Identity:
    """``live`` to record: with a lease from its clock if its commits wait for the standbys."""
    if not live.synchronous or live.clock is None:
        return live
    return dataclasses.replace(live, trusted_until=live.clock + SYNC_LEASE_MS)


def _hold_ms(live: Identity, row: Identity) -> int:
    """How long (ms) nothing may go out of a table whose commits no longer wait for its
    standbys, by ``live``'s clock: until ``row``'s lease ran out on every server's clock."""
    if row.trusted_until is None or live.clock is None:
        return 0
    return max(0, row.trusted_until + CLOCK_SKEW_MS - live.clock)
