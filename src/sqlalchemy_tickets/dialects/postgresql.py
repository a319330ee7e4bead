"""PostgreSQL: ``UPDATE … RETURNING`` on a one-row table, in autocommit.

The library's own connections use psycopg 3, else psycopg2, else asyncpg driven synchronously
(``_driven.py``). None of them has a client-side read timeout, so a server that accepts and never
answers is cut short by the watchdog of ``_connect.py``, which shuts down the connection's socket
(see ``socket_fd``). pg8000 is not used: its socket timeout surfaces as a bare ``TimeoutError``
rather than as the driver's connection error, and it keeps its socket to itself.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Dialect

from .._naming import TicketTable
from ._clock import db_now_ms
from ._connect import bounded_call
from ._registry import register_backend
from .base import (
    MANY,
    ConnectParams,
    Identity,
    ReturningBackend,
    TableInfo,
    advance,
    lock_key,
    transport_fd,
)

#: The first key of the advisory locks taken while a ticket table is created ("tick").
_LOCK_CLASS = 0x7469636B

_RETRYABLE_STATES = frozenset({"40001", "40P01", "57014", "57P01", "57P02", "57P03"})
#: Where the errors of the supported drivers are defined (SQLAlchemy's asyncpg adapter defines
#: its own DBAPI error classes).
_DRIVER_MODULES = ("psycopg", "psycopg2", "asyncpg", "sqlalchemy.dialects.postgresql.asyncpg")


_LOCK_ALL = sa.text(
    "SELECT pg_advisory_xact_lock(:cls, key) FROM unnest(CAST(:keys AS integer[])) AS key"
).bindparams(sa.bindparam("keys", type_=postgresql.ARRAY(sa.Integer)))

#: The tables (any relation: it takes the name) of the schemas on the search path. A query of
#: the catalog, not to_regclass(): that reads the session's catalog cache, which has not seen
#: a table committed while the session's transaction waited for a creation lock.
_EXISTING = sa.text(
    "SELECT c.relname FROM pg_catalog.pg_class AS c "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE c.relname = ANY(CAST(:names AS name[])) AND n.nspname = ANY(current_schemas(false))"
).bindparams(sa.bindparam("names", type_=postgresql.ARRAY(sa.Text)))


#: Updates of ticket tables sent in one statement (see ``PostgreSQLBackend._batched``).
BATCH = 64
#: A parameter of a pyformat statement, ``%(name)s``.
_PARAM = re.compile(r"%\((\w+)\)s")

#: The timeline this server writes on now: the first 8 hex digits of the current WAL file's
#: name. ``pg_control_checkpoint()`` lags behind a promotion until the next checkpoint.
_TIMELINE = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"

#: The replication settings a commit waits by, and the server's clock (ms): see
#: :func:`protects`.
_REPLICATION = (
    "current_setting('synchronous_standby_names'), current_setting('synchronous_commit'), "
    "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)"
)

#: A table's identity, readable by an unprivileged user: the cluster (a failover keeps it), the
#: timeline (a promotion moves it), the table's OID (a restore changes it), and what its
#: commits wait for.
_IDENTITY = sa.text(
    "SELECT (SELECT system_identifier FROM pg_control_system())::text, "
    f"{_TIMELINE}, to_regclass(quote_ident(:name))::oid::bigint, {_REPLICATION}"
)

#: :data:`_IDENTITY` of many tables in one statement (a row each; the cluster's columns are
#: read from the first).
_IDENTITIES = sa.text(
    "SELECT n, to_regclass(quote_ident(n))::oid::bigint, "
    "(SELECT system_identifier FROM pg_control_system())::text, "
    f"{_TIMELINE}, {_REPLICATION} FROM unnest(CAST(:names AS text[])) AS n"
).bindparams(sa.bindparam("names", type_=postgresql.ARRAY(sa.Text)))

#: ``synchronous_commit`` levels at which a commit returns only once the synchronous standbys
#: have its WAL (``remote_write``: written, not yet flushed: it survives the primary's death,
#: which is what a failover is).
_WAITING_LEVELS = frozenset({"on", "remote_apply", "remote_write"})

_SYNC_SPEC = re.compile(
    r"^\s*(?:(?P<method>FIRST|ANY)\s+)?(?P<num>\d+)\s*\((?P<names>.*)\)\s*$",
    re.IGNORECASE | re.DOTALL,
)


def protects(standby_names: str, commit_level: str) -> bool:
    """Whether every commit waits for every standby a failover may promote: the standbys of
    ``synchronous_standby_names``, all of them required (a single name; ``FIRST n``/``ANY n``
    of exactly ``n`` names), and a ``synchronous_commit`` level that waits. Not with ``*``
    (any standby, whichever: another may be promoted), a quorum (``ANY 1 (a, b)``: the one
    promoted may not have the last commits) or a priority list (``FIRST 1 (a, b)``)."""
    if commit_level not in _WAITING_LEVELS or not standby_names.strip():
        return False
    match = _SYNC_SPEC.match(standby_names)
    if match is not None:
        required, listed = int(match.group("num")), match.group("names")
    else:
        required, listed = 1, standby_names
    names = [name.strip() for name in listed.split(",")]
    # A quoted name may hold a comma: counted as two, the list only looks longer (safe side).
    return "*" not in names and all(names) and required >= len(names)


def _identity(
    sysid: str, timeline: str, oid: int, standby_names: str, level: str, clock: int
) -> Identity:
    synchronous = protects(standby_names, level)
    guard: tuple[Any, ...] = (int(oid), str(timeline))
    if synchronous:
        guard += (standby_names, level)
    return Identity(f"pg:{sysid}", f"timeline:{int(timeline, 16)}", f"oid:{oid}",
                    synchronous, guard=guard, clock=int(clock))


def _filled(sql: str, values: Any) -> str | None:
    """A pyformat statement with its parameters written in as literals: the library's own
    integers and short strings (psycopg parses a statement's parameters in Python, a cost per
    character of a statement sent once). ``None`` for a value that is neither, or a string
    that a server without ``standard_conforming_strings`` would read otherwise."""
    literals: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            literals[name] = str(int(value))
        elif isinstance(value, str) and "\\" not in value:
            literals[name] = "'" + value.replace("'", "''") + "'"
        else:
            return None
    return _PARAM.sub(lambda match: literals[match.group(1)], sql)


def _replication_unchanged() -> list[sa.ColumnElement[bool]]:
    """Conditions that the replication settings are still those of a synchronous identity."""
    setting = sa.func.current_setting
    return [
        setting("synchronous_standby_names") == sa.bindparam("guard_standbys", type_=sa.Text),
        setting("synchronous_commit") == sa.bindparam("guard_level", type_=sa.Text),
    ]


@register_backend("postgresql")
class PostgreSQLBackend(ReturningBackend):
    sync_drivers = ("psycopg", "psycopg2")
    drivable = frozenset({"asyncpg"})
    extra = "postgresql"
    driver_packages = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary"}
    timeout_drivers = (("psycopg", "psycopg2"), ("psycopg", "asyncpg"))
    # The take itself refuses a table whose OID or timeline changed: no extra round trip.
    identity_in_block = True
    identity_in_block_complete = True
    replicates_synchronously = True

    def identity(self, cursor: Any, dialect: Dialect, table: TicketTable) -> Identity | None:
        stmt = self.statement(
            dialect, table, "identity", lambda t: _IDENTITY.bindparams(name=t.name)
        )
        sysid, timeline, oid, *replication = stmt.execute(cursor).fetchone()
        if oid is None:
            return None
        return _identity(sysid, timeline, oid, *replication)

    def take_blocks(
        self,
        cursor: Any,
        dialect: Dialect,
        items: Sequence[tuple[TicketTable, int, TableInfo, Identity | None]],
    ) -> list[int | None]:
        plans = [self.take_plan(dialect, t, count, info, identity)
                 for t, count, info, identity in items]
        found = self._batched(cursor, dialect, [
            None if plan is None else (t, plan[0].sql, plan[0].params(**plan[1]))
            for (t, *_), plan in zip(items, plans, strict=True)
        ], count=False)
        return [None if last is None else int(last) for last in found]

    def give_back_blocks(
        self,
        cursor: Any,
        dialect: Dialect,
        items: Sequence[tuple[TicketTable, range, TableInfo]],
    ) -> list[bool]:
        statements: list[tuple[TicketTable, str, Any] | None] = []
        for table, ids, info in items:
            if table.flickr:
                statements.append(None)
                continue
            stmt = self.statement(dialect, table, "give_back", self.give_back_statement)
            statements.append((table, f"{stmt.sql} RETURNING 1", stmt.params(
                last=ids[-1], before=ids.start - ids.step,
                increment=info.increment, offset=info.offset)))
        return [moved == 1 for moved in self._batched(cursor, dialect, statements, count=True)]

    def _batched(
        self,
        cursor: Any,
        dialect: Dialect,
        statements: Sequence[tuple[TicketTable, str, Any] | None],
        *,
        count: bool,
    ) -> list[Any]:
        """Each ``(table, sql, values)`` — an ``UPDATE … RETURNING`` of the row of ``table`` —
        run in order, in the caller's transaction; for each, what it returned (``count``: how
        many rows; ``None``: no statement, or no row).

        A statement per table is a round trip each: a cache refilling or closing thousands of
        lanes would take seconds. Here up to :data:`BATCH` updates go in one statement, each in
        a ``WITH`` clause of its own. The clauses of one statement see the same snapshot: a
        table that comes twice (a lane's latest block given back, then the one before it)
        goes in the next statement, which sees the first change (same transaction)."""
        out: list[Any] = [None] * len(statements)
        pending = [(i, st) for i, st in enumerate(statements) if st is not None]
        while pending:
            part: list[tuple[int, str]] = []
            later: list[tuple[int, tuple[TicketTable, str, Any]]] = []
            tables: set[TicketTable] = set()
            for i, statement in pending:
                table, sql, values = statement
                if table in tables or len(part) == BATCH:
                    later.append((i, statement))
                    continue
                filled = _filled(sql, values) if dialect.paramstyle == "pyformat" else None
                if filled is None:  # alone, its parameters bound by the driver
                    cursor.execute(sql, values)
                    rows = cursor.fetchall()
                    out[i] = len(rows) if count else (rows[0][0] if rows else None)
                    continue
                tables.add(table)
                part.append((i, filled))
            if part:
                withs = ", ".join(f"g{n} AS ({sql})" for n, (_, sql) in enumerate(part))
                pick = "count(*)" if count else "*"
                picks = ", ".join(f"(SELECT {pick} FROM g{n})" for n in range(len(part)))
                cursor.execute(f"WITH {withs} SELECT {picks}")
                for (i, _), value in zip(part, cursor.fetchone(), strict=True):
                    out[i] = value
            pending = later
        return out

    def identities(
        self, cursor: Any, dialect: Dialect, tables: Sequence[TicketTable]
    ) -> dict[TicketTable, Identity | None]:
        if not tables:
            return {}
        found: dict[TicketTable, Identity | None] = {}
        stmt = self.once(dialect, "identities", lambda: _IDENTITIES)
        for start in range(0, len(tables), MANY):
            part = tables[start : start + MANY]
            rows = stmt.execute(cursor, names=[t.name for t in part]).fetchall()
            sysid, timeline, *replication = rows[0][2:]  # one server, one moment: the first's
            oids = {name: oid for name, oid, *_ in rows}
            for table in part:
                oid_of = oids.get(table.name)
                found[table] = None if oid_of is None else _identity(
                    sysid, timeline, oid_of, *replication)
        return found

    def identity_columns(self, name: str) -> list[sa.ColumnElement[Any]]:
        oid = sa.func.to_regclass(sa.func.quote_ident(sa.literal(name, sa.Text)))
        return [sa.cast(sa.cast(oid, postgresql.OID), sa.BigInteger), sa.literal_column(_TIMELINE)]

    def identity_guards(self, identity: Identity) -> dict[str, Any]:
        oid, timeline, *replication = identity.guard
        guards = {"guard_table": oid, "guard_timeline": timeline}
        if replication:
            guards["guard_standbys"], guards["guard_level"] = replication
        return guards

    def guarded_take(self, identity: Identity) -> tuple[str, Callable[[sa.Table], Any]]:
        # A synchronous identity's take also refuses once the replication settings moved:
        # its ids must not go out before the process has looked (``IdentityGuard``).
        if len(identity.guard) > 2:
            return "take_guarded_sync", self._synchronous_advance_statement
        return "take_guarded", self.guarded_advance_statement

    def guarded_advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        return (
            advance(t, t.c.id + sa.bindparam("step", type_=sa.BigInteger))
            .where(
                sa.cast(sa.literal_column("tableoid"), sa.BigInteger)
                == sa.bindparam("guard_table", type_=sa.BigInteger),
                sa.literal_column(_TIMELINE) == sa.bindparam("guard_timeline", type_=sa.Text),
            )
            .returning(t.c.id)
        )

    def _synchronous_advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        stmt = self.guarded_advance_statement(t)
        assert isinstance(stmt, sa.Update)
        return stmt.where(*_replication_unchanged())

    def renew_leases(self, connection: sa.Connection, live: Identity, lease_ms: int) -> None:
        if len(live.guard) <= 2:
            return
        t = self.stamp_table()
        # Negative: see base._recorded. Only leases a third through (the statement stays
        # cheap however many processes renew), and never back.
        held = sa.func.coalesce(t.c.last_id, 0)
        connection.execute(
            sa.update(t)
            .where(
                t.c.synchronous == 1,
                t.c.stamp.startswith(live.prefix, autoescape=True),
                held > -(db_now_ms() + lease_ms * 2 // 3),
                *_replication_unchanged(),
            )
            .values(last_id=sa.func.least(held, -(db_now_ms() + lease_ms))),
            {"guard_standbys": live.guard[2], "guard_level": live.guard[3]},
        )

    def connect_with_timeout(
        self, dialect: Dialect, cargs: Any, cparams: dict[str, Any], seconds: float
    ) -> Any:
        self.check_timeouts(dialect)
        cparams.setdefault("connect_timeout", _connect_timeout(seconds))
        if dialect.driver == "psycopg":
            cparams.setdefault("cursor_factory", _timed_classes()[1])
            conn = _timed_classes()[0].connect(*cargs, **cparams)
        else:
            import psycopg2.extensions

            # Subclasses of the application's own factories, if it gave any: theirs still
            # apply, and every call is bounded all the same.
            connection_class, cursor_class = _timed_psycopg2_classes(
                cparams.pop("connection_factory", None) or psycopg2.extensions.connection,
                cparams.pop("cursor_factory", None) or psycopg2.extensions.cursor,
            )
            conn = dialect.loaded_dbapi.connect(
                *cargs, connection_factory=connection_class, cursor_factory=cursor_class,
                **cparams,
            )
        conn.tickets_timeout = seconds
        return conn

    def own_connect_params(self, driver: str, timeout: float) -> ConnectParams:
        if driver == "asyncpg":
            return ConnectParams({
                "server_settings": {"application_name": "sqlalchemy-tickets"},
                # Behind PgBouncer a statement prepared by name may be gone, or be another
                # client's, by the next transaction: nothing cached, names never reused (as
                # SQLAlchemy's asyncpg notes advise).
                "prepared_statement_cache_size": 0,
                "statement_cache_size": 0,
                "prepared_statement_name_func": _statement_name,
            })
        defaults: dict[str, Any] = {"application_name": "sqlalchemy-tickets"}
        if driver == "psycopg":
            # psycopg prepares a statement server-side after 5 executions; behind PgBouncer
            # in transaction or statement pooling the next execution may reach another server
            # connection ("prepared statement "_pg3_0" does not exist").
            defaults["prepare_threshold"] = None
        forced: dict[str, Any] = {}
        if driver in ("psycopg", "psycopg2"):
            forced["connect_timeout"] = _connect_timeout(timeout)
        return ConnectParams(defaults, forced)

    def own_engine_options(self, url: URL) -> dict[str, Any]:
        if url.get_driver_name() in ("psycopg", "psycopg2"):
            # The dialect looks HSTORE up on first connect, inside a transaction block, which
            # PgBouncer refuses in statement pooling; ticket tables have no HSTORE.
            return {"use_native_hstore": False}
        return {}

    def settle_own_connection(self, dbapi_connection: Any) -> None:
        if hasattr(dbapi_connection, "prepare_threshold"):
            dbapi_connection.prepare_threshold = None

    def socket_fd(self, dbapi_connection: Any) -> int | None:
        # SQLAlchemy's asyncio adapters hold the driver's connection as driver_connection.
        conn = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        fileno = getattr(conn, "fileno", None)  # psycopg (sync and async), psycopg2
        if fileno is not None:
            return int(fileno())
        # asyncpg keeps no public handle on its socket; its asyncio transport has one.
        return transport_fd(getattr(conn, "_transport", None))

    def async_connect_timeout(
        self, dialect: Dialect, cparams: dict[str, Any], seconds: float
    ) -> Callable[..., Awaitable[Any]] | None:
        if dialect.driver == "psycopg":
            import psycopg

            cparams.setdefault("connect_timeout", _connect_timeout(seconds))
            return psycopg.AsyncConnection.connect
        if dialect.driver == "asyncpg":
            asyncpg = importlib.import_module("asyncpg")  # untyped: no stubs to check against
            cparams.setdefault("timeout", seconds)
            return cast("Callable[..., Awaitable[Any]]", asyncpg.connect)
        return super().async_connect_timeout(dialect, cparams, seconds)

    @contextmanager
    def creating(
        self, connection: sa.Connection, tables: Sequence[TicketTable], timeout: float
    ) -> Iterator[None]:
        # DDL is transactional here: the tables and their rows appear together at COMMIT, and
        # the advisory locks make a concurrent creator wait instead of failing on the
        # catalog (`type "tickets__…" already exists`). One round trip takes them all, in
        # the order of their keys (unnest reads an array in order).
        with self.transaction(connection, timeout):
            keys = sorted({lock_key(table) for table in tables})
            connection.execute(_LOCK_ALL, {"cls": _LOCK_CLASS, "keys": keys})
            yield

    # Each table a transaction creates holds six slots of the shared lock table until COMMIT
    # (the table and its index, their catalog objects, the index build, the seed's insert),
    # beside its advisory lock; the lock table has max_locks_per_transaction (64) x
    # max_connections (100) slots by default, about a thousand tables' worth.
    create_batch = 100

    def existing_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str]:
        # Where the library's statements find a table: on the search path.
        return {str(name) for name in connection.execute(_EXISTING, {"names": list(names)})
                .scalars()}

    @contextmanager
    def transaction(self, connection: sa.Connection, timeout: float) -> Iterator[None]:
        with super().transaction(connection, timeout):
            # A row lock held past the timeout is an error here, not a wait for the watchdog.
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(timeout * 1000))}")
            yield

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        return postgresql.insert(table).values(**row).on_conflict_do_nothing()

    def keys_in(
        self, columns: Sequence[sa.Column[Any]], keys: Sequence[tuple[Any, ...]]
    ) -> sa.ColumnElement[bool]:
        # A row value IN a list is planned as one OR arm per key (13 ms for 200 keys, beside
        # a millisecond to run); IN the rows of unnested arrays is planned as one join.
        found = _unnested(columns, [list(values) for values in zip(*keys, strict=True)])
        return sa.tuple_(*columns).in_(sa.select(*found.c))

    def update_rows(
        self, connection: sa.Connection, table: sa.Table, keys: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        if not rows:
            return
        names = list(rows[0])
        new = _unnested([table.c[n] for n in names], [[row[n] for row in rows] for n in names])
        connection.execute(
            sa.update(table)
            .where(*(table.c[k] == new.c[k] for k in keys))
            .values({n: new.c[n] for n in names if n not in keys})
        )

    def delete_rows(
        self, connection: sa.Connection, table: sa.Table, keys: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        if rows:
            connection.execute(sa.delete(table).where(
                self.keys_in([table.c[k] for k in keys], rows)))

    def drop_if_empty_statements(self, table: sa.Table) -> list[sa.sql.Executable] | None:
        # One DO block: the same online and in --sql scripts. Where the table looks empty it
        # is locked first (a writer registering a table right then commits before, or waits
        # and finds no table), and dropped only if still empty: the lock is taken only on the
        # way to the drop, so a migration that leaves rows does not hold readers up.
        dialect = URL.create("postgresql").get_dialect()()  # its driver is not imported
        name = dialect.identifier_preparer.format_table(table)
        empty = f"NOT EXISTS (SELECT 1 FROM {name})"
        drop = str(sa.schema.DropTable(table).compile(dialect=dialect)).strip()
        # One line: scripts are often split at a semicolon that ends a line.
        return [sa.text(
            f"DO $tickets$ BEGIN IF {empty} THEN LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE; "
            f"IF {empty} THEN {drop}; END IF; END IF; END $tickets$"
        )]

    def is_retryable(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if code is not None:
            # 40001 serialization failure, 40P01 deadlock, 57014 statement timeout,
            # 57P01-57P03 server shutting down / starting, 08xxx connection exceptions.
            return code in _RETRYABLE_STATES or code.startswith("08")
        # No SQLSTATE: the connection itself failed (closed, reset, cut by a timeout).
        return type(error).__name__ in ("OperationalError", "InterfaceError") and (
            type(error).__module__.startswith(_DRIVER_MODULES)
        )

    def is_dropped(self, error: BaseException) -> bool:
        if not type(error).__module__.startswith(_DRIVER_MODULES):
            return False
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        # 57P01: terminated by an administrator (pg_terminate_backend); without a SQLSTATE,
        # the socket closed under libpq (a pooler or proxy restarting).
        return code == "57P01" or (
            code is None and "server closed the connection unexpectedly" in str(error))

    def refuses_transactions(self, error: BaseException | None) -> bool:
        # PgBouncer in statement pooling answers BEGIN with a protocol violation and closes;
        # older psycopg releases report it as a lost connection, without the SQLSTATE.
        code = getattr(error, "sqlstate", None)
        return code in ("08P01", None) and "transaction blocks not allowed" in str(error)

    def is_missing_table(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        return code == "42P01"

    def created_concurrently(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        # IF NOT EXISTS looks before it creates: two sessions may both find nothing, and the
        # second then meets the first's table (42P07), its row type (42710) or a catalog key.
        return code in ("42P07", "42710", "23505")

    def is_denied(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        return code == "42501"  # insufficient_privilege


def _unnested(
    columns: Sequence[sa.Column[Any]], values: Sequence[list[Any]]
) -> sa.TableValuedAlias:
    """``unnest(array, …) AS anon(name, …)``: row i holds element i of each of ``values``,
    typed and named as ``columns``."""
    return sa.func.unnest(*(
        sa.cast(sa.bindparam(None, _array_literal(array), type_=sa.Text),
                postgresql.ARRAY(column.type))
        for column, array in zip(columns, values, strict=True)
    )).table_valued(*(column.name for column in columns)).render_derived()


def _array_literal(values: list[Any]) -> str:
    """``values`` as the text of a PostgreSQL array (``{1,2}``, ``{"a","b"}``), sent as one
    string parameter: the driver's array adapter handles each element in Python (a third of a
    thousand-row write's time)."""
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _connect_timeout(seconds: float) -> int:
    # libpq counts whole seconds and treats anything under 2 as 2.
    return max(2, math.ceil(seconds))


def _statement_name() -> str:
    return f"__tickets_{uuid.uuid4().hex}__"


@functools.cache
def _timed_psycopg2_classes(connection_base: type, cursor_base: type) -> tuple[Any, Any]:
    """psycopg2 connection and cursor classes (over the given ones) whose calls that wait for
    the server are bounded by the watchdog, as :func:`_timed_classes` for psycopg."""

    class TimedCursor(cursor_base):  # type: ignore[misc]
        def execute(self, query: Any, vars: Any = None) -> Any:
            conn: Any = self.connection
            run = super().execute
            return bounded_call(conn.fileno(), conn.tickets_timeout, lambda: run(query, vars))

        def executemany(self, query: Any, vars_list: Any) -> Any:
            conn: Any = self.connection
            run = super().executemany
            return bounded_call(
                conn.fileno(), conn.tickets_timeout, lambda: run(query, vars_list)
            )

        def callproc(self, procname: Any, parameters: Any = None) -> Any:
            conn: Any = self.connection
            run = super().callproc
            return bounded_call(
                conn.fileno(), conn.tickets_timeout, lambda: run(procname, parameters)
            )

    class TimedConnection(_BoundedCommits, connection_base):  # type: ignore[misc]
        pass

    return TimedConnection, TimedCursor


@functools.cache
def _timed_classes() -> tuple[Any, Any]:
    """psycopg connection and cursor classes whose every call that waits for the server
    (execute, executemany, commit, rollback) is bounded by the watchdog, for an application's
    engine (``apply_timeouts``). Built on first use: psycopg is imported only then."""
    import psycopg

    class TimedCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            conn: Any = self.connection
            run = super().execute
            return bounded_call(
                conn.fileno(), conn.tickets_timeout, lambda: run(query, params, **kw)
            )

        def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
            conn: Any = self.connection
            run = super().executemany
            bounded_call(conn.fileno(), conn.tickets_timeout, lambda: run(query, params_seq, **kw))

    class TimedConnection(_BoundedCommits, psycopg.Connection[Any]):
        pass

    return TimedConnection, TimedCursor


class _BoundedCommits:
    """COMMIT and ROLLBACK bounded by the watchdog: the part psycopg's and psycopg2's timed
    connection classes share (placed first among their bases)."""

    tickets_timeout: float = 0.0

    def commit(self) -> None:
        bounded_call(self.fileno(), self.tickets_timeout, super().commit)  # type: ignore[attr-defined, misc]

    def rollback(self) -> None:
        bounded_call(self.fileno(), self.tickets_timeout, super().rollback)  # type: ignore[attr-defined, misc]
