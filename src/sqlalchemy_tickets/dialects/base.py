"""What every backend provides: its SQL, built with SQLAlchemy Core (so identifiers are quoted by
the dialect's own rules) and compiled once per table into a :class:`RawStatement`, which ticket
sources run straight on a DBAPI cursor: a ticket round trip is on every insert's path. The
registry (``_registry``) picks a backend by dialect name; shared code never tests
``dialect.name`` itself.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from .. import _schema
from .._naming import TicketTable, TierTables
from .._schema import TableSpec as TableSpec  # re-exported: its home before the schema module
from ._clock import db_now_ms
from ._core import BackendConnections
from ._core import driver_installed as driver_installed
from ._core import transport_fd as transport_fd
from ._types import _INDEX, _STAND_IN
from ._types import MANY as MANY
from ._types import ConnectParams as ConnectParams
from ._types import Identity as Identity
from ._types import RawStatement as RawStatement
from ._types import TableInfo as TableInfo
from ._types import run as run


class TicketBackend(BackendConnections):
    """The SQL and driver knowledge of one backend. Subclasses live in this package, one per module.

    Statements compiled for a table are cached on the backend per (dialect, table); the caches are
    filled under a lock and only read afterwards.
    """

    #: Flickr tables can only carry a stride other than 1/1 where the server supplies it.
    flickr_stride_from_server: ClassVar[bool] = False

    #: Whether a process should queue its own write transactions on one database itself: a
    #: database whose writers wait for each other by sleeping and polling (SQLite's busy
    #: handler) lets busy threads starve a writer past its timeout.
    queue_local_writers: ClassVar[bool] = False


    def table(self, spec: TableSpec, metadata: sa.MetaData | None = None) -> sa.Table:
        """The Core ``Table`` of a ticket table (its DDL is what ``create`` emits)."""
        return _schema.ticket_table(self, spec, metadata)

    def flickr_table(self, spec: TableSpec, metadata: sa.MetaData) -> sa.Table:
        return _schema.flickr_table(self, spec, metadata)

    #: Whether Flickr's table starts without its row, made by the first client's
    #: :meth:`start_flickr_row` (MySQL/MariaDB: as a legacy client's ``REPLACE INTO``).
    flickr_row_from_client: ClassVar[bool] = False

    def start_flickr_row(self, cursor: Any, dialect: Dialect, table: TicketTable) -> int:
        """Create Flickr's one row the way a legacy client does; returns the id that issued."""
        raise NotImplementedError

    def seed_row(self, spec: TableSpec) -> dict[str, Any] | None:
        """The row a new ticket table starts with (``id`` = the id before the first one)."""
        return _schema.seed_row(self, spec)

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        """An INSERT of the seed row that does nothing when the row is already there."""
        raise NotImplementedError

    def create_statements(self, spec: TableSpec) -> list[sa.sql.Executable]:
        """DDL and seed for a ticket table, safe to run when it already exists
        (``_schema.create_statements``)."""
        return _schema.create_statements(self, spec)

    def stamp_statements(self) -> list[sa.sql.Executable]:
        """DDL creating the stamp table, safe to run when it exists
        (``_schema.stamp_statements``)."""
        return _schema.stamp_statements(self)

    def drop_statements(self, *specs: TableSpec, stamps: bool = True) -> list[sa.sql.Executable]:
        """DDL dropping ticket tables (``_schema.drop_statements``)."""
        return _schema.drop_statements(self, specs, stamps=stamps)

    def drop_if_empty_statements(self, table: sa.Table) -> list[sa.sql.Executable] | None:
        """Statements dropping ``table`` if it has no row, decided by the database as they run
        (the same online and in a ``--sql`` script); ``None``: this backend's SQL cannot say
        it, and :meth:`drop_unused_stamps` looks itself."""
        return None

    def drop_unused_stamps(self, connection: sa.Connection) -> None:
        """Drop the stamp table, which must exist, if no row is left in it (no table of the
        library uses it any more): :meth:`drop_if_empty_statements`, or where SQL cannot say
        it, a look for a row and the drop (one writer at a time on SQLite's file, the only
        such backend, in the caller's transaction)."""
        t = self.stamp_table()
        statements = self.drop_if_empty_statements(t)
        if statements is None:
            if connection.execute(sa.select(t.c.name).limit(1)).first() is not None:
                return
            statements = [sa.schema.DropTable(t, if_exists=True)]
        for statement in statements:
            connection.execute(statement)

    def stride_of(self, t: sa.Table) -> tuple[sa.ColumnElement[int], sa.ColumnElement[int]]:
        """SQL expressions for a table's increment and offset."""
        if "increment" in t.c:
            return t.c.increment, t.c.offset
        return sa.literal(1), sa.literal(1)

    def raise_floor_statement(
        self, t: sa.Table, floor: sa.ColumnElement[int] | int
    ) -> sa.sql.Executable:
        """Move the sequence so its next id is above ``floor``, keeping its residue; a sequence
        already above is left alone. One statement, so it is atomic beside running clients."""
        increment, offset = self.stride_of(t)
        if isinstance(floor, int):
            floor = sa.literal(floor, sa.BigInteger)
        target = last_id_below(floor + 1, increment, offset)
        return sa.update(t).where(t.c.stub == "a", t.c.id < target).values(id=target)

    def restride_statement(
        self,
        t: sa.Table,
        *,
        offset: int,
        increment: int | None = None,
        last_id: int | sa.ColumnElement[int] | None = None,
    ) -> sa.sql.Executable:
        """Give a named sequence's table a new ``offset`` (and ``increment``, and last id: a
        number or a SQL expression) in one statement, so clients never see half of it. With
        only ``offset=PAUSED_OFFSET`` it pauses the table (see ``admin.restride``)."""
        values: dict[str, Any] = {"offset": offset}
        if increment is not None:
            values["increment"] = increment
        if last_id is not None:
            values["id"] = last_id
        return sa.update(t).where(t.c.stub == "a").values(**values)

    def check_create(self, connection: sa.Connection, spec: TableSpec) -> None:
        """Refuse, before anything is written, a table the server's settings contradict."""

    @contextmanager
    def creating(
        self, connection: sa.Connection, tables: Sequence[TicketTable], timeout: float
    ) -> Iterator[None]:
        """Make creating and seeding ``tables`` on ``connection`` (in autocommit) one step for
        every other client: concurrent creators of any of them wait for each other, and no
        reader sees a table without its row where the database allows it. The tables' locks
        are taken in one order for every creator, so creators of overlapping lists wait,
        never deadlock. Each wait lasts at most ``timeout`` s."""
        yield

    #: The most ticket tables :meth:`creating` covers at once (one transaction, where DDL is
    #: transactional): what one batch of ``TicketServer.create_tables`` may hold.
    create_batch: ClassVar[int] = 100

    def existing_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str]:
        """Those of ``names`` that are tables of the database, spelled as given, by the
        database's rules for table names: one catalog query, whatever the number of names."""
        raise NotImplementedError

    # -- identity (rewinds) --------------------------------------------------------------

    #: Whether :meth:`take_block` checks the table's identity in its own statement (a restore
    #: or a failover then makes the take advance nothing); elsewhere the source reads
    #: :meth:`identity` itself, on every new connection and at an interval.
    identity_in_block: ClassVar[bool] = False
    #: Whether that check sees every change :meth:`identity` would (else the source also reads
    #: :meth:`identity` at an interval: MySQL's creation time counts whole seconds).
    identity_in_block_complete: ClassVar[bool] = False

    #: Whether a connection that saw its database file replaced must be replaced (SQLite:
    #: it still has the old file open, read-only).
    def is_moved(self, error: BaseException) -> bool:
        """Whether a DBAPI error says the connection's database was replaced under it."""
        return False

    def identity(self, cursor: Any, dialect: Dialect, table: TicketTable) -> Identity | None:
        """The identity of ``table`` as the database shows it now (``None``: no such table)."""
        raise NotImplementedError

    def identity_columns(self, name: str) -> list[sa.ColumnElement[Any]]:
        """Scalar SQL expressions that change when the table ``name`` is restored or its
        database fails over, cheap enough to add to a statement that runs anyway (a datacenter
        tier's take); empty where there are none."""
        return []

    def stamp_table(self, metadata: sa.MetaData | None = None) -> sa.Table:
        """What the library records about this database to notice that it went back in time
        (``_schema.stamp_table``); without ``metadata``, one ``Table`` made once (SQLAlchemy
        caches what it compiles by table: a new one at each read would be compiled again)."""
        if metadata is not None:
            return _schema.stamp_table(self, metadata)
        found = self._tier_take_statements.get("stamp_table")
        if found is None:
            with self._lock:
                found = self._tier_take_statements.setdefault(
                    "stamp_table", _schema.stamp_table(self))
        return found  # type: ignore[no-any-return]

    def read_stamp(self, connection: sa.Connection, table: TicketTable) -> Identity | None:
        """The identity recorded for ``table`` (``None``: none recorded). Without a stamp table
        the database's error propagates (:meth:`is_missing_table` says so)."""
        t = self.stamp_table()
        row = connection.execute(
            sa.select(t.c.stamp, t.c.synchronous, t.c.last_id).where(t.c.name == table.name)
        ).first()
        return None if row is None or not row[0] else _recorded(*row)

    def record_stamp(
        self,
        connection: sa.Connection,
        table: TicketTable,
        identity: Identity,
        last_id: int | None,
    ) -> None:
        """Record ``identity`` as ``table``'s (in the stamp table, which must exist: nothing is
        created at run time where a migration made the tables)."""
        t = self.stamp_table()
        values = {
            "stamp": identity.stamp,
            "synchronous": int(identity.synchronous),
            "last_id": _lease_or(identity, last_id),
        }
        connection.execute(self.insert_seed(t, {"name": table.name, **values}))
        connection.execute(sa.update(t).where(t.c.name == table.name).values(**values))

    # -- datacenter tiers: see _tier_sql.TierSQL

    @contextmanager
    def transaction(self, connection: sa.Connection, timeout: float) -> Iterator[None]:
        """One transaction on an autocommit ``connection`` that writes: committed when the
        block ends, rolled back if it raises. Row locks are waited for at most ``timeout`` s
        where the database can say so (elsewhere the connection's own bound cuts the wait)."""
        connection.exec_driver_sql("BEGIN")
        try:
            yield
        except BaseException:
            try:
                connection.exec_driver_sql("ROLLBACK")
            except Exception:  # the connection is gone: so is its transaction
                pass
            raise
        connection.exec_driver_sql("COMMIT")

    # -- round trips ---------------------------------------------------------------------

    def take_block(
        self,
        cursor: Any,
        dialect: Dialect,
        table: TicketTable,
        count: int,
        info: TableInfo,
        identity: Identity | None = None,
    ) -> int | None:
        """Advance the table by ``count`` ids in one statement; return the block's last id.

        ``None`` means no row was advanced: the table has no row, its stride is no longer
        ``info``'s, the ids would pass the table's bit width, or (where
        :attr:`identity_in_block`) the table is no longer ``identity``'s (the caller tells
        which with :meth:`describe` and :meth:`identity`).
        """
        plan = self.take_plan(dialect, table, count, info, identity)
        if plan is None:
            return None
        stmt, values = plan
        stmt.execute(cursor, **values)
        return self.advanced_id(cursor)

    def take_plan(
        self,
        dialect: Dialect,
        table: TicketTable,
        count: int,
        info: TableInfo,
        identity: Identity | None = None,
    ) -> tuple[RawStatement, dict[str, Any]] | None:
        """The statement :meth:`take_block` runs and its values (``None``: more than the id
        space, where no row could advance and the SQL would overflow)."""
        step = count * info.increment
        if step > table.max_id:
            return None
        guards = self.identity_guards(identity) if identity is not None and identity.guard else None
        if guards and identity is not None:
            stmt = self.statement(dialect, table, *self.guarded_take(identity))
        else:
            stmt = self.statement(dialect, table, "take_block", self.advance_statement)
            guards = {}
        if table.flickr:
            return stmt, {"step": step, "max": table.max_id - step, **guards}
        return stmt, {"step": step, "max": table.max_id - step, "increment": info.increment,
                      "offset": info.offset, **guards}

    def take_blocks(
        self,
        cursor: Any,
        dialect: Dialect,
        items: Sequence[tuple[TicketTable, int, TableInfo, Identity | None]],
    ) -> list[int | None]:
        """:meth:`take_block` of each ``(table, count, info, identity)``, in order, in the
        caller's transaction."""
        return [self.take_block(cursor, dialect, t, count, info, identity)
                for t, count, info, identity in items]

    def identity_guards(self, identity: Identity) -> dict[str, Any]:
        """Parameters of :meth:`guarded_advance_statement` for ``identity`` (empty: the
        backend does not check identities in the take)."""
        return {}

    def guarded_take(self, identity: Identity) -> tuple[str, Callable[[sa.Table], Any]]:
        """The cache key and builder of the take that checks ``identity`` (see
        :meth:`guarded_advance_statement`)."""
        return "take_guarded", self.guarded_advance_statement

    def guarded_advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        """:meth:`advance_statement`, advancing only while the table is the one the
        parameters of :meth:`identity_guards` describe."""
        raise NotImplementedError

    def advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        """The statement :meth:`take_block` runs (see :func:`advance`)."""
        raise NotImplementedError

    def give_back_block(
        self, cursor: Any, dialect: Dialect, table: TicketTable, ids: range, info: TableInfo
    ) -> bool:
        """Move a named table back to before ``ids`` if they are the last ids it issued, in one
        compare-and-set statement; whether it moved (not when another block was taken since,
        or the stride changed). Never on Flickr's tables, which ``REPLACE INTO`` clients move
        without this library."""
        if table.flickr:
            return False
        stmt = self.statement(dialect, table, "give_back", self.give_back_statement)
        stmt.execute(cursor, last=ids[-1], before=ids.start - ids.step,
                     increment=info.increment, offset=info.offset)
        return int(cursor.rowcount) == 1

    def give_back_blocks(
        self,
        cursor: Any,
        dialect: Dialect,
        items: Sequence[tuple[TicketTable, range, TableInfo]],
    ) -> list[bool]:
        """:meth:`give_back_block` of each ``(table, ids, info)``, in order, in the caller's
        transaction (a table may come more than once: its latest block first)."""
        return [self.give_back_block(cursor, dialect, t, ids, info) for t, ids, info in items]

    def give_back_statement(self, t: sa.Table) -> sa.sql.Executable:
        """``UPDATE t SET id = :before WHERE id = :last`` (and the stride is still the one the
        ids were issued with)."""
        return (
            sa.update(t)
            .where(
                t.c.stub == "a",
                t.c.id == sa.bindparam("last", type_=sa.BigInteger),
                t.c.increment == sa.bindparam("increment", type_=sa.Integer),
                t.c.offset == sa.bindparam("offset", type_=sa.Integer),
            )
            .values(id=sa.bindparam("before", type_=sa.BigInteger))
        )

    def advanced_id(self, cursor: Any) -> int | None:
        """The last id of the block just taken, read from the cursor; ``None``: no row moved."""
        raise NotImplementedError

    def describe(self, cursor: Any, dialect: Dialect, table: TicketTable) -> TableInfo | None:
        """The table's stride and last id, or ``None`` when it has no row."""
        raise NotImplementedError

    def is_missing_table(self, error: BaseException) -> bool:
        """Whether a DBAPI error says the ticket table does not exist."""
        raise NotImplementedError

    def created_concurrently(self, error: BaseException) -> bool:
        """Whether a DBAPI error of ``CREATE ... IF NOT EXISTS`` says another session created
        the same object at the same moment (the statement may run again: it finds it)."""
        return False

    def is_denied(self, error: BaseException) -> bool:
        """Whether a DBAPI error says the role may not do this (create a table, say)."""
        return False

    # -- statement cache -----------------------------------------------------------------


    def tier_tables(
        self, names: TierTables, metadata: sa.MetaData | None = None
    ) -> tuple[sa.Table, sa.Table]:
        """The Core tables of a datacenter tier (``_schema.tier_tables``)."""
        return _schema.tier_tables(self, names, metadata)

    def tier_table_options(self) -> dict[str, Any]:
        """Dialect options of a datacenter tier's tables (MySQL: a transactional engine)."""
        return {}

    def tier_statements(self, names: TierTables) -> list[sa.sql.Executable]:
        """DDL creating a datacenter tier's tables (``_schema.tier_statements``)."""
        return _schema.tier_statements(self, names)

    def drop_tier_statements(
        self, names: TierTables, *, stamps: bool = True
    ) -> list[sa.sql.Executable]:
        """DDL dropping a datacenter tier's tables (``_schema.drop_tier_statements``)."""
        return _schema.drop_tier_statements(self, names, stamps=stamps)

    def missing_columns(
        self, connection: sa.Connection, table: sa.Table
    ) -> list[tuple[str, sa.sql.Executable]]:
        """``(name, ALTER TABLE ... ADD COLUMN)`` for each column of ``table`` its database
        lacks (a datacenter tier's tables made by an older release)."""
        present = {c["name"] for c in sa.inspect(connection).get_columns(table.name)}
        quoted = connection.dialect.identifier_preparer.format_table(table)
        return [
            (column.name, sa.text(
                f"ALTER TABLE {quoted} ADD COLUMN "
                f"{sa.schema.CreateColumn(column).compile(dialect=connection.dialect)}"
            ))
            for column in table.columns
            if column.name not in present
        ]

    def keys_in(
        self, columns: Sequence[sa.Column[Any]], keys: Sequence[tuple[Any, ...]]
    ) -> sa.ColumnElement[bool]:
        """Rows whose ``columns`` equal one of ``keys`` (a few hundred at most: a parameter per
        value here, and SQLite bounds a statement's parameters)."""
        return sa.tuple_(*columns).in_(list(keys))

    def update_rows(
        self, connection: sa.Connection, table: sa.Table, keys: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        """Set the other columns of each of ``rows`` (column name -> value, the same names in
        each) on the row of ``table`` whose ``keys`` columns hold its values (one statement per
        row here)."""
        if not rows:
            return
        c = table.c
        stmt = sa.update(table).where(
            *(c[k] == sa.bindparam(f"k_{k}", type_=c[k].type) for k in keys)
        ).values({name: sa.bindparam(f"v_{name}", type_=c[name].type)
                  for name in rows[0] if name not in keys})
        connection.execute(stmt, [{(f"k_{n}" if n in keys else f"v_{n}"): v
                                   for n, v in row.items()} for row in rows])

    def delete_rows(
        self, connection: sa.Connection, table: sa.Table, keys: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        """Delete the rows of ``table`` whose ``keys`` columns hold one of ``rows`` (one
        statement per row here)."""
        if not rows:
            return
        c = table.c
        connection.execute(
            sa.delete(table).where(
                *(c[k] == sa.bindparam(f"k_{k}", type_=c[k].type) for k in keys)),
            [{f"k_{k}": value for k, value in zip(keys, row, strict=True)} for row in rows],
        )

    def least(self, a: Any, b: Any) -> sa.ColumnElement[int]:
        """The smaller of two integer expressions."""
        return sa.func.least(a, b, type_=sa.BigInteger)

    def tier_take(
        self,
        connection: sa.Connection,
        state: sa.Table,
        guards: Sequence[sa.ColumnElement[Any]],
        values: Mapping[str, Any],
    ) -> Any:
        """Take up to ``values["k_count"]`` ids from the head range of the state row of
        ``values["k_name"]``/``values["k_bits"]`` in **one statement** (autocommit: the row's lock
        is held for that statement alone), where ``guards`` equal ``values["guard<i>"]``.

        Returns a row with ``first``, ``taken``, ``step`` (the block), ``stock``, ``rate``,
        ``rate_at``, ``exhausted`` and ``now_ms``; ``None`` when no row moved (no state row,
        an empty head, or the guards differ: the caller looks why)."""
        raise NotImplementedError

    def tier_take_where(
        self, state: sa.Table, guards: Sequence[sa.ColumnElement[Any]]
    ) -> list[sa.ColumnElement[bool]]:
        """The conditions of :meth:`tier_take`: this sequence, a head with ids, the guards."""
        return [
            state.c.sequence_name == sa.bindparam("k_name", type_=state.c.sequence_name.type),
            state.c.bits == sa.bindparam("k_bits", type_=sa.SmallInteger),
            state.c.head_first <= state.c.head_last,
            *(g == sa.bindparam(f"guard{i}", type_=g.type) for i, g in enumerate(guards)),
        ]

    def tier_taken(self, state: sa.Table) -> sa.ColumnElement[int]:
        """How many ids a take of ``:count`` hands out of the head: all it asks, or the rest."""
        c = state.c
        return self.least(
            sa.bindparam("k_count", type_=sa.BigInteger),
            (c.head_last - c.head_first) // c.head_step + 1,
        )


    def describe_many(
        self, cursor: Any, dialect: Dialect, tables: Sequence[TicketTable]
    ) -> dict[TicketTable, TableInfo | None]:
        """:meth:`describe` of many tables that exist, a few hundred per round trip (one
        ``UNION ALL`` of their rows); a table without its row maps to ``None``."""
        found: dict[TicketTable, TableInfo | None] = {}
        named = [t for t in tables if not t.flickr]
        for table in tables:
            if table.flickr:
                found[table] = self.describe(cursor, dialect, table)
        template = self._describe_template(dialect) if named else ""
        quote = dialect.identifier_preparer.quote
        stand_in = quote(_STAND_IN)
        for start in range(0, len(named), MANY):
            part = named[start : start + MANY]
            # One compiled row read, its table and its index swapped per table (building and
            # compiling a few hundred selects would cost more than the round trip).
            cursor.execute(" UNION ALL ".join(
                template.replace(stand_in, quote(table.name)).replace(str(_INDEX), str(i))
                for i, table in enumerate(part)
            ))
            rows = cursor.fetchall()
            for table in part:
                found[table] = None
            for i, last_id, increment, offset in rows:
                found[part[int(i)]] = TableInfo(int(increment), int(offset), int(last_id))
        return found

    def _describe_template(self, dialect: Dialect) -> str:
        """The row read of a named stand-in table, index :data:`_INDEX`, values inlined."""
        key = ("describe_template", dialect.name, dialect.driver)
        found = self._tier_take_statements.get(key)
        if found is None:
            t = self.table(TableSpec(TicketTable("x", 64, _STAND_IN)))
            query = sa.select(sa.literal(_INDEX, sa.Integer).label("i"), t.c.id, t.c.increment,
                              t.c.offset).where(t.c.stub == "a")
            found = str(query.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
            self._tier_take_statements[key] = found
        return str(found)

    def identities(
        self, cursor: Any, dialect: Dialect, tables: Sequence[TicketTable]
    ) -> dict[TicketTable, Identity | None]:
        """:meth:`identity` of many tables (``None``: no such table), in as few round trips as
        the backend allows."""
        return {table: self.identity(cursor, dialect, table) for table in tables}

    def read_stamps(
        self, connection: sa.Connection, tables: Sequence[TicketTable]
    ) -> dict[str, Identity]:
        """The identities recorded for ``tables``, by table name (one read per few hundred).
        Without a stamp table the database's error propagates."""
        t = self.stamp_table()
        found: dict[str, Identity] = {}
        names = sorted({table.name for table in tables})
        for start in range(0, len(names), MANY):
            rows = connection.execute(
                sa.select(t.c.name, t.c.stamp, t.c.synchronous, t.c.last_id)
                .where(t.c.name.in_(names[start : start + MANY]))
            ).all()
            for name, stamp, synchronous, last_id in rows:
                if stamp:
                    found[name] = _recorded(stamp, synchronous, last_id)
        return found

    def record_stamps(
        self,
        connection: sa.Connection,
        stamps: Mapping[TicketTable, tuple[Identity, int | None]],
    ) -> None:
        """:meth:`record_stamp` of many tables (``table -> (identity, last_id)``), in a few
        statements."""
        if not stamps:
            return
        t = self.stamp_table()
        rows = [
            {"k_name": table.name, "v_stamp": identity.stamp,
             "v_synchronous": int(identity.synchronous),
             "v_last": _lease_or(identity, last_id)}
            for table, (identity, last_id) in stamps.items()
        ]
        seed = self.insert_seed(t, {
            "name": sa.bindparam("k_name", type_=t.c.name.type),
            "stamp": sa.bindparam("v_stamp", type_=t.c.stamp.type),
            "synchronous": sa.bindparam("v_synchronous", type_=sa.SmallInteger),
            "last_id": sa.bindparam("v_last", type_=sa.BigInteger),
        })
        update = sa.update(t).where(t.c.name == sa.bindparam("k_name", type_=t.c.name.type)).values(
            stamp=sa.bindparam("v_stamp", type_=t.c.stamp.type),
            synchronous=sa.bindparam("v_synchronous", type_=sa.SmallInteger),
            last_id=sa.bindparam("v_last", type_=sa.BigInteger),
        )
        for start in range(0, len(rows), MANY):
            part = rows[start : start + MANY]
            # Rows registered with their table (the usual case) take the update alone; where
            # some are missing (or the driver cannot count), they are seeded and all updated.
            if connection.execute(update, part).rowcount == len(part):
                continue
            connection.execute(seed, part)
            connection.execute(update, part)

    def refuses_transactions(self, error: BaseException | None) -> bool:
        """Whether a DBAPI error says the server refuses transaction blocks (a connection
        pooler that hands out each statement on its own)."""
        return False

    def is_retryable(self, error: BaseException) -> bool:
        """Whether a DBAPI error of this backend's driver is one a retry can cure: a lost or
        refused connection, a timeout, a deadlock, a serialization failure."""
        return False

    #: Whether this backend's identities can say their commits wait for the standbys (the
    #: identity of a table that does not is read again now and then: it may start to).
    replicates_synchronously: ClassVar[bool] = False

    def renew_leases(
        self, connection: sa.Connection, live: Identity, lease_ms: int
    ) -> None:
        """Move the lease of every ticket table of ``live``'s database and era that records a
        synchronous identity to ``lease_ms`` past the database's clock (never back), while
        its replication is still what ``live`` saw: committed, as every commit is then, only
        once the standbys have it. Nothing where replication cannot be synchronous."""

    def is_dropped(self, error: BaseException) -> bool:
        """Whether a DBAPI error raised while connecting says a server that accepted the
        connection closed it (an operator's kill, a reaper, a pooler's restart), as opposed to
        a connection refused, unreachable or timed out (the server is down)."""
        return False

    def is_conflict(self, error: BaseException) -> bool:
        """Whether a DBAPI error says a single statement in autocommit lost a write conflict
        and was rolled back whole (so running it again is safe): a deadlock, a failed Galera
        certification."""
        return False

    #: Whether a database of this backend may be a node of a multi-writer cluster that
    #: replicates every table (MariaDB Galera): see :meth:`cluster`.
    may_be_clustered: ClassVar[bool] = False

    def cluster(self, cursor: Any) -> str | None:
        """The id of the multi-writer cluster this database is a node of (``None``: none)."""
        return None

    def __init__(self) -> None:
        self._statements: dict[tuple[str, str, str, TicketTable, str], RawStatement] = {}
        # Core statements of datacenter tiers, per (state table, guards): SQLAlchemy caches
        # their compiled forms; and SQL made once per dialect.
        self._tier_take_statements: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def once(self, dialect: Dialect, key: str, build: Callable[[], Any]) -> RawStatement:
        """The statement ``key``, the same for every table, built by ``build()`` and compiled
        once per driver."""
        cache_key = (key, dialect.name, dialect.driver, dialect.paramstyle)
        found = self._tier_take_statements.get(cache_key)
        if found is None:
            with self._lock:
                found = self._tier_take_statements.get(cache_key)
                if found is None:
                    found = self._tier_take_statements[cache_key] = RawStatement(build(), dialect)
        return found

    def statement(
        self, dialect: Dialect, table: TicketTable, key: str, build: Any
    ) -> RawStatement:
        """The compiled statement ``key`` for ``table``, built by ``build(sa_table)`` once."""
        # Per driver too: drivers of one database differ in paramstyle (psycopg's
        # ``%(name)s``, asyncpg's ``$1``).
        cache_key = (dialect.name, dialect.driver, dialect.paramstyle, table, key)
        found = self._statements.get(cache_key)
        if found is None:
            # Compiled once per shape of table (Flickr's or a named one, per width), on a
            # stand-in name; each table gets that SQL with its own name.
            stand_in = TicketTable(None if table.flickr else "x", table.bits, _STAND_IN)
            shape = (dialect.name, dialect.driver, dialect.paramstyle, stand_in, key)
            with self._lock:
                template = self._statements.get(shape)
                if template is None:
                    template = RawStatement(build(self.table(TableSpec(stand_in))), dialect)
                    self._statements[shape] = template
                found = self._statements.get(cache_key)
                if found is None:
                    found = template.renamed(_STAND_IN, table.name, dialect)
                    self._statements[cache_key] = found
        return found


class ReturningBackend(TicketBackend):
    """Backends where ``UPDATE … RETURNING id`` advances the one ticket row in one round trip."""

    def tier_take(
        self,
        connection: sa.Connection,
        state: sa.Table,
        guards: Sequence[sa.ColumnElement[Any]],
        values: Mapping[str, Any],
    ) -> Any:
        stmt = self._tier_take_statements.get((state, tuple(guards)))
        if stmt is None:
            c = state.c
            taken = self.tier_taken(state)
            # RETURNING shows the new values: the block is what the head moved past.
            stmt = (
                sa.update(state)
                .where(*self.tier_take_where(state, guards))
                .values(
                    last_take=taken,
                    head_first=c.head_first + taken * c.head_step,
                    stock=c.stock - taken,
                    issued=c.issued + taken,
                )
                .returning(
                    (c.head_first - c.last_take * c.head_step).label("first"),
                    c.last_take.label("taken"),
                    c.head_step.label("step"),
                    c.stock, c.rate, c.rate_at, c.exhausted,
                    db_now_ms().label("now_ms"),
                )
            )
            self._tier_take_statements[(state, tuple(guards))] = stmt
        return connection.execute(stmt, dict(values)).one_or_none()

    def advance_statement(self, t: sa.Table) -> sa.sql.Executable:
        return advance(t, t.c.id + _STEP).returning(t.c.id)

    def advanced_id(self, cursor: Any) -> int | None:
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def describe(self, cursor: Any, dialect: Dialect, table: TicketTable) -> TableInfo | None:
        stmt = self.statement(dialect, table, "describe", _select_row)
        row = stmt.execute(cursor).fetchone()
        if row is None:
            return None
        if table.flickr:
            return TableInfo(1, 1, int(row[0]))
        return TableInfo(int(row[1]), int(row[2]), int(row[0]))


_STEP = sa.bindparam("step", type_=sa.BigInteger)


def advance(t: sa.Table, new_id: sa.ColumnElement[int]) -> sa.Update:
    """``UPDATE t SET id = <new_id>`` for a block of ``:step`` ids, refusing to pass ``:max``
    (the bit-width limit less the step) and, on named tables, refusing a row whose stride is
    not the one the caller knows (``:increment``, ``:offset``): a stride changed by a restride
    makes the caller read it again instead of computing its block with the old one."""
    conditions = [t.c.stub == "a", t.c.id <= sa.bindparam("max", type_=sa.BigInteger)]
    if "increment" in t.c:
        conditions.append(t.c.increment == sa.bindparam("increment", type_=sa.Integer))
        conditions.append(t.c.offset == sa.bindparam("offset", type_=sa.Integer))
    return sa.update(t).where(*conditions).values(id=new_id)


def last_id_below(first: Any, increment: Any, offset: Any) -> Any:
    """The "last id" that makes the next id the smallest id >= ``first`` congruent to
    ``offset`` (mod ``increment``) — in SQL or in Python. ``(x % n + n) % n`` because ``%``
    keeps the sign of ``x`` on these databases."""
    return first + ((offset - first) % increment + increment) % increment - increment


def lock_key(table: TicketTable) -> int:
    """A stable 31-bit number for a ticket table, for databases whose locks are numbered."""
    return zlib.crc32(table.name.encode()) & 0x7FFFFFFF


def _select_row(t: sa.Table) -> sa.sql.Executable:
    columns = [t.c.id] + ([t.c.increment, t.c.offset] if "increment" in t.c else [])
    return sa.select(*columns).where(t.c.stub == "a")


def _recorded(stamp: str, synchronous: Any, last_id: int | None) -> Identity:
    """A ticket table's identity as its stamp row records it. Its ``last_id`` holds the lease
    of a synchronous failover as a negative number of milliseconds (ids are never negative,
    so a row an older release wrote, with the table's last id there, holds no lease)."""
    lease = -last_id if last_id is not None and last_id < 0 else None
    return Identity.from_stamp(stamp, bool(synchronous), lease)


def _lease_or(identity: Identity, last_id: int | None) -> int | None:
    """What a ticket table's stamp row keeps in ``last_id`` (see :func:`_recorded`)."""
    return -identity.trusted_until if identity.trusted_until is not None else last_id

