"""The tests' look at the library's tables, and their ways of dropping them and of running
offline scripts.

Dropping a MariaDB database with hundreds of InnoDB tables at once (a file each) can outlast the
fixture's read timeout on a busy machine; one DROP TABLE per statement never does.
"""

from __future__ import annotations

import re

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


def tables_starting(url: str, prefix: str) -> set[str]:
    """The tables of the database at ``url`` whose names start with ``prefix`` (lower case)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()
    return {name.lower() for name in names if name.lower().startswith(prefix)}


def ticket_tables(url: str) -> set[str]:
    """The ticket tables of the database at ``url`` (lower case)."""
    return tables_starting(url, "tickets__")


def run_script(url: str, sql: str) -> None:
    """Run an offline (``--sql``) script the way a DBA would, statement by statement."""
    statements = [
        "\n".join(line for line in chunk.splitlines() if not line.startswith("--")).strip()
        for chunk in re.split(r";[ \t]*\n", sql)
    ]
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            for statement in filter(None, statements):
                cursor.execute(statement)
                if cursor.description is not None:
                    cursor.fetchall()
            dbapi.commit()
    finally:
        engine.dispose()
