"""MySQL and MariaDB: ``UPDATE … SET id = LAST_INSERT_ID(id + step)``, read from the OK packet's
insert id, so a block costs one round trip and no result set.

The library's own connections use PyMySQL, else mysqlclient, else MariaDB Connector/Python,
each with its own connect, read and write timeouts, else aiomysql or asyncmy driven
synchronously (``_driven.py``), whose round trips the watchdog bounds (see ``socket_fd``).

Flickr's ``Tickets64``/``Tickets32`` tables keep their published schema (unsigned auto-increment
``id``, unique ``stub``) and take their stride from the server's ``auto_increment_increment`` /
``auto_increment_offset``, as at Flickr, so legacy clients running ``REPLACE INTO Tickets64 (stub)
VALUES ('a')`` share the table: both InnoDB and MyISAM move the auto-increment counter when the
key is updated upward.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

from .._naming import TicketTable
from ..errors import StrideMismatchError, TicketServerUnavailable
from ._clock import db_now_ms
from ._registry import register_backend
from .base import (
    MANY,
    ConnectParams,
    Identity,
    TableInfo,
    TableSpec,
    TicketBackend,
    advance,
    run,
    transport_fd,
)

_NO_SUCH_TABLE = 1146
_NEEDS_PROCESS_PRIVILEGE = 1227
#: A deadlock, or a write that failed Galera's certification: rolled back whole.
_DEADLOCK = 1213
_CANNOT_CONNECT = 2003
#: 1205 lock wait timeout, 1213 deadlock, 1053 server shutdown, 1927 connection killed,
#: 2003 cannot connect, 2006 server has gone away, 2013 lost connection during query,
#: 4031 disconnected by the server for inactivity.
_RETRYABLE_CODES = frozenset({1205, 1213, 1053, 1927, 2003, 2006, 2013, 4031})
#: Where the errors of the drivers whose error codes are read are defined (aiomysql raises
#: PyMySQL's).
_DRIVER_MODULES = ("pymysql", "MySQLdb", "asyncmy", "mariadb")


def _error_code(error: BaseException) -> int | None:
    """The server's or client's error number: the first argument of PyMySQL's, mysqlclient's
    and asyncmy's errors, ``errno`` of MariaDB Connector/Python's."""
    errno = getattr(error, "errno", None)
    if isinstance(errno, int) and errno > 0:
        return errno
    args: tuple[Any, ...] = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _timeouts(driver: str, seconds: float) -> dict[str, Any]:
    """The connect arguments that bound a connection of ``driver`` (none: its round trips are
    bounded otherwise, or not at all)."""
    if driver == "pymysql":
        value: float = seconds
    elif driver in ("mysqldb", "mariadbconnector"):
        value = max(1, math.ceil(seconds))  # whole seconds in the C client
    else:
        return {}
    return {"connect_timeout": value, "read_timeout": value, "write_timeout": value}


@register_backend("mysql", "mariadb")
class MySQLBackend(TicketBackend):
    flickr_stride_from_server = True
    sync_drivers = ("pymysql", "mysqldb", "mariadbconnector")
    drivable = frozenset({"aiomysql", "asyncmy"})
    extra = "mysql"
    driver_packages = {"mysqldb": "mysqlclient", "mariadbconnector": "mariadb"}
    timeout_drivers = (("pymysql", "mysqldb"), ("aiomysql",))

    def __init__(self) -> None:
        super().__init__()
        # Dialects (one per engine) whose user may not read InnoDB's table ids.
        self._no_table_ids: weakref.WeakSet[Dialect] = weakref.WeakSet()

    def connect_with_timeout(
        self, dialect: Dialect, cargs: Any, cparams: dict[str, Any], seconds: float
    ) -> Any:
        self.check_timeouts(dialect)
        for key, value in _timeouts(dialect.driver, seconds).items():
            cparams.setdefault(key, value)
        return None

    def own_connect_params(self, driver: str, timeout: float) -> ConnectParams:
        return ConnectParams(forced=_timeouts(driver, timeout))

    def socket_fd(self, dbapi_connection: Any) -> int | None:
        # SQLAlchemy's asyncio adapters hold the driver's connection as driver_connection.
        conn = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        sock = getattr(conn, "_sock", None)  # PyMySQL
        if sock is not None:
            return int(sock.fileno())
        fileno = getattr(conn, "fileno", None)  # mysqlclient
        if fileno is not None:
            try:
                return int(fileno())
            except Exception:  # closed: the call fails by itself, nothing to watch
                return None
        # aiomysql keeps its asyncio stream writer, whose transport holds the socket; asyncmy
        # the transport itself.
        writer = getattr(conn, "_writer", None)
        transport = getattr(writer, "transport", None) or getattr(conn, "_transport", None)
        return transport_fd(transport)

    def async_connect_timeout(
        self, dialect: Dialect, cparams: dict[str, Any], seconds: float
    ) -> Callable[..., Awaitable[Any]] | None:
        if dialect.driver == "aiomysql":
            aiomysql = importlib.import_module("aiomysql")  # untyped: no stubs to check against
            # Only the TCP connect: the handshake is bounded by the caller.
            cparams.setdefault("connect_timeout", seconds)
            return cast("Callable[..., Awaitable[Any]]", aiomysql.connect)
        return super().async_connect_timeout(dialect, cparams, seconds)

    def connect_timeout_error(self, dbapi: Any, message: str) -> Exception:
        error: Exception = dbapi.OperationalError(_CANNOT_CONNECT, message)
        return error

    flickr_row_from_client = True

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        return sa.insert(table).values(**row).prefix_with("IGNORE")

    def drop_if_empty_statements(self, table: sa.Table) -> list[sa.sql.Executable] | None:
        # No conditional DDL outside stored programs: the statement to run (the DROP, or a
        # DO that does nothing) is chosen by the database in a session variable, then
        # prepared and run; the same online and in --sql scripts. DDL commits at once here,
        # so a writer registering a table between the look and the drop is not held off as
        # on PostgreSQL: it fails on the missing table, and makes it again.
        dialect = mysql.dialect()
        name = dialect.identifier_preparer.format_table(table)
        drop = str(sa.schema.DropTable(table, if_exists=True).compile(dialect=dialect)).strip()
        return [
            sa.text(
                f"SET {_DROP_VARIABLE} = IF(EXISTS (SELECT 1 FROM {name}), 'DO 0', :ddl)"
            ).bindparams(sa.bindparam("ddl", drop, type_=sa.String)),
            sa.text(f"PREPARE {_DROP_STATEMENT} FROM {_DROP_VARIABLE}"),
            sa.text(f"EXECUTE {_DROP_STATEMENT}"),
            sa.text(f"DEALLOCATE PREPARE {_DROP_STATEMENT}"),
        ]

    @contextmanager
    def creating(
        self, connection: sa.Connection, tables: Sequence[TicketTable], timeout: float
    ) -> Iterator[None]:
        # DDL commits at once here, so a table can be seen before its row: creators take a
        # named lock per table so that one creates and seeds while the others wait, and a
        # reader that finds the table without its row comes through here too (the seed is
        # idempotent). One lock at a time, in the order of their names, stopping at the
        # first that does not come: a session may hold several.
        by_lock = {_lock_name(table): table for table in tables}
        held: list[str] = []
        try:
            for name in sorted(by_lock):
                got = connection.execute(
                    sa.text("SELECT GET_LOCK(:name, :timeout)"),
                    {"name": name, "timeout": max(1, int(timeout))},
                ).scalar()
                if got != 1:
                    raise TicketServerUnavailable(
                        f"waited {timeout:g} s for another client creating "
                        f"{by_lock[name].name}; try again"
                    )
                held.append(name)
            yield
        finally:
            if held:
                try:
                    connection.execute(sa.select(*(sa.func.release_lock(n) for n in held)))
                except Exception:  # a dropped connection releases its locks itself
                    pass

    def existing_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str]:
        found = {
            str(name).lower()
            for name in connection.execute(_EXISTING, {"names": list(names)}).scalars()
        }
        # Compared without case, as the catalog compares them: with lower_case_table_names
        # the server keeps Tickets64 as tickets64.
        return {name for name in names if name.lower() in found}

    def tier_take(
        self,
        connection: sa.Connection,
        state: sa.Table,
        guards: Sequence[sa.ColumnElement[Any]],
        values: Mapping[str, Any],
    ) -> Any:
        # No UPDATE ... RETURNING: the UPDATE keeps the block in session variables, read by a
        # second statement. Only the first holds the row's lock; assignments run left to right
        # (``last_take`` first, then the rest with its new value), hence ordered_values.
        key = (state, tuple(guards))
        found = self._tier_take_statements.get(key)
        if found is None:
            c = state.c
            update = (
                sa.update(state)
                .where(*self.tier_take_where(state, guards))
                .ordered_values(
                    (c.last_take, _keep("taken", self.tier_taken(state))),
                    (c.head_first,
                     _keep("first", c.head_first) + c.last_take * _keep("step", c.head_step)),
                    (c.stock, c.stock - c.last_take),
                    (c.issued, c.issued + c.last_take),
                )
            )
            read = sa.select(
                *(_kept(name).label(name) for name in ("first", "taken", "step")),
                c.stock, c.rate, c.rate_at, c.exhausted, db_now_ms().label("now_ms"),
            ).where(
                c.sequence_name == sa.bindparam("k_name", type_=c.sequence_name.type),
                c.bits == sa.bindparam("k_bits", type_=sa.SmallInteger),
            )
            found = self._tier_take_statements[key] = (update, read)
        update, read = found
        if connection.execute(update, dict(values)).rowcount != 1:
            return None  # nothing assigned: the session's variables are an older take's
        # The row may have moved on since (another take): the block is the session's own
        # variables; the rest is what the stock looked like a moment later, which is enough
        # for deciding on a refill.
        which = {"k_name": values["k_name"], "k_bits": values["k_bits"]}
        return connection.execute(read, which).one()

    def tier_table_options(self) -> dict[str, Any]:
        # Row locks and atomic commits: a take and its state row move together.
        return {"mysql_engine": "InnoDB", "mariadb_engine": "InnoDB"}

    def stride_of(self, t: sa.Table) -> tuple[sa.ColumnElement[int], sa.ColumnElement[int]]:
        if "increment" in t.c:
            return t.c.increment, t.c.offset
        # Signed: the server variables are unsigned, and the arithmetic on them (offset - id)
        # goes below zero, which MySQL refuses for BIGINT UNSIGNED (error 1690).
        return (
            sa.cast(sa.literal_column("@@auto_increment_increment"), sa.Integer),
            sa.cast(sa.literal_column("@@auto_increment_offset"), sa.Integer),
        )

    def check_create(self, connection: sa.Connection, spec: TableSpec) -> None:
        if not spec.table.flickr or (spec.increment, spec.offset) == (1, 1):
            return
        increment, offset = connection.exec_driver_sql(
            "SELECT @@auto_increment_increment, @@auto_increment_offset"
        ).one()
        if (increment, offset) != (spec.increment, spec.offset):
            raise StrideMismatchError(
                f"this server has auto_increment_increment={increment}, "
                f"auto_increment_offset={offset}, but {spec.table.name} was asked for "
                f"increment={spec.increment}, offset={spec.offset}: Flickr tables take their "
                "stride from the server, so set those two server variables (my.cnf) first"
            )

    def advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        step = sa.bindparam("step", type_=sa.BigInteger)
        return advance(t, sa.func.last_insert_id(t.c.id + step))

    def advanced_id(self, cursor: Any) -> int | None:
        return int(cursor.lastrowid) if cursor.rowcount == 1 else None

    def describe(self, cursor: Any, dialect: Dialect, table: TicketTable) -> TableInfo | None:
        if table.flickr:
            stmt = self.statement(dialect, table, "describe", _flickr_describe)
            increment, offset, last_id = stmt.execute(cursor).fetchone()
            return TableInfo(int(increment), int(offset), None if last_id is None else int(last_id))
        stmt = self.statement(dialect, table, "describe", _named_describe)
        row = stmt.execute(cursor).fetchone()
        return None if row is None else TableInfo(int(row[1]), int(row[2]), int(row[0]))

    def start_flickr_row(self, cursor: Any, dialect: Dialect, table: TicketTable) -> int:
        stmt = self.statement(dialect, table, "replace", _replace_into)
        stmt.execute(cursor)
        return int(cursor.lastrowid)

    def identity(self, cursor: Any, dialect: Dialect, table: TicketTable) -> Identity | None:
        # MariaDB has no server_uuid: the server id tells a promoted replica from its primary,
        # the creation time (to the second) and the InnoDB table id (with the PROCESS
        # privilege) a restored table from the one dumped.
        row = None
        if dialect not in self._no_table_ids:
            stmt = self.statement(dialect, table, "identity_full", _identity_with_table_id)
            try:
                row = stmt.execute(cursor).fetchone()
            except Exception as error:
                if _error_code(error) != _NEEDS_PROCESS_PRIVILEGE:
                    raise
                self._no_table_ids.add(dialect)
        if row is None:
            row = (*self.statement(dialect, table, "identity", _identity).execute(cursor)
                   .fetchone(), None)
        cluster, server_id, created, table_id = row
        if created is None:
            return None
        return _identity_of(cluster, server_id, created, table_id)

    def identities(
        self, cursor: Any, dialect: Dialect, tables: Sequence[TicketTable]
    ) -> dict[TicketTable, Identity | None]:
        if not tables:
            return {}
        cluster, server_id, database = run(cursor, sa.text(_CLUSTER), dialect).fetchone()
        created: dict[str, Any] = {}
        table_ids: dict[str, Any] = {}
        for start in range(0, len(tables), MANY):
            names = [t.name for t in tables[start : start + MANY]]
            query = sa.text(
                "SELECT TABLE_NAME, CREATE_TIME FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
            ).bindparams(sa.bindparam("names", names, expanding=True))
            created.update((name.lower(), at) for name, at in run(cursor, query, dialect))
            if dialect in self._no_table_ids:
                continue
            query = sa.text(
                "SELECT NAME, TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
                "WHERE NAME IN :names"
            ).bindparams(sa.bindparam("names", [f"{database}/{n}" for n in names],
                                      expanding=True))
            try:
                rows = run(cursor, query, dialect).fetchall()
            except Exception as error:
                if _error_code(error) != _NEEDS_PROCESS_PRIVILEGE:
                    raise
                self._no_table_ids.add(dialect)
                continue
            table_ids.update((name.partition("/")[2].lower(), tid) for name, tid in rows)
        found: dict[TicketTable, Identity | None] = {}
        for table in tables:
            at = created.get(table.name.lower())
            tid = None if dialect in self._no_table_ids else table_ids.get(table.name.lower())
            found[table] = None if at is None else _identity_of(cluster, server_id, at, tid)
        return found

    # The take refuses a table whose server or creation time changed (a promoted replica, a
    # restore while connections stay open): an information_schema read in the UPDATE itself,
    # not a round trip. The InnoDB table id (same-second restores) is read on first contact,
    # on each new connection and at identity_interval.
    identity_in_block = True

    def identity_guards(self, identity: Identity) -> dict[str, Any]:
        server_id, table = identity.guard
        return {"guard_server": server_id, "guard_table": table}

    def guarded_take(self, identity: Identity) -> tuple[str, Callable[[sa.Table], Any]]:
        if isinstance(identity.guard[1], int):
            return "take_guarded", self.guarded_advance_statement
        # No InnoDB table id (no PROCESS privilege): guarded by the creation time.
        return "take_guarded_created", _take_guarded_by_created

    def guarded_advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        table_id = sa.text(
            "SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
            "WHERE NAME = CONCAT(DATABASE(), '/', :guarded_name)"
        ).bindparams(guarded_name=t.name).columns(TABLE_ID=sa.BigInteger).scalar_subquery()
        return _guarded(t, table_id, sa.BigInteger)

    def identity_columns(self, name: str) -> list[sa.ColumnElement[Any]]:
        created = sa.text(
            "SELECT CREATE_TIME FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :guarded_name"
        ).bindparams(guarded_name=name).columns(CREATE_TIME=sa.DateTime).scalar_subquery()
        return [sa.literal_column("@@server_id"), created]

    def is_retryable(self, error: BaseException) -> bool:
        if not type(error).__module__.startswith(_DRIVER_MODULES):
            return False
        return _error_code(error) in _RETRYABLE_CODES

    def is_missing_table(self, error: BaseException) -> bool:
        return _error_code(error) == _NO_SUCH_TABLE

    def is_dropped(self, error: BaseException) -> bool:
        # 2013 lost connection, 2006 gone away, 1927 killed (MariaDB), 4031 idle timeout.
        return type(error).__module__.startswith(_DRIVER_MODULES) and _error_code(
            error) in (2006, 2013, 1927, 4031)

    def is_denied(self, error: BaseException) -> bool:
        # 1044: no access to the database; 1142: command denied on a table (CREATE, say).
        return _error_code(error) in (1044, 1142)

    may_be_clustered = True

    def cluster(self, cursor: Any) -> str | None:
        # A status variable, not a system one: MySQL (no wsrep) answers with no row.
        cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep_cluster_state_uuid'")
        row = cursor.fetchone()
        return str(row[1]) if row is not None and row[1] else None

    def is_conflict(self, error: BaseException) -> bool:
        return _error_code(error) == _DEADLOCK


#: The session variable and prepared statement of ``drop_if_empty_statements``.
_DROP_VARIABLE = "@tickets_drop_if_empty"
_DROP_STATEMENT = "tickets_drop_if_empty"


def _keep(name: str, value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``(@tickets_<name> := value)``: a value kept in a session variable by the statement
    computing it."""
    return _kept(name).op(":=")(value).self_group()


