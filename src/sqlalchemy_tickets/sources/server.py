"""One ticket database: every call is one round trip on the source's own autocommit connections.

:class:`TicketServer` coordinates its collaborators, one concern each: the statements and the
one pool they go through (``_ticket_db.py``), the high-water marks (``_marks.py``), the guard
against rewinds and the stamps it records (``_server_guard.py``, ``_stamps.py``), first contact
with a sequence (``_contacts.py``) and the tables it makes (``_ticket_ddl.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy.engine import URL, Engine

from .. import _process
from .._commands import init_command
from .._deprecation import deprecated_alias
from .._naming import (
    DEFAULT_TABLE_TEMPLATE,
    TicketTable,
    check_bits,
    check_seconds,
    check_table_template,
    ticket_table,
)
from ..dialects import TicketBackend
from ..dialects._connect import Bind, OwnEngine, engine_of, sync_bind
from ..dialects._shared import shared_engine
from ..dialects.base import Identity, TableInfo
from ..errors import (
    ExhaustedError,
    StrideMismatchError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from . import _rewind, _server_guard
from ._contacts import PAUSED_OFFSET, FirstContact
from ._marks import Marks
from ._rewind import DEFAULT_REWIND_MARGIN, RewindPolicy
from ._server_guard import IdentityGuard, Known, leased
from ._stamps import Stamps
from ._ticket_db import TicketDatabase
from ._ticket_ddl import TableMaker
from .base import Request, check_count, check_ids

__all__ = ["PAUSED_OFFSET", "TicketServer"]

logger = logging.getLogger("sqlalchemy_tickets")

#: Counts above this are checked against the sequence's bit width before anything else.
_MAX_ID_32 = 2**31 - 1

#: Sequences whose first contact is made together (:meth:`TicketServer.prepare`).
PREPARE_BATCH = 1000

#: Sequences whose blocks are taken in one transaction (:meth:`TicketServer.next_blocks`): a
#: few dozen keep each ticket row's lock short.
TAKE_BATCH = 64

#: Times a block is asked for again when the table changed between a take and its describe
#: (seeded by its creator, restrided), before the server counts as unavailable.
_MISS_RETRIES = 5


class TicketServer:
    """A ticket database, reached on connections of its own in autocommit.

    Args:
        bind: the database, as a URL or an ``Engine``. Given an ``Engine``, the server connects
            the way that engine does (its ``connect_args``, ``creator``, ``do_connect`` hooks
            such as an auth-token hook), but on a pool of its own in autocommit, so a ticket is
            never part of a caller's transaction and is never issued twice, whatever the caller
            rolls back (see ``docs/connections.md`` for what is and is not inherited). An
            ``AsyncEngine`` lends its URL, on the synchronous driver of its database; so does
            the URL of an asyncio driver (``mysql+aiomysql`` → ``pymysql``,
            ``postgresql+asyncpg`` → ``psycopg``, ``sqlite+aiosqlite`` → ``pysqlite``), whose
            synchronous driver must be installed.
        timeout: seconds a connect or a round trip may take before the server counts as down.
        stride: ``(increment, offset)`` this server must have: checked against every table on
            first contact (:class:`StrideMismatchError` if they disagree, before any id is
            issued) and used for tables it creates. ``None``: take whatever the table has.
        create_missing: create a sequence's table on first use (``False``: raise
            :class:`UnknownSequenceError`).
        table_template: how a sequence name becomes a table name (``tickets__{sequence}``).
        pool_size: connections kept open.
        storage_engine: MySQL/MariaDB storage engine of the tables it creates (``InnoDB`` or
            ``MyISAM``; Flickr's article shows both).
        embedded: keep the tables where the embedded default keeps an application engine's
            (SQLite: a sibling file); the ``Engine`` is then held weakly.
        on_rewind: what to do when the database went back in time (restored, a replica
            promoted that missed writes, a sequence below ids in use) and a floor is known
            (the highest id this process issued, the other servers of a pair, the tables a
            sequence serves): ``"heal"`` moves the sequence above it plus ``rewind_margin``,
            logs a WARNING and counts it in ``stats()["rewinds"]``; ``"refuse"`` raises
            :class:`~sqlalchemy_tickets.RewindError`, as both do when no floor is known. See
            ``docs/rewinds.md``.
        rewind_margin: how many ids above the floor a healed sequence starts.
        identity_interval: seconds between checks of a table's identity on backends whose
            take cannot check it itself (MySQL/MariaDB, SQLite); PostgreSQL checks it in every
            take. Every new connection is checked too.
    """

    def __init__(
        self,
        bind: Bind,
        *,
        timeout: float = 2.0,
        stride: tuple[int, int] | None = None,
        create_missing: bool = True,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
        pool_size: int = 5,
        storage_engine: str = "InnoDB",
        embedded: bool = False,
        on_rewind: RewindPolicy = "heal",
        rewind_margin: int = DEFAULT_REWIND_MARGIN,
        identity_interval: float = 1.0,
    ) -> None:
        self.on_rewind: RewindPolicy = _rewind.check_policy(on_rewind)
        self.rewind_margin = _rewind.check_margin(rewind_margin)
        self.identity_interval = check_seconds("identity_interval", identity_interval)
        app = engine_of(bind)
        #: The server's own engine: the one pool every round trip goes through (beside an
        #: application's data, the one every client of the library there shares).
        self.own = (
            shared_engine(app, embedded=True, timeout=timeout, pool_size=pool_size,
                          what="ticket server", unavailable=TicketServerUnavailable)
            if embedded and app is not None
            else OwnEngine(sync_bind(bind), timeout=timeout, pool_size=pool_size,
                           what="ticket server", embedded=embedded,
                           unavailable=TicketServerUnavailable)
        )
        self.url: URL = self.own.url
        self.timeout = self.own.timeout
        self.stride = stride
        self.create_missing = create_missing
        self._template = check_table_template(table_template)
        # The template with this server's lane, once it is known whether the database is a
        # cluster whose nodes all write one replicated table (Galera): None until then.
        self._lane_template: str | None = None
        self.storage_engine = storage_engine
        self.pool_size = pool_size
        #: Where tables this server creates on first use start: above what its peers issued
        #: (set by TicketServers), so a server added with an empty database cannot reissue ids.
        self.start_above: Callable[[list[TicketTable]], dict[TicketTable, int]] | None = None
        #: Floors kept outside this database (set by TicketServers: what the other servers of
        #: the pair issued): a rewind is healed above the highest of them.
        self.floors: list[Callable[[TicketTable], int | None]] = []
        #: Called with (table, target) after this server healed a rewind (set by
        #: TicketServers: the other servers move above it too, so the floor a later heal of
        #: this server reads is above the ids it issued since).
        self.after_heal: list[Callable[[TicketTable, int], None]] = []
        self.backend: TicketBackend = self.own.backend
        self.engine: Engine = self.own.engine
        self.marks = Marks()
        self._reset_state()
        _process.track(self)

    def _reset_state(self) -> None:
        self._lock = threading.Lock()
        # Per caller spelling of (sequence, bits): the table and what is known of it, so the
        # hot path validates a name once, not per call.
        self._known: dict[tuple[str | None, int], Known] = {}
        self._issued = 0
        self.db = TicketDatabase(self.own, lambda: repr(self))
        #: The identities recorded in the database (its stamp table).
        self.stamps = Stamps(self.own, create=self.create_missing, command=(
            f"`{init_command(self.url.render_as_string(hide_password=True))}` "
            "(or op.create_ticket_table() in a migration)"))
        self.guard = IdentityGuard(
            self.db, self.stamps, self.marks, policy=self.on_rewind, margin=self.rewind_margin,
            floors=self._floors_outside, healed=self._healed,
            url=self.url.render_as_string(hide_password=True),
        )
        self.maker = TableMaker(self.db, stride=self.stride, storage_engine=self.storage_engine,
                                template=lambda: self.table_template)
        self.contact = FirstContact(
            self.guard, self.maker, stride=self.stride, create_missing=self.create_missing,
            template=lambda: self.table_template, starts=self._starts,
        )

    def _after_fork_in_child(self) -> None:
        # A child must not share its parent's sockets (close=False leaves them to the parent);
        # the parent's marks hold in the child too: the ids it issued are issued.
        self.own.dispose(close=False)
        self.marks.after_fork()
        self._reset_state()

    def __repr__(self) -> str:
        return f"TicketServer({self.url.render_as_string()!r})"

    @property
    def table_template(self) -> str:
        """How a sequence name becomes a table name here. On a MariaDB Galera node of a pair
        or trio (a server with a ``stride``), each position has tables of its own
        (``tickets__{sequence}__lane2of3``): the nodes replicate every table, and one row
        written from every node would collapse the stride and fail certification. Finding
        that out takes one round trip, the first time."""
        if self._lane_template is None:
            template = self._template
            if self.stride is not None and self.backend.may_be_clustered:
                cluster = self.db.cluster()
                if cluster:
                    increment, offset = self.stride
                    template = f"{template}__lane{offset}of{increment}"
                    logger.info("%s is a node of the Galera cluster %s: its tables are %s",
                                self, cluster, template)
            self._lane_template = template
        return self._lane_template

    # -- what the pair around this server knows ---------------------------------------------

    def _floors_outside(self, table: TicketTable) -> list[int]:
        found = []
        for floor in self.floors:
            value = floor(table)
            if value is not None:
                found.append(value)
        return found

    def _healed(self, table: TicketTable, target: int) -> None:
        for healed in self.after_heal:
            healed(table, target)

    def _starts(self, tables: list[TicketTable]) -> dict[TicketTable, int]:
        """Where new tables start: above what the peers issued and above ids known in use."""
        above = self.start_above(tables) if self.start_above is not None else {}
        return {t: max(above.get(t, 0), self.marks.high(t)) + 1 for t in tables}

    # -- the source protocol ------------------------------------------------------------------

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """One id of ``sequence`` (``None``: Flickr's ``Tickets64``/``Tickets32``)."""
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """Exactly ``count`` ids in one round trip, as a ``range`` whose step is the stride."""
        if type(count) is not int or count < 1 or count > _MAX_ID_32:
            # Before first contact, which may create the table: a bad count writes nothing,
            # and one beyond the id space never reaches SQL, where it would overflow.
            check_count(count, bits)
        known = self._known.get((sequence, bits))
        if known is None:
            known = self._first_contact(sequence, bits)
        elif self._due(known):
            self.guard.check(known)
        self.guard.renew()
        table = known.table
        self.guard.refusing(table)
        with self.marks.gate.taking():
            for _ in range(_MISS_RETRIES):
                # Read before the take: a block taken concurrently may land first and be
                # higher. (Give-backs and new floors, which move the mark otherwise, wait
                # for the takes in flight.)
                heals = self.guard.heals(table)  # before the mark: see guard.rewound
                mark = self.marks.of(table)
                high = mark.high
                epoch = self.own.connections
                block = self._take_block(known, count)
                if self.own.connections != epoch and self.guard.check(known):
                    continue  # taken on a new connection, from a database that changed
                if block.start > high:
                    with self.marks.lock:
                        self._issued += count
                        mark.issued(block)
                    return block
                # Ids at or below what this process issued: the database went back in time.
                # The block is burned; the sequence moves above the floor, or RewindError.
                self.guard.rewound(known, f"it offered ids {block.start}..{block[-1]}, at or "
                                   f"below {high}, the highest id issued or known in use here",
                                   high_seen=high, heals_seen=heals)
        raise TicketServerUnavailable(
            f"{table.label} on {self} kept offering ids already issued; try again"
        )

    def _due(self, known: Known) -> bool:
        """Whether ``known``'s identity is due a check before its next block: a new connection
        since the last one, (where the take cannot check it whole) the interval passed, or
        (where replication can be synchronous and the table's is not) the interval at which
        synchronous replication turned on is noticed (its take refuses when it is turned
        off)."""
        if known.epoch != self.own.connections:
            return True
        if not self.backend.identity_in_block_complete:
            interval = self.identity_interval
        elif (self.backend.replicates_synchronously and known.identity is not None
              and not known.identity.synchronous):
            interval = _server_guard.SYNC_RECHECK
        else:
            return False
        return time.monotonic() - known.checked >= interval

    def _held(self, known: Known) -> None:
        """Wait until blocks of ``known`` may go out (see ``IdentityGuard.follow``), or raise
        :class:`TicketServerUnavailable` if that is beyond the call's time."""
        wait = known.hold_until - time.monotonic()
        if wait <= 0:
            return
        if wait > self.own.timeout:
            raise TicketServerUnavailable(
                f"{known.table.label} on {self} issues again in {wait:.1f} s: its commits "
                "stopped waiting for every standby that may be promoted, and a failover "
                "before then would be trusted to have lost nothing"
            )
        time.sleep(wait)

    def _take_block(self, known: Known, count: int) -> range:
        self._held(known)
        try:
            last = self.db.take(known.table, count, known.info, known.identity)
        except UnknownSequenceError:
            known.epoch = -1  # dropped: maybe restored, so check its identity when it is back
            raise
        info = known.info
        if last is None:
            info, last = self._after_miss(known, count)
        return range(last - (count - 1) * info.increment, last + 1, info.increment)

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ``ids`` (a block this server issued and nobody used) where that is safe:
        on a named sequence whose last issued block ends with them, in one compare-and-set
        round trip. Returns ``len(ids)`` when taken back (they are issued again), ``0`` when
        another block was taken since, the stride changed, or the sequence is Flickr's
        ``Tickets64``/``Tickets32`` (shared with ``REPLACE INTO`` clients). Raises
        :class:`TicketServerUnavailable` when the server does not answer in time."""
        check_ids(ids, bits)
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        if not ids or table.flickr:
            return 0
        known = self._known.get((sequence, bits))
        info = known.info if known is not None else self.db.describe(table)
        if info is None or ids.step != info.increment or (ids.start - info.offset) % ids.step:
            return 0
        with self.marks.gate.moving():
            if not self.db.give_back(table, ids, info):
                return 0
            with self.marks.lock:
                # They may come out again: below the mark, but not a rewind.
                self.marks.of(table).returned(ids)
        logger.debug("%s took back %d ids of %s", self, len(ids), table.label)
        return len(ids)

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id of ``sequence`` issued from now on be above ``floor`` (ids known to be
        in use: the largest key of a table the sequence serves). A sequence at or below it went
        back in time, or started below existing rows (a table moved from auto-increment): it
        is moved above ``floor`` plus ``rewind_margin`` (``on_rewind="heal"``, one WARNING,
        counted) or :class:`~sqlalchemy_tickets.RewindError` (``"refuse"``). Returns whether
        the sequence had to move. One round trip; ``floor`` is remembered for later blocks."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        if type(floor) is not int or floor < 0:
            raise TicketsError(f"a floor is a number of ids >= 0, not {floor!r}")
        with self.marks.gate.moving():
            with self.marks.lock:
                self.marks.of(table).raise_floor(floor)
            known = self._known.get((sequence, bits)) or self._first_contact(sequence, bits)
            info = self.db.describe(table)
            if info is None or info.last_id is None or info.last_id + info.increment > floor:
                return False
            self.guard.rewound(known, f"the tables it serves already hold ids up to {floor} "
                               f"(its next id was {info.last_id + info.increment})", in_use=True)
            return True

    # -- many sequences at once ----------------------------------------------------------------

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None:
        """Make first contact with many sequences in a few round trips, instead of several
        each on their first ids: their tables created where missing (``create_missing``), each
        stride checked, each identity read and compared with the one recorded (or recorded).

        Raises the first error a sequence met (:class:`StrideMismatchError`,
        :class:`UnknownSequenceError`, :class:`RewindError`...); the others are ready."""
        check_bits(bits)
        todo: dict[str | None, TicketTable] = {}
        for sequence in sequences:
            if (sequence, bits) not in self._known:
                todo[sequence] = ticket_table(sequence, bits, self.table_template)
        items = list(todo.items())
        for start in range(0, len(items), PREPARE_BATCH):
            ready, error = self.contact.many(items[start : start + PREPARE_BATCH], bits)
            with self._lock:
                for sequence, known in ready:
                    self._known[sequence, bits] = known
            if error is not None:
                raise error

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """:meth:`next_block` for each ``(sequence, count, bits)``: first contact with new
        sequences made together (:meth:`prepare`), then the blocks taken in one transaction per
        few dozen sequences. A sequence that needs more than a plain take (a table to
        create, a rewind to heal, a stride changed) goes through :meth:`next_block` alone."""
        out: list[range | TicketsError | None] = [None] * len(requests)
        for i, (_, count, bits) in enumerate(requests):
            try:
                check_bits(bits)
                if type(count) is not int or count < 1 or count > _MAX_ID_32:
                    check_count(count, bits)
            except TicketsError as error:
                out[i] = error
        by_bits: dict[int, list[str | None]] = {}
        for i, (sequence, _, bits) in enumerate(requests):
            if out[i] is None and (sequence, bits) not in self._known:
                by_bits.setdefault(bits, []).append(sequence)
        for bits, names in by_bits.items():
            try:
                self.prepare(names, bits=bits)
            except TicketsError as error:  # each is tried alone below, to say which failed
                logger.debug("%s: first contact with %d sequences together failed: %s",
                             self, len(names), error)
        ready = [i for i, (s, _, b) in enumerate(requests)
                 if out[i] is None and (s, b) in self._known]
        for start in range(0, len(ready), TAKE_BATCH):
            part = ready[start : start + TAKE_BATCH]
            try:
                found = self._take_together(
                    [(self._known[requests[i][0], requests[i][2]], requests[i][1]) for i in part]
                )
            except TicketServerUnavailable as error:
                for i in part:
                    out[i] = error
                continue
            for i, block in zip(part, found, strict=True):
                out[i] = block
        result: list[range | TicketsError] = []
        for i, (sequence, count, bits) in enumerate(requests):
            got = out[i]
            if got is None:
                try:
                    got = self.next_block(sequence, count, bits=bits)
                except TicketsError as error:
                    got = error
            result.append(got)
        return result

    def give_back_many(self, items: Sequence[tuple[str | None, range, int]]) -> list[int]:
        """:meth:`give_back` of each ``(sequence, ids, bits)``, the compare-and-sets of a few
        dozen sequences in one round trip."""
        out = [0] * len(items)
        wanted: list[tuple[int, Known, range]] = []
        for i, (sequence, ids, bits) in enumerate(items):
            check_ids(ids, bits)
            known = self._known.get((sequence, bits))
            if not ids or known is None or known.table.flickr:
                if ids and known is None:
                    out[i] = self.give_back(sequence, ids, bits=bits)
                continue
            info = known.info
            if ids.step != info.increment or (ids.start - info.offset) % ids.step:
                continue
            wanted.append((i, known, ids))
        for start in range(0, len(wanted), TAKE_BATCH):
            part = wanted[start : start + TAKE_BATCH]
            with self.marks.gate.moving():
                moved = self.db.give_back_many([(k.table, ids, k.info) for _, k, ids in part])
                with self.marks.lock:
                    for (i, known, ids), back in zip(part, moved, strict=True):
                        if back:
                            self.marks.of(known.table).returned(ids)
                            out[i] = len(ids)
        return out

    def _take_together(self, wanted: list[tuple[Known, int]]) -> list[range | None]:
        """One transaction taking a block of each table (``None``: a table the plain take could
        not serve: its caller goes the long way)."""
        if any(self._due(known) for known, _ in wanted):
            self.guard.check_many([k for k, _ in wanted])
        self.guard.renew()
        now = time.monotonic()
        if any(known.hold_until > now or self.guard.refuses(known.table) for known, _ in wanted):
            return [None] * len(wanted)  # the long way, which waits or refuses
        out: list[range | None] = []
        with self.marks.gate.taking():
            marks = [self.marks.of(known.table) for known, _ in wanted]
            highs = [mark.high for mark in marks]
            epoch = self.own.connections
            lasts = self.db.take_many([(k.table, count, k.info, k.identity) for k, count in wanted])
            if self.own.connections != epoch and self.guard.check_many([k for k, _ in wanted]):
                return [None] * len(wanted)  # a new connection reached a changed database
            with self.marks.lock:
                for (known, count), mark, high, last in zip(wanted, marks, highs, lasts,
                                                            strict=True):
                    if last is None:
                        out.append(None)
                        continue
                    step = known.info.increment
                    block = range(last - (count - 1) * step, last + 1, step)
                    if block.start <= high:
                        # A rewind: burned here, healed (or refused) by the long way.
                        out.append(None)
                        continue
                    self._issued += count
                    mark.issued(block)
                    out.append(block)
        return out

    # -- identities (rewinds) -----------------------------------------------------------------

    def record_identity(self, sequence: str | None, *, bits: int = 64) -> Identity | None:
        """Record the table's identity as it is now (after an operator moved the sequence above
        every id in use: ``sqlalchemy-tickets sync``), so that processes that refused to issue
        (:class:`~sqlalchemy_tickets.RewindError`) resume. Returns it (``None``: no table)."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        live = self.db.identity(table)
        if live is not None:
            info = self.db.describe(table)
            self.stamps.record(table, leased(live), info.last_id if info is not None else None)
        return live

    def identities(self, sequence: str | None, *, bits: int = 64) -> tuple[
        Identity | None, Identity | None
    ]:
        """``(recorded, now)``: the identity recorded for the sequence's table and the one the
        database shows (``None`` where there is none). They differ after a restore or a
        failover that no process has seen yet."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        live = self.db.identity(table)
        return self.stamps.read(table), live

    # -- administration -----------------------------------------------------------------------

    def describe_many(
        self, sequences: Sequence[str | None], *, bits: int = 64
    ) -> list[TableInfo | None]:
        """:meth:`describe` of many sequences in a few round trips (``None`` also for a
        sequence without a table)."""
        tables = [ticket_table(s, check_bits(bits), self.table_template) for s in sequences]
        if not tables:
            return []
        lives = self.db.identities(tables)
        infos = self.db.describe_many([t for t in tables if lives.get(t) is not None])
        return [infos.get(t) for t in tables]

    def describe(self, sequence: str | None, *, bits: int = 64) -> TableInfo | None:
        """The stride and last issued id of a sequence's table (``None``: no row yet).

        Raises :class:`UnknownSequenceError` if the table does not exist.
        """
        return self.db.describe(ticket_table(sequence, check_bits(bits), self.table_template))

    def create(
        self,
        sequence: str | None,
        *,
        bits: int = 64,
        start: int = 1,
        increment: int | None = None,
        offset: int | None = None,
    ) -> None:
        """Create a sequence's table if it does not exist (an existing table is left as is):
        :meth:`create_tables` of one sequence."""
        self.create_tables(
            [sequence], bits=bits, start=start, increment=increment, offset=offset
        )

    def create_tables(
        self,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        start: int = 1,
        increment: int | None = None,
        offset: int | None = None,
    ) -> list[str]:
        """Create the tables of many sequences at once; returns the names of those it created
        (the others existed, and are left as they are).

        Every name, ``bits`` and the stride are checked first: a bad one raises
        :class:`TicketsError` (a ``ValueError``) with nothing written. On MySQL/MariaDB a
        stride asked for Flickr's table is checked against the server's
        ``auto_increment_increment``/``auto_increment_offset`` before anything is created.
        Then one catalog query finds the tables missing, and they are created and seeded in
        batches, each batch one transaction (where DDL is transactional) under the creation
        locks of its tables: no client of the library sees a table without its row (on
        MySQL/MariaDB, whose DDL commits at once, one that finds it first waits for the lock),
        and several processes creating overlapping lists wait for each other — never
        deadlock — and each table is created and seeded once, by one of them. Other clients
        wait for a batch's locks for
        at most ``timeout``: batches are sized, from the pace of the previous one, to take
        about a quarter of it (and at most 100 tables on PostgreSQL, whose lock table holds
        each until COMMIT); each statement gets the whole ``timeout``. Behind PgBouncer in
        statement pooling, which refuses transaction blocks, each statement runs on its own.
        There, or when a creator that takes no creation lock (a migration) is at work at the
        same moment, the list may name a table that the other one created.

        Args:
            sequences: sequence names (case-insensitive; repeats are created once); ``None``
                is Flickr's ``Tickets64`` (``bits=32``: ``Tickets32``).
            bits: 64 or 32, the width of the ids, the same for every table.
            start, increment, offset: the first id each table issues is the smallest id
                >= ``start`` that is congruent to ``offset`` modulo ``increment`` (``offset``
                is this server's position among ``increment`` servers); ``increment`` and
                ``offset`` default to this server's ``stride`` (else 1, 1).

        Raises:
            TicketsError: a bad name, ``bits`` or stride (nothing written).
            StrideMismatchError: MySQL/MariaDB's settings contradict the stride asked for
                Flickr's table (nothing written).
            TicketServerUnavailable: the server refused, dropped or did not answer in time, or
                another creator held a table's lock longer than ``timeout``; the tables of the
                batches before it are created. Running it again finishes the job.
        """
        return self.maker.create(self.maker.specs(sequences, bits, start, increment, offset))

    def stats(self) -> dict[str, int]:
        """Ids issued, round trips made and rewinds seen by this object (all sequences)."""
        with self.marks.lock:
            issued = self._issued
        return {"issued": issued, "round_trips": self.db.round_trips,
                "rewinds": self.guard.rewinds}

    def close(self) -> None:
        """Close the server's connections (a later call opens new ones)."""
        self.own.dispose()

    dispose = deprecated_alias(close, "dispose")

    def with_stride(self, increment: int, offset: int) -> TicketServer:
        """A server on the same database (the same pool) that must have this stride (for
        :class:`TicketServers`)."""
        twin = object.__new__(TicketServer)
        twin.__dict__.update(self.__dict__)
        twin.stride = (increment, offset)
        twin._lane_template = None
        twin.start_above, twin.floors, twin.after_heal = None, [], []
        twin.marks = Marks()
        twin._reset_state()
        _process.track(twin)
        return twin

    # -- internals ----------------------------------------------------------------------------

    def _first_contact(self, sequence: str | None, bits: int) -> Known:
        known = self.contact.one(sequence, bits)
        with self._lock:
            self._known[sequence, bits] = known
        return known

    def _after_miss(self, known: Known, count: int) -> tuple[TableInfo, int]:
        """The take advanced nothing: the stride changed, the row is missing (Flickr's before
        its first id; a named table's before its creator seeded it), the table changed between
        the take and now, or the sequence is exhausted. Returns the stride used and the block's
        last id."""
        table = known.table
        for _ in range(_MISS_RETRIES):
            if known.identity is not None and self.backend.identity_in_block:
                self.guard.check(known)  # the take refuses a table whose identity changed
            info = self.db.describe(table)
            if info is not None and info.last_id is not None and not table.flickr:
                old = known.info
                if (info.increment, info.offset) != (old.increment, old.offset):
                    self.contact.check_paused(table, info)
                    self._accept_new_stride(known, info)
            stride = known.info
            if info is None or info.last_id is None:
                if table.flickr:
                    return self._start_flickr(known, count)
                if not self.create_missing:
                    raise UnknownSequenceError(
                        f"ticket table {table.name} on {self} has no row; recreate it with "
                        "`sqlalchemy-tickets init`"
                    )
                self.contact.create([table], reseed=True)
            else:
                left = max(0, (table.max_id - info.last_id) // stride.increment)
                if count > left:
                    raise self._exhausted(table, count, left)
            # The row is there now, with room: take again.
            self._held(known)
            last = self.db.take(table, count, stride)
            if last is not None:
                return stride, int(last)
        raise TicketServerUnavailable(
            f"{table.label} on {self} changed under every one of {_MISS_RETRIES} attempts "
            "to take a block; try again"
        )

    def _start_flickr(self, known: Known, count: int) -> tuple[TableInfo, int]:
        """Flickr's table has no row yet: make it as a legacy client does."""
        table, stride = known.table, known.info
        first = self.db.start_flickr_row(table)
        if count == 1:
            return stride, first
        # The rest of the block follows on unless another client got in between.
        last = self.db.take(table, count - 1, stride)
        if last is not None and last - (count - 1) * stride.increment == first:
            return stride, int(last)
        last = self.db.take(table, count, stride)
        if last is not None:
            return stride, int(last)
        info = self.db.describe(table)
        last_id = info.last_id if info is not None and info.last_id is not None else 0
        raise self._exhausted(table, count, max(0, (table.max_id - last_id) // stride.increment))

    def _exhausted(self, table: TicketTable, count: int, left: int) -> ExhaustedError:
        return ExhaustedError(
            f"sequence {table.label} on {self} cannot issue {count} more id(s): "
            f"{left} left below {table.max_id} (the {table.bits}-bit limit); move it to a "
            "64-bit sequence or a new sequence before it runs out",
            remaining=left,
        )

    def _accept_new_stride(self, known: Known, info: TableInfo) -> None:
        """A restride changed the table's stride while this process ran. The new stride is
        taken if this server kept its position (its offset); ``StrideMismatchError`` if not."""
        if self.stride is not None and info.offset != self.stride[1]:
            raise StrideMismatchError(
                f"{self} was restrided to increment={info.increment}, offset={info.offset} for "
                f"{known.table.label}, which no longer matches its position (offset "
                f"{self.stride[1]}); give this process the new list of servers"
            )
        logger.warning(
            "%s: %s now has increment=%d, offset=%d (was %d, %d)",
            self, known.table.label, info.increment, info.offset,
            known.info.increment, known.info.offset,
        )
        known.info = info
