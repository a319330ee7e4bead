"""SQLite: ``UPDATE … RETURNING`` (SQLite >= 3.35) on a one-row table, in autocommit.

The embedded default keeps an application file's tickets in a sibling file (``app.db`` →
``app.db-tickets``): a second connection cannot write to a file whose write lock the caller's
transaction holds, so tickets taken mid-transaction must live elsewhere.
"""

from __future__ import annotations

import os.path
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.pool import StaticPool

from .._naming import TicketTable
from ..errors import TicketsError
from ._registry import register_backend
from .base import MANY, ConnectParams, Identity, ReturningBackend

EMBEDDED_SUFFIX = "-tickets"


class _OneThreadAtATime(StaticPool):
    """The one connection of an in-memory database, checked out by one thread at a time.

    The library's refill threads (one per sequence) would otherwise use it together: a
    statement of one failing invalidates, and closes, the connection under another's running
    statement, which crashes the sqlite3 module. A thread may check it out again while it
    holds it; every holder's round trip is bounded by its timeout.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turn = threading.Condition()
        self._holder: int | None = None
        self._depth = 0

    def _do_get(self) -> Any:
        me = threading.get_ident()
        with self._turn:
            while self._depth and self._holder != me:
                self._turn.wait()
            self._holder, self._depth = me, self._depth + 1
        try:
            return super()._do_get()
        except BaseException:
            self._release()
            raise

    def _do_return_conn(self, record: Any) -> None:
        super()._do_return_conn(record)
        self._release()

    def _release(self) -> None:
        with self._turn:
            self._depth -= 1
            if not self._depth:
                self._holder = None
                self._turn.notify()


def _is_memory(url: URL) -> bool:
    """Whether ``url`` names an in-memory database (plain, or a ``mode=memory`` URI, shared or
    not): each connection to it may see another database, so it needs a single connection."""
    database = url.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or url.query.get("mode") == "memory"
    )


@register_backend("sqlite")
class SQLiteBackend(ReturningBackend):
    sync_drivers = ("pysqlite", "pysqlcipher")
    queue_local_writers = True

    def check_timeouts(self, dialect: Dialect) -> None:
        pass  # every driver takes the busy timeout, and a file has no network to hang

    def connect_with_timeout(
        self, dialect: Dialect, cargs: Any, cparams: dict[str, Any], seconds: float
    ) -> Any:
        cparams.setdefault("timeout", seconds)  # the busy timeout: a file has no network
        return None

    def async_connect_timeout(
        self, dialect: Dialect, cparams: dict[str, Any], seconds: float
    ) -> Callable[..., Awaitable[Any]] | None:
        cparams.setdefault("timeout", seconds)  # aiosqlite hands it to sqlite3.connect
        return None

    def own_connect_params(self, driver: str, timeout: float) -> ConnectParams:
        # The busy timeout (a file has no network); the library's kept connections move
        # between threads, one at a time. Forced: SQLAlchemy itself asks for the thread check
        # on in-memory URLs, and a connection refused in another thread is replaced by a new,
        # empty in-memory database.
        return ConnectParams({}, {"check_same_thread": False, "timeout": timeout})

    def own_engine_options(self, url: URL) -> dict[str, Any]:
        if sqlite3.sqlite_version_info < (3, 35):
            raise TicketsError(
                f"SQLite {sqlite3.sqlite_version} has no RETURNING; ticket tables need SQLite 3.35+"
            )
        if _is_memory(url):
            # One shared connection, or every checkout would see a different empty database.
            return {"poolclass": _OneThreadAtATime}
        return {}

    def embedded_url(self, app_url: URL) -> URL:
        if _is_memory(app_url):
            database = app_url.database or ""
            if database.startswith("file:") and not database.startswith("file::memory:"):
                # A named in-memory database (``file:name?mode=memory&cache=shared``): the
                # tickets get a sibling, named likewise, with the same query.
                return app_url.set(database=f"{database}{EMBEDDED_SUFFIX}")
            # Its query (``uri=true``...) would make ":memory:" the name of a file on disk.
            return app_url.set(database=":memory:", query={})
        return app_url.set(database=f"{app_url.database}{EMBEDDED_SUFFIX}")

    def embedded_attach(
        self, alias: str
    ) -> tuple[list[sa.sql.Executable], list[sa.sql.Executable]] | None:
        # The sibling of the file the connection has open, named as embedded_url names it,
        # found by the database as the statement runs: the same online and in a --sql
        # script, whatever path it is run with. An in-memory database's embedded default is
        # another in-memory database, out of any migration's reach: a throwaway one stands in.
        quoted = sqlite_dialect().identifier_preparer.quote(alias)
        sibling = (
            "(SELECT CASE WHEN file = '' THEN ':memory:' "
            f"ELSE file || '{EMBEDDED_SUFFIX}' END FROM pragma_database_list WHERE name = 'main')"
        )
        return (
            [sa.text(f"ATTACH DATABASE {sibling} AS {quoted}")],
            [sa.text(f"DETACH DATABASE {quoted}")],
        )

    def is_attached(self, connection: sa.Connection, alias: str) -> bool:
        return alias in {row[1] for row in connection.exec_driver_sql("PRAGMA database_list")}

    def embedded_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str] | None:
        main = connection.exec_driver_sql(
            "SELECT file FROM pragma_database_list WHERE name = 'main'"
        ).scalar()
        sibling = Path(f"{main}{EMBEDDED_SUFFIX}") if main else None
        if sibling is None or not sibling.is_file():
            return set()  # not made yet (or an in-memory database's, out of reach)
        # Read-only: looking makes nothing.
        with closing(sqlite3.connect(f"{sibling.as_uri()}?mode=ro", uri=True)) as db:
            found = {str(name).lower() for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )}
        return {name for name in names if name.lower() in found}

    def seen_apart(self, app_url: URL) -> bool:
        return not _is_memory(app_url)

    def database_key(self, url: URL) -> Hashable:
        name = str(url.database or ":memory:")
        if _is_memory(url) or name.startswith("file:"):
            return name
        return os.path.realpath(name)

    def missing_database(self, url: URL) -> str | None:
        if _is_memory(url) or str(url.database).startswith("file:"):
            return None  # in memory, or a URI whose mode= decides
        path = Path(str(url.database))
        if path.is_file():
            return None
        return f"no SQLite database at {path.resolve()}" + (
            " (a directory)" if path.exists() else " (no such file)"
        )

    @contextmanager
    def creating(
        self, connection: sa.Connection, tables: Sequence[TicketTable], timeout: float
    ) -> Iterator[None]:
        # One write transaction: the tables and their rows appear together, and a concurrent
        # creator waits for the write lock (the busy timeout) instead of reading between.
        # The file's one lock covers every table.
        with self.transaction(connection, timeout):
            yield

    # The write lock is the whole file's: other writers wait while a batch is created.
    create_batch = 200

    def existing_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str]:
        # SQLite's table names ignore case (ASCII), whatever the case they were created in.
        found = {
            str(name).lower()
            for name in connection.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            ).scalars()
        }
        return {name for name in names if name.lower() in found}

    @contextmanager
    def transaction(self, connection: sa.Connection, timeout: float) -> Iterator[None]:
        # The write lock up front (the busy timeout bounds the wait): a deferred transaction
        # that reads, then writes, fails instead of waiting when another writer got in between.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            try:
                connection.exec_driver_sql("ROLLBACK")
            except Exception:  # no transaction left to roll back
                pass
            raise
        connection.exec_driver_sql("COMMIT")

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        return sa.insert(table).values(**row).prefix_with("OR IGNORE")

    def least(self, a: Any, b: Any) -> sa.ColumnElement[int]:
        # SQLite has no LEAST: its scalar min() of several arguments is the same.
        return sa.func.min(a, b, type_=sa.BigInteger)

    def identity(self, cursor: Any, dialect: Dialect, table: TicketTable) -> Identity | None:
        return self.identities(cursor, dialect, [table])[table]

    def identities(
        self, cursor: Any, dialect: Dialect, tables: Sequence[TicketTable]
    ) -> dict[TicketTable, Identity | None]:
        # A file replaced by a copy is another inode; a table rebuilt gets another root page.
        pages: dict[str, int] = {}
        for start in range(0, len(tables), MANY):
            names = [t.name for t in tables[start : start + MANY]]
            cursor.execute(
                "SELECT name, rootpage FROM sqlite_master WHERE type = 'table' AND name IN "
                f"({', '.join('?' * len(names))})", names,
            )
            pages.update(cursor.fetchall())
        if not pages:
            return dict.fromkeys(tables)
        cursor.execute("PRAGMA database_list")
        path = next((r[2] for r in cursor.fetchall() if r[1] == "main"), "")
        try:
            info = os.stat(path) if path else None
        except OSError:
            info = None
        lineage = f"file:{info.st_dev}:{info.st_ino}" if info is not None else "memory"
        return {
            t: None if t.name not in pages else Identity(lineage, "", f"rootpage:{pages[t.name]}")
            for t in tables
        }

    def is_moved(self, error: BaseException) -> bool:
        # SQLITE_READONLY_DBMOVED: the file was replaced (a restore) while this connection
        # kept the old one open.
        return isinstance(error, sqlite3.OperationalError) and "readonly database" in str(error)

    def is_retryable(self, error: BaseException) -> bool:
        # Another writer held the file past the busy timeout.
        return isinstance(error, sqlite3.OperationalError) and "locked" in str(error)

    def is_missing_table(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.OperationalError) and "no such table" in str(error)

    def is_denied(self, error: BaseException) -> bool:
        # A file (or directory) the process may read but not write.
        return isinstance(error, sqlite3.OperationalError) and "readonly" in str(error)