def _kept(name: str) -> sa.ColumnElement[Any]:
    return sa.literal_column(f"@tickets_{name}", sa.BigInteger)


#: Only the names: the server reads them from the data dictionary without opening the tables.
_EXISTING = sa.text(
    "SELECT TABLE_NAME FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :names"
).bindparams(sa.bindparam("names", expanding=True))


def _lock_name(table: TicketTable) -> str:
    """The named lock of a ticket table (MySQL caps lock names at 64 characters)."""
    digest = hashlib.sha1(table.name.encode()).hexdigest()[:16]
    return f"sqlalchemy_tickets.{digest}"


def _replace_into(t: sa.Table) -> sa.sql.Executable:
    # Core has no REPLACE; the table name still goes through the dialect's quoting.
    quoted = mysql.dialect().identifier_preparer.format_table(t)
    return sa.text(f"REPLACE INTO {quoted} (stub) VALUES ('a')")


def _flickr_describe(t: sa.Table) -> sa.sql.Executable:
    last = sa.select(t.c.id).where(t.c.stub == "a").scalar_subquery()
    return sa.select(
        sa.literal_column("@@auto_increment_increment"),
        sa.literal_column("@@auto_increment_offset"),
        last,
    )


_IDENTITY = (
    "SELECT (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
    "WHERE VARIABLE_NAME = 'WSREP_CLUSTER_STATE_UUID'), @@server_id, "
    "(SELECT CREATE_TIME FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :name)"
)


