"""The statements of one ticket database, each one bounded round trip through the library's one
pool on it (:class:`~sqlalchemy_tickets.dialects._connect.OwnEngine`), with the database's
refusals in the library's terms. What the statements say is each backend's (``dialects/``);
when to send them is :class:`~sqlalchemy_tickets.TicketServer`'s."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc

from .._naming import TicketTable
from ..dialects._connect import OwnEngine
from ..dialects.base import MANY, Identity, TableInfo, TableSpec
from ..errors import TicketsError, UnknownSequenceError

_R = TypeVar("_R")


class TicketDatabase:
    """One ticket database's statements.

    Args:
        own: the engine every round trip goes through.
        name: how messages name the database's client (``repr`` of the server).
    """

    def __init__(self, own: OwnEngine, name: Callable[[], str]) -> None:
        self.own = own
        self.backend = own.backend
        self._dialect = own.engine.dialect
        self._name = name
        self._lock = threading.Lock()
        #: Round trips made (every statement of this database's client).
        self.round_trips = 0
        #: Whether the database takes transaction blocks (PgBouncer in statement pooling does
        #: not: found out when creating tables, see ``create_under_lock``).
        self.transactions = True

    def __repr__(self) -> str:
        return self._name()

    def call(self, table: TicketTable, work: Callable[[Any], _R]) -> _R:
        """``work(cursor)``: one round trip (``OwnEngine.round_trip``: a connection found
        closed costs nothing but the attempt that found it)."""
        with self._lock:
            self.round_trips += 1
        try:
            return self.own.round_trip(work)
        except self._dialect.loaded_dbapi.Error as error:
            if self.backend.is_missing_table(error):
                raise UnknownSequenceError(
                    f"no ticket table {table.name} for sequence {table.label} on {self}; "
                    f"create it with `sqlalchemy-tickets init --url URL "
                    f"{table.sequence or ''}` or op.create_ticket_table()"
                ) from error
            raise TicketsError(f"ticket server {self} rejected {table.label}: {error}") from error

    # -- one table ---------------------------------------------------------------------------

    def take(
        self, table: TicketTable, count: int, info: TableInfo, identity: Identity | None = None
    ) -> int | None:
        """Advance ``table`` by ``count`` ids; the block's last id (``None``: it did not move,
        see :meth:`TicketBackend.take_block`)."""
        return self.call(table, lambda c: self.backend.take_block(
            c, self._dialect, table, count, info, identity))

    def describe(self, table: TicketTable) -> TableInfo | None:
        return self.call(table, lambda c: self.backend.describe(c, self._dialect, table))

    def identity(self, table: TicketTable) -> Identity | None:
        return self.call(table, lambda c: self.backend.identity(c, self._dialect, table))

    def give_back(self, table: TicketTable, ids: range, info: TableInfo) -> bool:
        return self.call(table, lambda c: self.backend.give_back_block(
            c, self._dialect, table, ids, info))

    def start_flickr_row(self, table: TicketTable) -> int:
        """Make Flickr's row as a legacy client does (``REPLACE INTO``); the id that issued."""
        if not self.backend.flickr_row_from_client:
            raise UnknownSequenceError(
                f"ticket table {table.name} on {self} has no row; recreate it with "
                "`sqlalchemy-tickets init`"
            )
        return self.call(table, lambda c: self.backend.start_flickr_row(c, self._dialect, table))

    def cluster(self) -> str | None:
        """The cluster whose nodes all write this database's tables (Galera), if any."""
        return self.call(TicketTable(None, 64, "cluster"), self.backend.cluster)

    def raise_above(self, table: TicketTable, floor: int) -> None:
        """Move ``table`` so its next id is above ``floor`` (never lowering): one statement."""
        statement = self.backend.raise_floor_statement(self.backend.table(TableSpec(table)), floor)
        try:
            self.own.run(lambda conn: conn.execute(statement))
        except sa_exc.DBAPIError as error:
            raise self.own.unavailable(error) from error

    # -- many tables -------------------------------------------------------------------------

    def _many(
        self,
        read: Callable[[Any, list[TicketTable]], dict[TicketTable, _R]],
        tables: Sequence[TicketTable],
    ) -> dict[TicketTable, _R]:
        """``read`` of many tables, a few hundred per round trip (each bounded on its own)."""
        found: dict[TicketTable, _R] = {}
        for start in range(0, len(tables), MANY):
            part = list(tables[start : start + MANY])

            def one(cursor: Any, part: list[TicketTable] = part) -> dict[TicketTable, _R]:
                return read(cursor, part)

            found.update(self.call(part[0], one))
        return found

    def identities(self, tables: Sequence[TicketTable]) -> dict[TicketTable, Identity | None]:
        """:meth:`identity` of many tables (``None``: no such table)."""
        return self._many(lambda c, part: self.backend.identities(c, self._dialect, part), tables)

    def describe_many(self, tables: Sequence[TicketTable]) -> dict[TicketTable, TableInfo | None]:
        """:meth:`describe` of many tables that exist (``None``: no row)."""
        return self._many(
            lambda c, part: self.backend.describe_many(c, self._dialect, part), tables)

    def take_many(
        self, wanted: Sequence[tuple[TicketTable, int, TableInfo, Identity | None]]
    ) -> list[int | None]:
        """:meth:`take` of each ``(table, count, info, identity)`` in one transaction."""
        return self.call(wanted[0][0], lambda c: self._together(
            c, lambda: self.backend.take_blocks(c, self._dialect, wanted), len(wanted)))

    def give_back_many(
        self, wanted: Sequence[tuple[TicketTable, range, TableInfo]]
    ) -> list[bool]:
        """:meth:`give_back` of each ``(table, ids, info)`` in one transaction."""
        return self.call(wanted[0][0], lambda c: self._together(
            c, lambda: self.backend.give_back_blocks(c, self._dialect, wanted), len(wanted)))

    def _together(self, cursor: Any, work: Callable[[], list[_R]], tables: int) -> list[_R]:
        """``work()`` on ``tables`` tables in one transaction on ``cursor`` (where the database
        takes transaction blocks): many small writes, one commit. One table's write is one
        statement, atomic in autocommit: a transaction would cost two round trips more."""
        if not self.transactions or tables == 1:
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
