"""The largest keys of application tables, read on the library's own connections.

The first flush of a table in a process checks the ids it drew against the keys the table holds
(``_assign.py``), and tells the source the table's largest key where one of them is there
already, so that a table moved from auto-increment, or a ticket database restored from an older
backup, never gets a key it already holds (CONTRACT §9). That read never goes through the
caller's connection or transaction (§1): under SERIALIZABLE it would add read dependencies
between concurrent inserters, behind a pooler it would hold a server connection for the
transaction, and the ids are on the objects before any SQL of the flush. It runs in autocommit
on a connection of the library's own to the application's database, made as the application
makes its own (:class:`~sqlalchemy_tickets.dialects._connect.OwnEngine`): the one pool the
library keeps on that database (``shared_engine``), which the embedded default shares.

It sees what is committed: rows of the caller's own open transaction are not there (their keys
came from the library, or were set by hand in that transaction), and a table the caller created
in its open transaction has no committed rows yet (0). An in-memory SQLite database is the one
case where another connection sees another database: :func:`keys_in_use` says so (``None``) and
the caller reads through the flushing connection (:func:`floor_of`), once the ids are on the
objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from ..dialects import backend_for
from ..dialects._connect import OwnEngine
from ..dialects._shared import shared_engine

#: Seconds the read may take (one index lookup per column; the bound is for a database that
#: does not answer at all).
FLOOR_TIMEOUT = 5.0

#: Ids looked for in one statement.
_IDS_PER_LOOK = 500


def keys_in_use(
    app: Engine, columns: Sequence[sa.Column[Any]], ids: Sequence[int]
) -> int | None:
    """``0`` when none of ``ids`` is a key the tables of ``columns`` already hold (committed),
    else their largest key (the floor their source must move above); ``None``: another
    connection would not see that database (in-memory SQLite).

    Only ids at or below the largest key are looked for, by the key itself: the servers of a
    pair drift apart and processes hand ids out in no order across each other (ids given back
    come out again), so ids below a table's largest key are a collision only where the table
    holds them (a table moved from auto-increment, a ticket database restored from an older
    backup). Raises the library's ``DatabaseUnavailable`` when the database does not answer."""
    backend = backend_for(app.url.get_backend_name())
    if not backend.seen_apart(app.url):
        return None
    own = _reader(app)
    return own.run(lambda conn: floor_of(conn, columns, ids, backend.is_missing_table))


def floor_of(
    conn: sa.Connection,
    columns: Sequence[sa.Column[Any]],
    ids: Sequence[int],
    is_missing_table: Callable[[BaseException], bool] | None = None,
) -> int:
    """:func:`keys_in_use` on ``conn`` (the flushing connection, for in-memory SQLite)."""
    floor = 0
    for column in columns:
        try:
            largest = conn.execute(sa.select(sa.func.max(column))).scalar()
        except sa_exc.DBAPIError as error:
            if is_missing_table is not None and error.orig is not None and is_missing_table(
                error.orig
            ):
                continue  # created in the caller's open transaction: nothing committed
            raise
        if not isinstance(largest, int):
            continue
        below = sorted({i for i in ids if isinstance(i, int) and i <= largest})
        for start in range(0, len(below), _IDS_PER_LOOK):
            look = sa.select(column).where(column.in_(below[start : start + _IDS_PER_LOOK]))
            if conn.execute(look.limit(1)).first() is not None:
                floor = max(floor, largest)
                break
    return floor


def _reader(app: Engine) -> OwnEngine:
    # The one engine of the library's own on the application's database: the embedded
    # default's, where its tables live beside the data (PostgreSQL, MySQL/MariaDB).
    return shared_engine(app, embedded=False, timeout=FLOOR_TIMEOUT, pool_size=1,
                         what="application database")
