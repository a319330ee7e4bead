"""Making a ticket server's tables: the specs of many sequences, checked before anything is
written, created in batches under their creation locks (with the stamp table, where missing)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .._naming import STAMP_TABLE, check_bits, check_stride, normalize_sequence, ticket_table
from .._schema import register_statements, stamp_statements
from ..dialects._connect import create_under_lock
from ..dialects.base import TableSpec
from ..errors import TicketsError
from ._stamps import STAMPS, create_stamp_table
from ._ticket_db import TicketDatabase

logger = logging.getLogger("sqlalchemy_tickets")

#: Tables in the first batch of a creation; the next ones are sized from its pace.
_FIRST_BATCH = 10
#: The share of the timeout a batch of creations is sized to take.
_BATCH_SHARE = 0.25


class TableMaker:
    """Creates the tables of one ticket database.

    Args:
        db: its statements (and the one pool they go through).
        stride: ``(increment, offset)`` of the tables it makes by default.
        storage_engine: MySQL/MariaDB's storage engine of the tables.
        template: how a sequence name becomes a table name (asked when needed: on a Galera
            node it takes a round trip).
    """

    def __init__(
        self,
        db: TicketDatabase,
        *,
        stride: tuple[int, int] | None,
        storage_engine: str,
        template: Callable[[], str],
    ) -> None:
        self.db = db
        self._stride = stride
        self.storage_engine = storage_engine
        self._template = template

    def __repr__(self) -> str:
        return repr(self.db)

    def specs(
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
        default_inc, default_off = self._stride or (1, 1)
        inc = default_inc if increment is None else increment
        off = default_off if offset is None else offset
        check_stride(start, inc, off, check_bits(bits))
        names = [normalize_sequence(sequence) for sequence in sequences]
        specs: dict[str, TableSpec] = {}
        for name in names:
            table = ticket_table(name, bits, self._template())
            specs.setdefault(table.name, TableSpec(table, start, inc, off, self.storage_engine))
        return list(specs.values())

    def create(self, specs: list[TableSpec], *, reseed: bool = False) -> list[str]:
        """Create the tables of ``specs`` that are missing, in batches; the names created.
        ``reseed``: also seed those that exist (a reader found one without its row: on
        MySQL/MariaDB, where DDL commits at once, its creator is half-way or died there)."""
        if not specs:
            return []
        # Built before anything runs: a table the backend refuses (Flickr's with a stride
        # where the server cannot supply one) fails with nothing written.
        statements = {spec.table.name: self.db.backend.create_statements(spec) for spec in specs}

        def look(conn: sa.Connection) -> set[str]:
            for spec in specs:
                self.db.backend.check_create(conn, spec)
            names = [spec.table.name for spec in specs]
            return self.db.backend.existing_tables(conn, [*names, STAMP_TABLE])

        try:
            existing = self.db.own.run(look)
        except sa_exc.DBAPIError as error:
            raise self.db.own.unavailable(error) from error
        # Made with the ticket tables, so that clients with no right to create tables keep
        # every guard against rewinds (``_stamps.py``): in the first batch's step, or alone
        # where every table is there already.
        stamps = STAMP_TABLE not in existing
        if reseed:
            existing = set()
        there = [spec.table.name for spec in specs if spec.table.name in existing]
        if stamps and len(there) == len(specs):
            create_stamp_table(self.db.own)
            stamps = False
        if there:
            # Registered as a migration registers them, where an older release made them
            # (the stamp table stays while a ticket table uses it: ``_schema.py``).
            registered = register_statements(self.db.backend, there)
            self.db.own.run(lambda conn: [conn.execute(st) for st in registered])
        pending = [spec for spec in specs if spec.table.name not in existing]
        created: list[str] = []
        size = min(_FIRST_BATCH, self.db.backend.create_batch)
        while pending:
            batch, pending = pending[:size], pending[size:]
            began = time.monotonic()
            made = self._batch(batch, statements, stamps=stamps)
            stamps = False
            created += made
            if not made:
                continue  # another creator made them: its pace says nothing of ours
            # While a batch runs, other creators of its tables (on SQLite, every writer of
            # the file) wait for its locks, each for at most the timeout: the next batch is
            # sized to take a share of it at this one's pace (per table made), at most twice
            # as large as this one.
            pace = max(time.monotonic() - began, 1e-6) / len(made)
            size = max(1, min(self.db.backend.create_batch, 2 * len(batch),
                              int(self.db.own.timeout * _BATCH_SHARE / pace)))
        return created

    def _batch(
        self,
        batch: list[TableSpec],
        statements: dict[str, list[sa.sql.Executable]],
        *,
        stamps: bool = False,
    ) -> list[str]:
        """Create and seed ``batch`` (``statements``: each table's) as one step under its
        creation locks (``stamps``: the stamp table first, under its lock too); the names of
        the tables that were not there once the locks were held."""
        fresh: dict[str, None] = {}

        def under_locks(conn: sa.Connection) -> list[sa.sql.Executable]:
            # Another process may have created some since the first look. Their statements
            # run all the same (they change nothing there), so that on MySQL/MariaDB a table
            # whose creator was cut off before its seed gets it. Missing at any attempt: an
            # attempt that failed statement by statement (no transaction) may have made some.
            found = self.db.backend.existing_tables(conn, [spec.table.name for spec in batch])
            fresh.update((spec.table.name, None) for spec in batch if spec.table.name not in found)
            first = stamp_statements(self.db.backend) if stamps else []
            return [*first, *(st for spec in batch for st in statements[spec.table.name])]

        locked = [spec.table for spec in batch]
        self.db.transactions = create_under_lock(
            self.db.own, [STAMPS, *locked] if stamps else locked, under_locks,
            transactions=self.db.transactions,
        )
        names = list(fresh)
        if len(names) == 1:
            logger.info("created ticket table %s on %s", names[0], self)
        elif names:
            logger.info("created %d ticket tables on %s (%s ... %s)",
                        len(names), self, names[0], names[-1])
        return names
