"""Starting a sequence again, for test suites: ``metadata.drop_all()`` leaves ticket tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from . import _schema
from ._naming import STAMP_TABLE, ticket_table
from ._schema import TableSpec
from .columns import TicketId
from .dialects._connect import engine_of
from .errors import TicketsError
from .sources.default import configured_source, forget_embedded
from .sources.server import TicketServer

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["drop_ticket_tables", "reset_ticket_tables"]


def drop_ticket_tables(
    metadata: sa.MetaData,
    bind: Engine | Connection | AsyncEngine | AsyncConnection,
) -> list[str]:
    """Drop the ticket tables of ``metadata``'s ``TicketId`` columns, so that their sequences
    start again at 1; returns the names of the tables dropped.

    For test suites on the embedded default: ``metadata.drop_all(engine)`` drops the
    application's tables but not the ticket tables kept beside them (in the same database;
    SQLite: the sibling ``-tickets`` file), so ids would go on where the previous test left off.
    This closes the embedded default of ``bind``'s engine (ids in hand are dropped with the
    tables) and drops the tables, their rows in the stamp table (``tickets_stamps``) and, once
    no table of the library is left in that database, the stamp table itself; the next flush
    makes them again.

    Raises :class:`TicketsError`, before dropping anything, if a column draws from another
    source (``TicketId(source=...)`` or :func:`configure`): that source's tables and the ids it
    holds are the application's to reset (``op.drop_ticket_table``, a fresh database, and a
    new source).
    """
    engine = _engine(bind, "drop_ticket_tables")
    wanted = _embedded_sequences(metadata, "drop_ticket_tables")
    forget_embedded(engine)
    if not wanted:
        return []
    server = TicketServer(engine, embedded=True)
    backend = server.backend
    tables = [ticket_table(sequence, bits, server.table_template)
              for sequence, bits in sorted(wanted, key=lambda key: (key[0] or "", key[1]))]
    try:
        with server.own.connect() as conn:
            stamps = STAMP_TABLE in backend.existing_tables(conn, [STAMP_TABLE])
            specs = [TableSpec(table) for table in tables]
            for statement in _schema.drop_statements(backend, specs, stamps=False):
                conn.execute(statement)
            if stamps:
                # Their rows forgotten, and the stamp table dropped if no other table of the
                # library uses it: nothing of the library is left behind (in one transaction,
                # so that on SQLite the look and the drop are one step).
                with backend.transaction(conn, server.timeout):
                    for statement in _schema.forget_statements(
                        backend, [table.name for table in tables]
                    ):
                        conn.execute(statement)
                    backend.drop_unused_stamps(conn)
    finally:
        server.close()
    return [table.name for table in tables]


def reset_ticket_tables(
    metadata: sa.MetaData,
    bind: Engine | Connection | AsyncEngine | AsyncConnection,
) -> list[str]:
    """Start the sequences of ``metadata``'s ``TicketId`` columns again at 1, keeping their
    tables; returns the names of the ticket tables reset.

    The cheaper reset between the tests of a suite that keeps one database for the run: where
    :func:`drop_ticket_tables` drops the tables (and the next test's first flush makes them
    again), this sets each table's row back and forgets what the stamp table recorded of it
    (a sequence started again on purpose is a new one, not a rewind), in one transaction. It
    closes the embedded default of ``bind``'s engine first (ids in hand are dropped). Tables
    not made yet are left for the first flush to make; a Flickr table whose ids come from the
    server's auto-increment (``TicketId()`` on MySQL/MariaDB) is dropped, to be made again.

    Raises :class:`TicketsError`, before anything is changed, if a column draws from another
    source (see :func:`drop_ticket_tables`).
    """
    engine = _engine(bind, "reset_ticket_tables")
    wanted = _embedded_sequences(metadata, "reset_ticket_tables")
    forget_embedded(engine)
    if not wanted:
        return []
    server = TicketServer(engine, embedded=True)
    backend = server.backend
    specs = [TableSpec(ticket_table(sequence, bits, server.table_template))
             for sequence, bits in sorted(wanted, key=lambda key: (key[0] or "", key[1]))]
    try:
        with server.own.connect() as conn:
            found = backend.existing_tables(conn, [STAMP_TABLE, *(s.table.name for s in specs)])
            present = [spec for spec in specs if spec.table.name in found]
            dropped = [spec for spec in present if _schema.seed_row(backend, spec) is None]
            for statement in _schema.drop_statements(backend, dropped, stamps=False):
                conn.execute(statement)
            with backend.transaction(conn, server.timeout):
                for spec in present:
                    row = _schema.seed_row(backend, spec)
                    if row is not None:
                        table = _schema.ticket_table(backend, spec)
                        conn.execute(sa.update(table).values(id=row["id"]))
                if STAMP_TABLE in found:
                    names = [spec.table.name for spec in present]
                    kept = [spec.table.name for spec in present if spec not in dropped]
                    for statement in (_schema.forget_statements(backend, names)
                                      + _schema.register_statements(backend, kept)):
                        conn.execute(statement)
    finally:
        server.close()
    return [spec.table.name for spec in present]


def _embedded_sequences(metadata: sa.MetaData, caller: str) -> set[tuple[str | None, int]]:
    """The (sequence, bits) of ``metadata``'s ``TicketId`` columns; a :class:`TicketsError` if
    one draws from a source other than the embedded default."""
    wanted: set[tuple[str | None, int]] = set()
    for table in metadata.sorted_tables:
        for column in table.columns:
            kind = column.type
            if not isinstance(kind, TicketId):
                continue
            source = kind.source if kind.source is not None else configured_source()
            if source is not None:
                raise TicketsError(
                    f"{table.name}.{column.name} draws from {source!r}, not the embedded "
                    f"default: {caller}() resets only the embedded default; drop that "
                    "source's tables with op.drop_ticket_table() or use a fresh database"
                )
            wanted.add((kind.sequence, kind.bits))
    return wanted


def _engine(bind: object, caller: str) -> Engine:
    engine = engine_of(bind)
    if engine is None and isinstance(bind, Connection):
        engine = bind.engine
    if engine is None:
        inner = getattr(bind, "sync_connection", None)  # an AsyncConnection
        if isinstance(inner, Connection):
            engine = inner.engine
    if engine is None:
        raise TicketsError(
            f"{caller}() needs the application's Engine or Connection, not {bind!r}"
        )
    return engine
