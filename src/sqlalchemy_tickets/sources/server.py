"""One ticket database: every call is one round trip on the source's own autocommit connections."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from .. import _process
from .._deprecation import deprecated_alias
from .._naming import (
    DEFAULT_TABLE_TEMPLATE,
    STAMP_TABLE,
    TicketTable,
    check_bits,
    check_seconds,
    check_stride,
    check_table_template,
    normalize_sequence,
    ticket_table,
)
from ..dialects import TicketBackend, backend_for
from ..dialects._connect import Bind, OwnEngine, create_under_lock, to_url
from ..dialects.base import MANY, Identity, TableInfo, TableSpec
from ..errors import (
    ExhaustedError,
    StrideMismatchError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from . import _rewind
from ._rewind import DEFAULT_REWIND_MARGIN, RewindPolicy
from ._stamps import Stamps, create_stamp_table
from .base import Request, check_count, check_ids

logger = logging.getLogger("sqlalchemy_tickets")


def _sync_bind(bind: Bind) -> Bind:
    """The URL of an asyncio driver (``mysql+aiomysql``, ``postgresql+asyncpg``,
    ``sqlite+aiosqlite``...) becomes the same database on its family's synchronous driver:
    ticket round trips run on threads, never on an event loop. Engines go as given."""
    if not isinstance(bind, (str, URL)):
        return bind
    url = to_url(bind)
    return backend_for(url.get_backend_name()).sync_url(url)


_servers: weakref.WeakSet[TicketServer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A child must not share its parent's sockets; close=False leaves them to the parent.
    for server in list(_servers):
        server.own.dispose(close=False)
        high = server._high
        server._reset_state()
        server._high = high  # the parent's marks hold in the child too


_process.after_fork_in_child(_after_fork_in_child)


#: The offset a restride gives a table while it pauses it: no position has it.
PAUSED_OFFSET = 0

#: Counts above this are checked against the sequence's bit width before anything else.
_MAX_ID_32 = 2**31 - 1

#: Sequences whose first contact is made together (:meth:`TicketServer.prepare`).
PREPARE_BATCH = 1000

#: Sequences whose blocks are taken in one transaction (:meth:`TicketServer.next_blocks`): a
#: few dozen keep each ticket row's lock short.
TAKE_BATCH = 64

_R = TypeVar("_R")

#: Tables in the first batch of a creation; the next ones are sized from its pace.
_FIRST_BATCH = 10
#: The share of the timeout a batch of creations is sized to take.
_BATCH_SHARE = 0.25

#: Times a block is asked for again when the table changed between a take and its describe
#: (seeded by its creator, restrided), before the server counts as unavailable.
_MISS_RETRIES = 5


class _Mark:
    """What a server issued of one table in this process, for telling a rewind from ids it
    gave back: the most recent blocks it kept, the highest id of older ones, and a floor it
    was told (ids in use elsewhere). ``high`` is the highest of them: a block at or below it is
    a rewind. Changed under the server's lock (give-backs and floors also under its gate)."""

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


class _MarkGate:
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


