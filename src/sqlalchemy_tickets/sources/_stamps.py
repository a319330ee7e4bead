"""The stamp table of a database: what the library recorded there to notice that the database
went back in time (``docs/rewinds.md``) — each ticket table's and datacenter tier's identity,
and the highest id a tier stored from each upstream lane.

The table (``tickets_stamps``) is made with the ticket tables, by every path that makes them:
``sqlalchemy-tickets init``, ``op.create_ticket_table`` (online and in ``--sql`` output),
:meth:`TicketServer.create_tables <sqlalchemy_tickets.TicketServer.create_tables>` and a
datacenter tier's tables. At run time it is only read and written: a role with SELECT, INSERT,
UPDATE and DELETE on the library's tables keeps every guard, and nothing is created where the
table exists (PostgreSQL and MariaDB check the CREATE right before they look, so even
``CREATE TABLE IF NOT EXISTS`` would be refused to such a role).

Where it is missing (tables made by a release before 0.5, whose clients made it on first use),
a client that may create tables (``create_missing``) makes it, under the creation lock.
Otherwise the client logs one WARNING per database naming the command that adds it, and goes
on without a record: a restore or a failover is then still recognised by the processes that
issued ids before it (their own high-water marks), by the other servers of a pair and by the
application tables a sequence serves (the first flush of each table reads its largest key), but
a process that starts after it, on a ticket table no application table vouches for, cannot tell.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .. import _schema
from .._naming import STAMP_TABLE, TicketTable
from ..dialects._connect import OwnEngine, create_under_lock
from ..dialects.base import Identity
from ..errors import DatabaseUnavailable

logger = logging.getLogger("sqlalchemy_tickets")

_R = TypeVar("_R")

#: The creation lock of the stamp table is keyed by its name, as a ticket table's is.
STAMPS = TicketTable(None, 64, STAMP_TABLE)

#: Databases (URLs) whose missing stamp table was reported in this process: once each.
_reported: set[str] = set()
_reported_lock = threading.Lock()


def create_stamp_table(own: OwnEngine) -> None:
    """Make the stamp table of ``own``'s database, under its creation lock (concurrent
    creators wait for each other); nothing happens where it exists."""
    create_under_lock(own, [STAMPS], lambda conn: _schema.stamp_statements(own.backend))


class Stamps:
    """The stamp table of one database, as one client of the library uses it.

    Args:
        own: the client's engine on the database.
        create: whether this client may make the table where it is missing.
        command: what the WARNING tells an operator to run when it cannot.
    """

    def __init__(self, own: OwnEngine, *, create: bool, command: str) -> None:
        self.own = own
        self.backend = own.backend
        self._create = create
        self._command = command
        #: False once the table proved missing and out of this client's reach.
        self.kept = True

    # -- one unit on the table ----------------------------------------------------------------

    def _use(self, work: Callable[[sa.Connection], _R], missing: _R) -> _R:
        """``work(conn)`` in one unit; ``missing`` where the table is not there and cannot be
        made here. An outage raises the client's unavailable error: a guard is never skipped
        because the database did not answer."""
        if not self.kept:
            return missing
        for attempt in (1, 2):
            try:
                return self.own.run(work)
            except sa_exc.IntegrityError:
                raise  # a concurrent writer of the same row: the caller's to handle
            except sa_exc.DBAPIError as error:
                verdict = self.out_of_reach(error) if attempt == 1 else None
                if verdict is False:
                    continue  # made now
                if verdict:
                    return missing
                raise self.own.unavailable(error) from error
        raise AssertionError("unreachable")  # pragma: no cover

    def out_of_reach(self, error: BaseException) -> bool | None:
        """What a database error means for the stamp table: ``None``, not that it is missing
        (another table may be);
        ``False``, it was missing and is made now (run the unit again); ``True``, it is missing
        and cannot be made here (reported once; :attr:`kept` is now false)."""
        orig = getattr(error, "orig", None) or error
        if self.backend.is_denied(orig):
            return self._lost(f"it may not use it: {orig}")
        if not self.backend.is_missing_table(orig) or STAMP_TABLE in self.own.run(
            lambda conn: self.backend.existing_tables(conn, [STAMP_TABLE])
        ):
            return None  # another table is missing
        if self._create:
            try:
                create_stamp_table(self.own)
            except DatabaseUnavailable as made:
                cause = getattr(made.__cause__, "orig", None) or made.__cause__
                if cause is None or not self.backend.is_denied(cause):
                    raise
                return self._lost(f"it may not create it: {cause}")
            logger.info("created %s on %s", STAMP_TABLE, self.own.url.render_as_string())
            return False
        return self._lost("create_missing=False")

    def _lost(self, why: str) -> bool:
        self.kept = False
        url = self.own.url.render_as_string()
        with _reported_lock:
            if url in _reported:
                return True
            _reported.add(url)
        logger.warning(
            "%s: the %s table, where the library records its tables' identities, is missing or "
            "out of this client's reach (%s): a restore or a failover of this database is noticed "
            "only by processes that issued ids before it, the other servers of a pair and the "
            "tables a sequence serves; add it with %s",
            url, STAMP_TABLE, why, self._command,
        )
        return True

    # -- identities ---------------------------------------------------------------------------

    def read(self, table: TicketTable) -> Identity | None:
        """The identity recorded for ``table`` (``None``: none, or no table to keep it)."""
        return self._use(lambda conn: self.backend.read_stamp(conn, table), None)

    def read_many(self, tables: Sequence[TicketTable]) -> dict[str, Identity]:
        """The identities recorded for ``tables``, by table name."""
        return self._use(lambda conn: self.backend.read_stamps(conn, tables), {})

    def record(self, table: TicketTable, identity: Identity, last_id: int | None) -> None:
        """Record ``identity`` as ``table``'s."""
        self._use(lambda conn: self.backend.record_stamp(conn, table, identity, last_id), None)

    def record_many(self, stamps: Mapping[TicketTable, tuple[Identity, int | None]]) -> None:
        """:meth:`record` of many tables (``table -> (identity, last_id)``)."""
        if stamps:
            self._use(lambda conn: self.backend.record_stamps(conn, stamps), None)

    def stored_or_recorded(
        self, table: TicketTable, live: Identity, last_id: int | None
    ) -> Identity | None:
        """The identity recorded for ``table``; where none is, ``live`` is recorded (and
        ``None`` returned). One unit: two first contacts at once record one of theirs."""

        def work(conn: sa.Connection) -> Identity | None:
            stored = self.backend.read_stamp(conn, table)
            if stored is None:
                self.backend.record_stamp(conn, table, live, last_id)
            return stored

        try:
            return self._use(work, None)
        except sa_exc.IntegrityError:
            return self.read(table)  # recorded concurrently: read it
