"""The largest keys of application tables, read on the library's own connections.

The first flush of a table in a process tells the table's source its largest key
(``_assign.py``), so that a table moved from auto-increment, or a ticket database restored from an
older backup, never gets a key it already holds (CONTRACT §9). That read never goes through the
caller's connection or transaction (§1): under SERIALIZABLE it would add read dependencies
between concurrent inserters, behind a pooler it would hold a server connection for the
transaction, and the ids are on the objects before any SQL of the flush. It runs in autocommit
on a connection of the library's own to the application's database, made as the application
makes its own (:class:`~sqlalchemy_tickets.dialects._connect.OwnEngine`): the one pool the
library keeps on that database (``shared_engine``), which the embedded default shares.

It sees what is committed: rows of the caller's own open transaction are not there (their keys
came from the library, or were set by hand in that transaction), and a table the caller created
in its open transaction has no committed rows yet (0). An in-memory SQLite database is the one
case where another connection sees another database: :func:`largest_key` says so (``None``) and
the caller reads through the flushing connection, once the ids are on the objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from ..dialects import backend_for
from ..dialects._connect import OwnEngine, shared_engine

#: Seconds the read may take (one index lookup per column; the bound is for a database that
#: does not answer at all).
FLOOR_TIMEOUT = 5.0

def largest_key(app: Engine, columns: Sequence[sa.Column[Any]]) -> int | None:
    """The largest value of ``columns`` committed in ``app``'s database (0: no rows, or no such
    table yet); ``None``: another connection would not see that database (in-memory SQLite).

    Raises the library's ``DatabaseUnavailable`` when the database does not answer."""
    backend = backend_for(app.url.get_backend_name())
    if not backend.seen_apart(app.url):
        return None
    own = _reader(app)

    def read(conn: sa.Connection) -> int:
        floor = 0
        for column in columns:
            try:
                value = conn.execute(sa.select(sa.func.max(column))).scalar()
            except sa_exc.DBAPIError as error:
                if error.orig is not None and backend.is_missing_table(error.orig):
                    continue  # created in the caller's open transaction: nothing committed
                raise own.unavailable(error) from error
            if isinstance(value, int) and value > floor:
                floor = value
        return floor

    return own.run(read)


def _reader(app: Engine) -> OwnEngine:
    # The one engine of the library's own on the application's database: the embedded
    # default's, where its tables live beside the data (PostgreSQL, MySQL/MariaDB).
    return shared_engine(app, embedded=False, timeout=FLOOR_TIMEOUT, pool_size=1,
                         what="application database")
