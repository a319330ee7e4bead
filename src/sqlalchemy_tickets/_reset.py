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
from .sources.default import configured_source, detach_embedded
from .sources.server import TicketServer

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["drop_ticket_tables"]


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
    engine = _engine(bind)
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
                    "default: drop_ticket_tables() resets only the embedded default; drop that "
                    "source's tables with op.drop_ticket_table() or use a fresh database"
                )
            wanted.add((kind.sequence, kind.bits))
    # Its connections are open already: the drop goes through them.
    server = detach_embedded(engine)
    if not wanted:
        if server is not None:
            server.close()
        return []
    if server is None:
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


def _engine(bind: object) -> Engine:
    engine = engine_of(bind)
    if engine is None and isinstance(bind, Connection):
        engine = bind.engine
    if engine is None:
        inner = getattr(bind, "sync_connection", None)  # an AsyncConnection
        if isinstance(inner, Connection):
            engine = inner.engine
    if engine is None:
        raise TicketsError(
            f"drop_ticket_tables() needs the application's Engine or Connection, not {bind!r}"
        )
    return engine
