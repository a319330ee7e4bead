"""Dropping a test's many ticket tables one statement each, before its database goes.

Dropping a MariaDB database with hundreds of InnoDB tables at once (a file each) can outlast the
fixture's read timeout on a busy machine; one DROP TABLE per statement never does.
"""

from __future__ import annotations

import sqlalchemy as sa


def drop_ticket_tables_one_by_one(url: str) -> None:
    """Drop every ticket table (``tickets__*``, Flickr's) of the database at ``url``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            names = [
                name for name in sa.inspect(conn).get_table_names()
                if name.lower().startswith("tickets")
            ]
            quote = conn.dialect.identifier_preparer.quote
            for name in names:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(name)}")
                conn.commit()
    finally:
        engine.dispose()


def ticket_tables(url: str) -> set[str]:
    """The ticket tables of the database at ``url`` (lower case)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()
    return {name.lower() for name in names if name.lower().startswith("tickets__")}
