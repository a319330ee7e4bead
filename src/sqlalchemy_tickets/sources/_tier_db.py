"""A datacenter tier's database as the tier's parts use it: one bounded unit of work (a
transaction, or autocommit statements) through the library's one pool on it, the tables and
state rows made where missing, and the check of the database's identity — a restore or a
promoted replica brings back ranges already issued, so the first process to see it discards the
whole stock (once, whichever process that is) and refills from upstream. See
:mod:`~sqlalchemy_tickets.sources.datacenter` for the whole design."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .._naming import TicketTable, TierTables
from ..dialects._connect import OwnEngine
from ..dialects.base import Identity
from ..errors import DatabaseUnavailable, TicketServerUnavailable, UnknownSequenceError
from ._lanes import Lane
from ._stamps import Stamps
from ._tier_admin import create_tables, has_columns, missing_table, older_release
from ._tier_store import Key, TierStore

logger = logging.getLogger("sqlalchemy_tickets")

_T = TypeVar("_T")


class MissingTables(Exception):
    """The tier's tables are not there (raised inside a unit, handled by its caller)."""


class NoState(Exception):
    """A sequence has no state row yet."""


class Moved(Exception):
    """The tier's database is not the one this process last saw (restored, failed over)."""


def sequence_name(sequence: str | None) -> str:
    """The ``sequence_name`` column's value: Flickr's tables (``None``) are ``''``."""
    return "" if sequence is None else sequence


@dataclass(eq=False)
class TierLane(Lane):
    """One (sequence, bits) of a tier in this process: its counters and waiters (under
    ``lock``; ``changed`` wakes callers waiting on an empty stock: a block stored, a range
    given back, a refill failed, closed)."""

    ready: bool = False  # its state row is known to exist
    wanted: int = 0  # ids a caller asked for beyond the stock: the next refill brings them
    stored: int = 0  # blocks this process stored: what a waiting caller waits for
    floor: int = 0  # ids up to here are in use (ensure_above): upstream must offer above it
    told: bool = False  # upstream was told the marks of this lane, in this process
    claimed_at: int = 0  # database clock (ms) of this process's last refill claim
    # Counters.
    issued: int = 0
    round_trips: int = 0
    upstream_round_trips: int = 0
    refills: int = 0
    refilled: int = 0
    claims: int = 0
    claims_lost: int = 0
    burned: int = 0
    given_back: int = 0
    blocking_waits: int = 0
    rewinds: int = 0  # blocks upstream offered at or below what the tier stored from it

    @property
    def name(self) -> str:
        return sequence_name(self.sequence)

    @property
    def key(self) -> Key:
        return self.name, self.bits