#: What every table's identity on one server shares, and the database name.
_CLUSTER = (
    "SELECT (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
    "WHERE VARIABLE_NAME = 'WSREP_CLUSTER_STATE_UUID'), @@server_id, DATABASE()"
)


def _identity_of(cluster: Any, server_id: Any, created: Any, table_id: Any) -> Identity:
    if cluster:
        # A Galera node: every node replays DDL at its own time, and a node that rejoins by a
        # state transfer makes its tables anew; only the cluster's history is one.
        return Identity(f"galera:{cluster}", "", "")
    suffix = "" if table_id is None else f":table_id:{table_id}"
    # The take checks the InnoDB table id where it may be read (exact), else the creation time
    # (to the second; the interval's full check covers a restore within it).
    guard = (server_id, table_id) if table_id is not None else (server_id, created)
    return Identity("mysql", f"server_id:{server_id}", f"created:{created}{suffix}",
                    guard=guard)


def _identity(t: sa.Table) -> sa.sql.Executable:
    return sa.text(_IDENTITY).bindparams(name=t.name)


def _identity_with_table_id(t: sa.Table) -> sa.sql.Executable:
    return sa.text(
        f"{_IDENTITY}, (SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
        "WHERE NAME = CONCAT(DATABASE(), '/', :name))"
    ).bindparams(name=t.name)


def _guarded(
    t: sa.Table, table: sa.ColumnElement[Any], type_: Any
) -> sa.sql.Executable:
    return advance(
        t, sa.func.last_insert_id(t.c.id + sa.bindparam("step", type_=sa.BigInteger))
    ).where(
        sa.literal_column("@@server_id") == sa.bindparam("guard_server", type_=sa.Integer),
        table == sa.bindparam("guard_table", type_=type_),
    )


def _take_guarded_by_created(t: sa.Table) -> sa.sql.Executable:
    created = sa.text(
        "SELECT CREATE_TIME FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :guarded_name"
    ).bindparams(guarded_name=t.name).columns(CREATE_TIME=sa.DateTime).scalar_subquery()
    return _guarded(t, created, sa.DateTime)


def _named_describe(t: sa.Table) -> sa.sql.Executable:
    return sa.select(t.c.id, t.c.increment, t.c.offset).where(t.c.stub == "a")