@dataclass(eq=False)
class _Known:
    """A table this server has seen, the stride it was last seen with, and its identity when
    last checked (at ``checked`` on the clock, on the server's connection ``epoch``)."""

    table: TicketTable
    info: TableInfo
    identity: Identity | None = None
    checked: float = 0.0
    epoch: int = 0


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
        #: The server's own engine and bounded round trip.
        self.own = OwnEngine(
            _sync_bind(bind),
            timeout=timeout,
            pool_size=pool_size,
            what="ticket server",
            embedded=embedded,
            unavailable=TicketServerUnavailable,
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
        #: Where a table this server creates on first use starts: above what its peers issued
        #: (set by TicketServers), so a server added with an empty database cannot reissue ids.
        self.start_above: Callable[[TicketTable], int] | None = None
        #: Floors kept outside this database (set by TicketServers: what the other servers of
        #: the pair issued): a rewind is healed above the highest of them.
        self.floors: list[Callable[[TicketTable], int | None]] = []
        #: The same for many tables at once (set by TicketServers: one round trip per peer).
        self.start_above_many: Callable[[list[TicketTable]], dict[TicketTable, int]] | None = (
            None
        )
        #: Called with (table, target) after this server healed a rewind (set by
        #: TicketServers: the other servers move above it too, so the floor a later heal of
        #: this server reads is above the ids it issued since).
        self.after_heal: list[Callable[[TicketTable, int], None]] = []
        self.backend: TicketBackend = self.own.backend
        self.engine: Engine = self.own.engine
        #: Whether the database takes transaction blocks (PgBouncer in statement pooling does not).
        self._transactions = True
        self._reset_state()
        _servers.add(self)

    def _reset_state(self) -> None:
        self._lock = threading.Lock()
        # Per caller spelling of (sequence, bits): the table and what is known of it, so the
        # hot path validates a name once, not per call.
        self._known: dict[tuple[str | None, int], _Known] = {}
        self._issued = 0
        self._round_trips = 0
        # Per table, the highest id issued here or known to be in use: no block may reach it.
        self._high: dict[TicketTable, _Mark] = {}
        self._rewinds = 0
        self._marks = _MarkGate()
        #: The identities recorded in the database (its stamp table).
        self.stamps = Stamps(self.own, create=self.create_missing, command=(
            f"`sqlalchemy-tickets init --url {self.url.render_as_string(hide_password=True)}` "
            "(or op.create_ticket_table() in a migration)"))

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
                cluster = self._round_trip(self._cluster, ticket_table("cluster"))
                if cluster:
                    increment, offset = self.stride
                    template = f"{template}__lane{offset}of{increment}"
                    logger.info("%s is a node of the Galera cluster %s: its tables are %s",
                                self, cluster, template)
            self._lane_template = template
        return self._lane_template

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
        elif known.epoch != self.own.connections or (
            not self.backend.identity_in_block_complete
            and time.monotonic() - known.checked >= self.identity_interval
        ):
            self._check_identity(known)
        table = known.table
        with self._marks.taking():
            for _ in range(_MISS_RETRIES):
                # Read before the take: a block taken concurrently may land first and be
                # higher. (Give-backs and new floors, which move the mark otherwise, wait
                # for the takes in flight.)
                mark = self._mark(table)
                high = mark.high
                epoch = self.own.connections
                block = self._take_block(known, count)
                if self.own.connections != epoch and self._check_identity(known):
                    continue  # taken on a new connection, from a database that changed
                if block.start > high:
                    with self._lock:
                        self._issued += count
                        mark.issued(block)
                    return block
                # Ids at or below what this process issued: the database went back in time.
                # The block is burned; the sequence moves above the floor, or RewindError.
                self._rewound(known, f"it offered ids {block.start}..{block[-1]}, at or "
                              f"below {high}, the highest id issued or known in use here")
        raise TicketServerUnavailable(
            f"{table.label} on {self} kept offering ids already issued; try again"
        )

    def _mark(self, table: TicketTable) -> _Mark:
        mark = self._high.get(table)
        if mark is None:
            with self._lock:
                mark = self._high.setdefault(table, _Mark())
        return mark

    def _take_block(self, known: _Known, count: int) -> range:
        try:
            last = self._round_trip(self._take, known.table, count, known.info, known.identity)
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
        info = known.info if known is not None else self._round_trip(self._describe, table)
        if info is None or ids.step != info.increment or (ids.start - info.offset) % ids.step:
            return 0
        with self._marks.moving():
            if not self._round_trip(self._give_back, table, ids, info):
                return 0
            with self._lock:
                # They may come out again: below the mark, but not a rewind.
                self._mark(table).returned(ids)
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
        with self._marks.moving():
            self._mark(table).raise_floor(floor)
            known = self._known.get((sequence, bits)) or self._first_contact(sequence, bits)
            info = self._round_trip(self._describe, table)
            if info is None or info.last_id is None or info.last_id + info.increment > floor:
                return False
            self._rewound(known, f"its next id ({info.last_id + info.increment}) is at or "
                          f"below {floor}, an id already in use")
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
            self._first_contact_many(items[start : start + PREPARE_BATCH], bits)

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
        wanted: list[tuple[int, _Known, range]] = []
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
            with self._marks.moving():
                moved = self._round_trip(self._give_back_together, part[0][1].table,
                                         [(k.table, ids, k.info) for _, k, ids in part])
                with self._lock:
                    for (i, known, ids), back in zip(part, moved, strict=True):
                        if back:
                            self._mark(known.table).returned(ids)
                            out[i] = len(ids)
        return out

    def _first_contact_many(
        self, items: list[tuple[str | None, TicketTable]], bits: int
    ) -> None:
        tables = [table for _, table in items]
        lives = self._many(self._identities, tables)
        missing = [t for t in tables if lives.get(t) is None]
        if missing:
            if not self.create_missing:
                raise UnknownSequenceError(
                    f"no ticket table {missing[0].name} for sequence {missing[0].label} on "
                    f"{self} (and {len(missing) - 1} more); create them with "
                    "`sqlalchemy-tickets init` or op.create_ticket_tables()"
                )
            self._create_many_on_first_use(missing)
            lives.update(self._many(self._identities, missing))
        present = [t for t in tables if lives.get(t) is not None]
        infos = self._many(self._describe_many, present)
        recorded: dict[str, Identity] = {}
        new: dict[TicketTable, tuple[Identity, int | None]] = {}
        first_error: TicketsError | None = None
        if present:
            recorded = self.stamps.read_many(present)
        alone: list[tuple[str | None, TicketTable]] = []
        ready: list[tuple[str | None, _Known]] = []
        for sequence, table in items:
            live, info = lives.get(table), infos.get(table)
            if live is None or (info is None and not table.flickr):
                alone.append((sequence, table))  # went away, or no row yet: the long way
                continue
            if info is None:
                info = TableInfo(*(self.stride or (1, 1)), None)  # Flickr's, no row yet
            try:
                self._check_stride(table, info)
            except TicketsError as error:
                first_error = first_error or error
                continue
            known = _Known(table, info)
            stored = recorded.get(table.name)
            if stored is not None and not live.same(stored):
                alone.append((sequence, table))  # changed since recorded: a rewind to judge
                continue
            if stored is None and self.stamps.kept:
                new[table] = (live, info.last_id)
            known.identity, known.checked = live, time.monotonic()
            ready.append((sequence, known))
        try:
            self.stamps.record_many(new)
        except sa_exc.IntegrityError:
            pass  # recorded concurrently: the next check reads it
        epoch = self.own.connections
        with self._lock:
            for sequence, known in ready:
                known.epoch = epoch
                self._known[sequence, bits] = known
        for sequence, _ in alone:
            try:
                self._first_contact(sequence, bits)
            except TicketsError as error:
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    def _create_many_on_first_use(self, tables: list[TicketTable]) -> None:
        """Create tables found missing on first contact, each above what its peers issued and
        above ids known in use (as :meth:`_create_on_first_use` does for one)."""
        starts: dict[TicketTable, int] = {}
        above_peers = self.start_above_many(tables) if self.start_above_many else {}
        for table in tables:
            start = above_peers.get(table, 0) + 1
            mark = self._high.get(table)
            start = max(start, (mark.high if mark is not None else 0) + 1)
            starts[table] = min(max(1, start), table.max_id)
        increment, offset = self.stride or (1, 1)
        specs = [TableSpec(t, starts[t], increment, offset, self.storage_engine) for t in tables]
        self._create(specs)

    def _take_together(self, wanted: list[tuple[_Known, int]]) -> list[range | None]:
        """One transaction taking a block of each table (``None``: a table the plain take could
        not serve: its caller goes the long way)."""
        for known, _ in wanted:
            if known.epoch != self.own.connections or (
                not self.backend.identity_in_block_complete
                and time.monotonic() - known.checked >= self.identity_interval
            ):
                self._check_identities([k for k, _ in wanted])
                break
        out: list[range | None] = []
        with self._marks.taking():
            marks = [self._mark(known.table) for known, _ in wanted]
            highs = [mark.high for mark in marks]
            epoch = self.own.connections
            lasts: list[int | None] = self._round_trip(
                self._take_many, wanted[0][0].table,
                [(k.table, count, k.info, k.identity) for k, count in wanted],
            )
            if self.own.connections != epoch and self._check_identities([k for k, _ in wanted]):
                return [None] * len(wanted)  # a new connection reached a changed database
            with self._lock:
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

    def _check_identities(self, knowns: list[_Known]) -> bool:
        """Compare many tables' identities with those last seen, in one round trip; a table
        that changed is checked (and healed or refused) alone. Whether any changed."""
        lives = self._many(self._identities, [k.table for k in knowns])
        changed = False
        epoch, now = self.own.connections, time.monotonic()
        for known in knowns:
            live = lives.get(known.table)
            if live is not None and known.identity is not None and live.same(known.identity):
                known.checked, known.epoch = now, epoch
            else:
                changed = self._check_identity(known) or changed
        return changed

    def _check_stride(self, table: TicketTable, info: TableInfo) -> None:
        self._check_paused(table, info)
        if self.stride is not None and (info.increment, info.offset) != self.stride:
            increment, offset = self.stride
            raise StrideMismatchError(
                f"{self} has increment={info.increment}, offset={info.offset} for "
                f"{table.label}, but its position needs increment={increment}, "
                f"offset={offset}; fix the server (or the order of the servers) before "
                "issuing ids, or ids would be duplicated"
            )

    def record_identity(self, sequence: str | None, *, bits: int = 64) -> Identity | None:
        """Record the table's identity as it is now (after an operator moved the sequence above
        every id in use: ``sqlalchemy-tickets sync``), so that processes that refused to issue
        (:class:`~sqlalchemy_tickets.RewindError`) resume. Returns it (``None``: no table)."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        live: Identity | None = self._round_trip(self._identity, table)
        if live is not None:
            info = self._round_trip(self._describe, table)
            self.stamps.record(table, live, info.last_id if info is not None else None)
        return live

    def identities(self, sequence: str | None, *, bits: int = 64) -> tuple[
        Identity | None, Identity | None
    ]:
        """``(recorded, now)``: the identity recorded for the sequence's table and the one the
        database shows (``None`` where there is none). They differ after a restore or a
        failover that no process has seen yet."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        live: Identity | None = self._round_trip(self._identity, table)
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
        lives = self._many(self._identities, tables)
        present = [t for t in tables if lives.get(t) is not None]
        infos = self._many(self._describe_many, present)
        return [infos.get(t) for t in tables]

    def describe(self, sequence: str | None, *, bits: int = 64) -> TableInfo | None:
        """The stride and last issued id of a sequence's table (``None``: no row yet).

        Raises :class:`UnknownSequenceError` if the table does not exist.
        """
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        info: TableInfo | None = self._round_trip(self._describe, table)
        return info

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
        return self._create(self._specs(sequences, bits, start, increment, offset))

    def _specs(
        self,
        sequences: Iterable[str | None],
        bits: int,
        start: int,
        increment: int | None,
        offset: int | None,
    ) -> list[TableSpec]:
        """The tables of ``sequences``, one per name, every argument checked (no I/O but the
        first ``table_template`` of a server with a stride)."""
        if isinstance(sequences, (str, bytes)):
            raise TicketsError(
                f"sequences must be a list of names, not the string {sequences!r} "
                "(create_tables([name]), or create(name))"
            )
        default_inc, default_off = self.stride or (1, 1)
        inc = default_inc if increment is None else increment
        off = default_off if offset is None else offset
        check_stride(start, inc, off, check_bits(bits))
        names = [normalize_sequence(sequence) for sequence in sequences]
        specs: dict[str, TableSpec] = {}
        for name in names:
            table = ticket_table(name, bits, self.table_template)
            specs.setdefault(table.name, TableSpec(table, start, inc, off, self.storage_engine))
        return list(specs.values())

    def _create(self, specs: list[TableSpec], *, reseed: bool = False) -> list[str]:
        """Create the tables of ``specs`` that are missing, in batches; the names created.
        ``reseed``: also seed those that exist (a reader found one without its row: on
        MySQL/MariaDB, where DDL commits at once, its creator is half-way or died there)."""
        if not specs:
            return []
        # Built before anything runs: a table the backend refuses (Flickr's with a stride
        # where the server cannot supply one) fails with nothing written.
        statements = {spec.table.name: self.backend.create_statements(spec) for spec in specs}
        def look(conn: sa.Connection) -> set[str]:
            for spec in specs:
                self.backend.check_create(conn, spec)
            names = [spec.table.name for spec in specs]
            return self.backend.existing_tables(conn, [*names, STAMP_TABLE])

        try:
            existing = self.own.run(look)
        except sa_exc.DBAPIError as error:
            raise self.own.unavailable(error) from error
        if STAMP_TABLE not in existing:
            # Made with the ticket tables, so that clients with no right to create tables
            # keep every guard against rewinds (``_stamps.py``).
            create_stamp_table(self.own)
        if reseed:
            existing = set()
        pending = [spec for spec in specs if spec.table.name not in existing]
        created: list[str] = []
        size = min(_FIRST_BATCH, self.backend.create_batch)
        while pending:
            batch, pending = pending[:size], pending[size:]
            began = time.monotonic()
            made = self._create_batch(batch, statements)
            created += made
            if not made:
                continue  # another creator made them: its pace says nothing of ours
            # While a batch runs, other creators of its tables (on SQLite, every writer of
            # the file) wait for its locks, each for at most the timeout: the next batch is
            # sized to take a share of it at this one's pace (per table made), at most twice
            # as large as this one.
            pace = max(time.monotonic() - began, 1e-6) / len(made)
            size = max(1, min(self.backend.create_batch, 2 * len(batch),
                              int(self.timeout * _BATCH_SHARE / pace)))
        return created

    def _create_batch(
        self, batch: list[TableSpec], statements: dict[str, list[sa.sql.Executable]]
    ) -> list[str]:
        """Create and seed ``batch`` (``statements``: each table's) as one step under its
        creation locks; the names of the tables that were not there once the locks were held."""
        fresh: dict[str, None] = {}

        def under_locks(conn: sa.Connection) -> list[sa.sql.Executable]:
            # Another process may have created some since the first look. Their statements
            # run all the same (they change nothing there), so that on MySQL/MariaDB a table
            # whose creator was cut off before its seed gets it. Missing at any attempt: an
            # attempt that failed statement by statement (no transaction) may have made some.
            found = self.backend.existing_tables(conn, [spec.table.name for spec in batch])
            fresh.update((spec.table.name, None) for spec in batch if spec.table.name not in found)
            return [statement for spec in batch for statement in statements[spec.table.name]]

        self._transactions = create_under_lock(
            self.own, [spec.table for spec in batch], under_locks,
            transactions=self._transactions,
        )
        names = list(fresh)
        if len(names) == 1:
            logger.info("created ticket table %s on %s", names[0], self)
        elif names:
            logger.info("created %d ticket tables on %s (%s ... %s)",
                        len(names), self, names[0], names[-1])
        return names

    def stats(self) -> dict[str, int]:
        """Ids issued, round trips made and rewinds seen by this object (all sequences)."""
        with self._lock:
            return {"issued": self._issued, "round_trips": self._round_trips,
                    "rewinds": self._rewinds}

    def close(self) -> None:
        """Close the server's connections (a later call opens new ones)."""
        self.own.dispose()

    dispose = deprecated_alias(close, "dispose")

    def with_stride(self, increment: int, offset: int) -> TicketServer:
        """A server on the same database that must have this stride (for :class:`TicketServers`)."""
        twin = object.__new__(TicketServer)
        twin.__dict__.update(self.__dict__)
        twin.stride = (increment, offset)
        twin._lane_template = None
        twin._reset_state()
        _servers.add(twin)
        return twin

    # -- internals ----------------------------------------------------------------------------

    def _first_contact(self, sequence: str | None, bits: int) -> _Known:
        """Validate the name, read (or create) the table's stride, refuse one that disagrees."""
        table = ticket_table(sequence, check_bits(bits), self.table_template)
        try:
            info = self._round_trip(self._describe, table)
        except UnknownSequenceError:
            if not self.create_missing:
                raise
            self._create_on_first_use(table)
            info = self._round_trip(self._describe, table)
        if info is None and not table.flickr and self.create_missing:
            # A named table without its row: a creator that seeds outside the creation lock
            # (or an emptied table). Seeding is idempotent; whoever seeds first wins.
            self._create_on_first_use(table)
            info = self._round_trip(self._describe, table)
        if info is None:
            # Flickr's table with no row yet; its stride comes from the server.
            info = TableInfo(*(self.stride or (1, 1)), None)
        self._check_stride(table, info)
        known = _Known(table, info)
        # Before the table is known here: a rewind with no floor to heal above raises, and
        # the next call checks again (after an operator's sync, it passes).
        self._check_identity(known)
        with self._lock:
            self._known[sequence, bits] = known
        return known

    def _check_identity(self, known: _Known) -> bool:
        """Compare the table's identity with the one last seen (first contact: the one
        recorded in the database); a change that may have lost issued ids is a rewind.
        Returns whether there was one (healed: the sequence moved)."""
        table = known.table
        live: Identity | None = self._round_trip(self._identity, table)
        epoch = self.own.connections
        if live is None:
            return False  # no table: the take says so
        rewound = False
        reference = known.identity
        if reference is None:
            # First contact: the recorded identity, or this one recorded (one connection).
            reference = self.stamps.stored_or_recorded(table, live, known.info.last_id)
        if reference is None:
            pass
        elif live.same(reference):
            pass
        elif known.identity is not None and live.same(
            self.stamps.read(table) or known.identity
        ):
            # Changed since this process looked, but already vouched for in the database: by
            # an operator's sync, or by the process that healed it first. This process's own
            # high-water mark still guards what it issued.
            logger.info("%s: %s is on %s now, as recorded since", self, table.label, live)
        elif live.promoted_from(reference):
            logger.info("%s: %s is on %s now, after a failover to a synchronous standby (was "
                        "%s): no issued id was lost", self, table.label, live, reference)
            self.stamps.record(table, live, None)
        else:
            self._rewound(known, f"its identity changed from {reference} to {live} (restored "
                          "from a backup, or a replica promoted)", live=live)
            rewound = True
        known.identity = live
        known.checked = time.monotonic()
        known.epoch = epoch
        return rewound

    def _floors(self, table: TicketTable) -> list[int]:
        """What is known to be issued or in use, from this process and outside the database."""
        mark = self._high.get(table)
        found = [mark.high] if mark is not None and mark.high else []
        for floor in self.floors:
            try:
                value = floor(table)
            except TicketsError as error:
                logger.debug("a floor of %s is out of reach: %s", table.label, error)
                continue
            if value is not None:
                found.append(value)
        return found

    def _rewound(self, known: _Known, seen: str, live: Identity | None = None) -> None:
        """The database went back in time for ``known``: move the sequence above the highest
        floor plus the margin (``on_rewind="heal"``), or raise :class:`RewindError`."""
        table = known.table
        floors = self._floors(table)
        if self.on_rewind == "refuse" or not floors:
            raise _rewind.refusal(repr(self), self.url.render_as_string(hide_password=True),
                                  table, seen, floors)
        floor = max(floors)
        target = min(floor + self.rewind_margin * known.info.increment, table.max_id)
        self.raise_above(table, target)
        mark = self._mark(table)
        with self._lock:
            self._rewinds += 1
        # The target, not the floor: the ids issued from here on are this process's too, and
        # a second restore of the same backup must not be healed onto them again.
        mark.raise_floor(target)
        _rewind.counted(table)
        for healed in self.after_heal:
            healed(table, target)
        logger.warning(
            "%s: %s went back in time: %s; moved it above %d (the highest id known in use, "
            "%d, plus a margin): no id is issued twice", self, table.label, seen, target, floor,
        )
        if live is None:
            live = self._round_trip(self._identity, table)
        if live is not None:
            # Vouched for as it is now: other processes need not heal it again.
            self.stamps.record(table, live, target)
            known.identity = live

    def raise_above(self, table: TicketTable, floor: int) -> None:
        """Move ``table`` so its next id is above ``floor`` (never lowering): one statement."""
        t = self.backend.table(TableSpec(table))
        try:
            with self.own.connect() as conn:
                conn.execute(self.backend.raise_floor_statement(t, floor))
        except sa_exc.DBAPIError as error:
            raise self.own.unavailable(error) from error

    def _check_paused(self, table: TicketTable, info: TableInfo) -> None:
        if info.offset == PAUSED_OFFSET:
            raise TicketServerUnavailable(
                f"{table.label} on {self} is paused while its servers are restrided; "
                "it issues ids again when the restride completes"
            )

    def _create_on_first_use(self, table: TicketTable) -> None:
        # Above what the peers issued, and above ids known in use (a table's largest key told
        # by ensure_above before the first block): a new table starts past them, no rewind.
        start = self.start_above(table) + 1 if self.start_above is not None else 1
        mark = self._high.get(table)
        start = max(start, (mark.high if mark is not None else 0) + 1)
        start = min(max(1, start), table.max_id)
        self._create(self._specs([table.sequence], table.bits, start, None, None), reseed=True)

    def _after_miss(self, known: _Known, count: int) -> tuple[TableInfo, int]:
        """The take advanced nothing: the stride changed, the row is missing (Flickr's before
        its first id; a named table's before its creator seeded it), the table changed between
        the take and now, or the sequence is exhausted. Returns the stride used and the block's
        last id."""
        table = known.table
        for _ in range(_MISS_RETRIES):
            if known.identity is not None and self.backend.identity_in_block:
                self._check_identity(known)  # the take refuses a table whose identity changed
            info = self._round_trip(self._describe, table)
            if info is not None and info.last_id is not None and not table.flickr:
                old = known.info
                if (info.increment, info.offset) != (old.increment, old.offset):
                    self._check_paused(table, info)
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
                self._create_on_first_use(table)
            else:
                left = max(0, (table.max_id - info.last_id) // stride.increment)
                if count > left:
                    raise self._exhausted(table, count, left)
            # The row is there now, with room: take again.
            last = self._round_trip(self._take, table, count, stride)
            if last is not None:
                return stride, int(last)
        raise TicketServerUnavailable(
            f"{table.label} on {self} changed under every one of {_MISS_RETRIES} attempts "
            "to take a block; try again"
        )

    def _start_flickr(self, known: _Known, count: int) -> tuple[TableInfo, int]:
        """Flickr's table has no row yet: make it as a legacy client does."""
        table, stride = known.table, known.info
        first = int(self._round_trip(self._start_row, table))
        if count == 1:
            return stride, first
        # The rest of the block follows on unless another client got in between.
        last = self._round_trip(self._take, table, count - 1, stride)
        if last is not None and last - (count - 1) * stride.increment == first:
            return stride, int(last)
        last = self._round_trip(self._take, table, count, stride)
        if last is not None:
            return stride, int(last)
        info = self._round_trip(self._describe, table)
        last_id = info.last_id if info is not None and info.last_id is not None else 0
        raise self._exhausted(table, count, max(0, (table.max_id - last_id) // stride.increment))

    def _exhausted(self, table: TicketTable, count: int, left: int) -> ExhaustedError:
        return ExhaustedError(
            f"sequence {table.label} on {self} cannot issue {count} more id(s): "
            f"{left} left below {table.max_id} (the {table.bits}-bit limit); move it to a "
            "64-bit sequence or a new sequence before it runs out",
            remaining=left,
        )

    def _accept_new_stride(self, known: _Known, info: TableInfo) -> None:
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

    def _take(
        self,
        cursor: Any,
        table: TicketTable,
        count: int,
        info: TableInfo,
        identity: Identity | None = None,
    ) -> int | None:
        return self.backend.take_block(cursor, self.engine.dialect, table, count, info, identity)

    def _identity(self, cursor: Any, table: TicketTable) -> Identity | None:
        return self.backend.identity(cursor, self.engine.dialect, table)

    def _many(
        self,
        read: Callable[[Any, TicketTable, list[TicketTable]], dict[TicketTable, _R]],
        tables: list[TicketTable],
    ) -> dict[TicketTable, _R]:
        """``read`` of many tables, a few hundred per round trip (each bounded by the
        timeout on its own)."""
        found: dict[TicketTable, _R] = {}
        for start in range(0, len(tables), MANY):
            part = tables[start : start + MANY]
            found.update(self._round_trip(read, part[0], part))
        return found

    def _identities(
        self, cursor: Any, table: TicketTable, tables: list[TicketTable]
    ) -> dict[TicketTable, Identity | None]:
        return self.backend.identities(cursor, self.engine.dialect, tables)

    def _describe_many(
        self, cursor: Any, table: TicketTable, tables: list[TicketTable]
    ) -> dict[TicketTable, TableInfo | None]:
        return self.backend.describe_many(cursor, self.engine.dialect, tables)

    def _together(self, cursor: Any, work: Callable[[], list[_R]]) -> list[_R]:
        """``work()`` in one transaction on ``cursor`` (where the server takes transaction
        blocks): many small writes, one commit."""
        if not self._transactions:
            return work()
        cursor.execute("BEGIN")
        try:
            found = work()
        except BaseException:
            with contextlib.suppress(Exception):  # the connection is discarded anyway
                cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")
        return found

    def _take_many(
        self,
        cursor: Any,
        table: TicketTable,
        wanted: list[tuple[TicketTable, int, TableInfo, Identity | None]],
    ) -> list[int | None]:
        dialect = self.engine.dialect
        return self._together(cursor, lambda: [
            self.backend.take_block(cursor, dialect, t, count, info, identity)
            for t, count, info, identity in wanted
        ])

    def _give_back_together(
        self, cursor: Any, table: TicketTable, wanted: list[tuple[TicketTable, range, TableInfo]]
    ) -> list[bool]:
        dialect = self.engine.dialect
        return self._together(cursor, lambda: [
            self.backend.give_back_block(cursor, dialect, t, ids, info)
            for t, ids, info in wanted
        ])

    def _cluster(self, cursor: Any, table: TicketTable) -> str | None:
        return self.backend.cluster(cursor)

    def _give_back(self, cursor: Any, table: TicketTable, ids: range, info: TableInfo) -> bool:
        return self.backend.give_back_block(cursor, self.engine.dialect, table, ids, info)

    def _describe(self, cursor: Any, table: TicketTable) -> TableInfo | None:
        return self.backend.describe(cursor, self.engine.dialect, table)

    def _start_row(self, cursor: Any, table: TicketTable) -> int:
        start = getattr(self.backend, "start_flickr_row", None)
        if start is None:
            raise UnknownSequenceError(
                f"ticket table {table.name} on {self} has no row; recreate it with "
                "`sqlalchemy-tickets init`"
            )
        return int(start(cursor, self.engine.dialect, table))

    def _round_trip(self, work: Any, table: TicketTable, *args: Any) -> Any:
        """``work(cursor, table, *args)``: one bounded round trip through the pool
        (:meth:`OwnEngine.round_trip`: a connection found closed costs nothing but the
        attempt that found it), the database's refusals in the library's terms."""
        with self._lock:
            self._round_trips += 1
        try:
            return self.own.round_trip(lambda cursor: work(cursor, table, *args))
        except self.engine.dialect.loaded_dbapi.Error as error:
            if self.backend.is_missing_table(error):
                raise UnknownSequenceError(
                    f"no ticket table {table.name} for sequence {table.label} on {self}; "
                    f"create it with `sqlalchemy-tickets init --url URL "
                    f"{table.sequence or ''}` or op.create_ticket_table()"
                ) from error
            raise TicketsError(f"ticket server {self} rejected {table.label}: {error}") from error