class TierDatabase:
    """The units of work of one tier on its database.

    Args:
        own: the tier's engine: the one pool every unit goes through.
        names: the tier's tables.
        create_missing: make the tables and the stamp table where they are missing.
        identity_interval: seconds between identity checks beyond those after each new
            connection.
        stamps: where the tier's identity is recorded.
        rewound: told how many ids were discarded when this process found the database
            rewound (the tier wakes its refills).
    """

    def __init__(
        self,
        own: OwnEngine,
        names: TierTables,
        *,
        create_missing: bool,
        identity_interval: float,
        stamps: Stamps,
        rewound: Callable[[int], None],
    ) -> None:
        self.own = own
        self.backend = own.backend
        self.names = names
        self.store = TierStore(self.backend, names)
        self.stamps = stamps
        self.create_missing = create_missing
        self.identity_interval = identity_interval
        self._rewound = rewound
        self.reset()

    def reset(self) -> None:
        """Forget what this process knew of the database (a forked child starts afresh)."""
        self._writing = threading.Lock()
        # The database's identity as last checked, what its guard columns read then, when
        # (monotonic) and after which of the engine's connections.
        self.identity: Identity | None = None
        #: What the guard columns read at the last check: takes compare it in their statement.
        self.guard: tuple[Any, ...] | None = None
        self._checked = 0.0
        self._checked_epoch = -1
        self.rewinds = 0  # times this process found the tier's own database rewound
        self._created = False  # the tables were made (or upgraded) in this process

    def __repr__(self) -> str:
        return f"datacenter tier {self.own.url.render_as_string()}"

    # -- units of work -------------------------------------------------------------------------

    def run(self, work: Callable[[sa.Connection], _T], *, transaction: bool = True) -> _T:
        """``work(conn)`` as one bounded unit of work (a transaction, or autocommit
        statements), made again on a fresh connection when the pooled one was found closed
        (``OwnEngine.run``: ``work`` must be safe to run again); its errors in the library's
        terms (:class:`MissingTables` where a table is missing)."""
        timeout = self.own.timeout
        queued = self.backend.queue_local_writers
        if queued and not self._writing.acquire(timeout=timeout):
            raise TicketServerUnavailable(
                f"{self}: the database stayed busy with this process's other writers for "
                f"{timeout:g} s"
            )

        def unit(conn: sa.Connection) -> _T:
            if not transaction:
                return work(conn)
            with self.backend.transaction(conn, timeout):
                return work(conn)

        try:
            return self.own.run(unit)
        except self.own.engine.dialect.loaded_dbapi.Error as error:  # a raw cursor's
            raise self.own.unavailable(error) from error
        except sa_exc.DBAPIError as error:
            if missing_table(self.backend, error):
                raise MissingTables from error
            if isinstance(error, sa_exc.IntegrityError):
                raise
            raise self.own.unavailable(error) from error
        finally:
            if queued:
                self._writing.release()

    def transaction(
        self,
        lanes: Sequence[TierLane],
        work: Callable[[sa.Connection], _T],
        *,
        transaction: bool = True,
    ) -> _T:
        """``work(conn)`` in one unit, making the tables and the sequences' state rows first
        where they are missing, and checking the database's identity when it is due."""
        for _ in range(3):
            missing = [lane for lane in lanes if not lane.ready]
            if missing:
                self.ensure(missing)
            if self._checked_epoch != self.own.connections or (
                time.monotonic() - self._checked >= self.identity_interval
            ):
                self.verify_identity()
            try:
                return self.run(work, transaction=transaction)
            except (MissingTables, NoState):
                for lane in lanes:
                    lane.ready = False
            except Moved:
                self._checked_epoch = -1  # checked (and its stock discarded) before the next
        raise TicketServerUnavailable(
            f"{self}: the tables of {', '.join(lane.label for lane in lanes[:3])} went away "
            "under every attempt to use them; try again"
        )

    def peek(self, key: Key) -> bool:
        """Whether the stock of ``key`` holds ids (or upstream is exhausted), by a plain read
        that locks nothing."""
        try:
            row = self.own.run(lambda conn: self.store.look(conn, key))
        except (sa_exc.DBAPIError, DatabaseUnavailable):
            return True  # the take says what is wrong
        return row is None or row.stock > 0 or bool(row.exhausted)

    # -- tables and state rows ---------------------------------------------------------------

    def ensure(self, lanes: Sequence[TierLane]) -> None:
        """The sequences' state rows (and the tables) exist: made on first use, race-free."""
        if self.create_missing and not self._created:
            # Once per process; nothing is sent where the tables exist (create_tables looks).
            create_tables(self.own, self.names)
            self._created = True
        elif not self._created:
            self._check_columns()
        keys = [lane.key for lane in lanes]
        for attempt in (1, 2):
            try:
                self.run(lambda conn: self.store.seed(conn, keys))
                for lane in lanes:
                    lane.ready = True
                return
            except MissingTables:
                if attempt == 2:
                    raise TicketServerUnavailable(
                        f"{self}: the tier's tables went away right after they were created"
                    ) from None
            if not self.create_missing:
                raise UnknownSequenceError(
                    f"no datacenter tier tables ({self.names.stock}, {self.names.state}) on "
                    f"{self.own.url.render_as_string()}; create them with `sqlalchemy-tickets "
                    "init` or create_datacenter_tables()"
                )
            create_tables(self.own, self.names)

    def create_tables(self) -> None:
        create_tables(self.own, self.names)

    def _check_columns(self) -> None:
        """Refuse, with what to run, tables an older release made (``create_missing=False``
        leaves upgrading them to the operator)."""
        if has_columns(self.own, self.store.state):
            self._created = True
            return
        try:
            missing = self.run(
                lambda conn: [c for c, _ in self.backend.missing_columns(conn, self.store.state)],
                transaction=False,
            )
        except (MissingTables, sa_exc.NoSuchTableError):
            return  # no tables: the seed says so
        if missing:
            raise UnknownSequenceError(older_release(self.own, self.names))
        self._created = True

    # -- identity ----------------------------------------------------------------------------

    def verify_identity(self) -> None:
        """Check the database's identity; if it changed (restored, failed over), discard the
        stock once, whichever process sees it first, and record the new identity."""
        pseudo = TicketTable(None, 64, self.names.state)  # the tier's stamp: its state table's

        def check(conn: sa.Connection) -> tuple[Identity, Identity | None, tuple[Any, ...],
                                                 int | None] | None:
            cursor = conn.connection.cursor()
            try:
                live = self.backend.identity(cursor, self.own.engine.dialect, pseudo)
            finally:
                cursor.close()
            if live is None:
                return None  # the tables are not there yet
            guard = self.store.read_guard(conn)
            stored = self.backend.read_stamp(conn, pseudo)
            reference = self.identity or stored
            discarded = None
            if reference is None:
                self.backend.record_stamp(conn, pseudo, live, None)
            elif live.same(reference):
                # A failover is a rewind here, synchronous standby or not: the tier's writes
                # do not watch their replication (``IdentityGuard.follow``), so no lease
                # vouches for them.
                if stored is None or not stored.same(live):
                    self.backend.record_stamp(conn, pseudo, live, None)
            elif stored is not None and stored.same(live):
                pass  # another process saw it first and discarded the stock
            else:
                discarded = self.store.discard_everything(conn)
                self.backend.record_stamp(conn, pseudo, live, None)
            return live, reference, guard, discarded

        try:
            checked = self.run(check)
        except MissingTables as error:
            # The tables are not there yet, or the stamp table is missing: made now (checked
            # again next time), or out of this client's reach (reported once).
            self.stamps.out_of_reach(error.__cause__ or error)
            logger.debug("%s: identity check failed: %s", self, error.__cause__)
            return
        except (sa_exc.DBAPIError, DatabaseUnavailable) as error:
            logger.debug("%s: identity check failed: %s", self, error)
            return
        if checked is None:
            return
        live, reference, guard, discarded = checked
        if discarded is not None:
            self.rewinds += 1
            logger.warning(
                "%s: the datacenter database went back in time (its identity changed from %s "
                "to %s: restored, or a replica promoted): discarded its stock (%d ids, some "
                "possibly issued already) and refills from upstream: no id is issued twice",
                self, reference, live, discarded,
            )
            self._rewound(discarded)
        self.identity, self.guard = live, guard
        self._checked = time.monotonic()
        self._checked_epoch = self.own.connections
