"""The library's tables, in one place: what they are (Core ``Table`` objects) and the statements
that make and drop them.

- a **ticket table** per sequence (``tickets__photos``, Flickr's ``Tickets64``/``Tickets32``)
  and the seed row it starts with;
- the **stamp table** (``tickets_stamps``), one per database, where the library records each
  ticket table's and datacenter tier's identity and the tiers' upstream marks
  (``docs/rewinds.md``), and where every table that uses it is **registered** by the
  statements that make it: a row keyed by the table's name (a tier: its state table's),
  whose stamp stays empty until a client records the identity (an empty stamp reads as none
  recorded, as rows that older releases made at run time read);
- a **datacenter tier's** two tables (``<prefix>__stock``, ``<prefix>__state``);
- the **worker-lease table** of ``SnowflakeId`` (``tickets_worker_leases``).

Every path that makes or drops them takes its statements from here: the Alembic operations
(online and in ``--sql`` scripts), ``TicketServer.create_tables`` / ``init``, the datacenter
tier, ``create_lease_table``, ``drop_ticket_tables``. Pure: functions of a backend (the few
facts of a database that the DDL depends on, :class:`SchemaBackend`) and names, building
SQLAlchemy constructs; no connection, no thread. The backends of ``dialects/`` use them, so
this module imports nothing of ``dialects/`` (nor of ``sources/``).

**Nothing left behind.** Dropping a table forgets its rows in the stamp table (a table
dropped on purpose and made again is a new sequence, not a rewind), then drops the stamp
table where no row is left: while another ticket table or a tier remains, its registration
keeps the stamp table. The database decides as the statements run: PostgreSQL in one ``DO``
block, MySQL/MariaDB with a prepared statement (``drop_if_empty_statements`` of their
backends), so ``--sql`` scripts say it too. SQLite has no conditional DDL: a client connected
to the database looks for itself (``TicketBackend.drop_unused_stamps``), and a ``--sql``
script keeps the stamp table, saying so in a comment (``docs/alembic.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ._naming import (
    DEFAULT_LEASE_TABLE,
    MAX_SEQUENCE_LENGTH,
    STAMP_NAME_LENGTH,
    STAMP_TABLE,
    TicketTable,
    TierTables,
    first_id,
)
from .errors import TicketsError

__all__ = [
    "DEFAULT_LEASE_TABLE",
    "SchemaBackend",
    "TableSpec",
    "create_statements",
    "drop_lease_table_statements",
    "drop_statements",
    "drop_tier_statements",
    "drop_unused_stamps_statements",
    "forget_statements",
    "lease_table",
    "lease_table_statements",
    "register_statements",
    "seed_row",
    "stamp_statements",
    "stamp_table",
    "ticket_table",
    "tier_mark_prefix",
    "tier_statements",
    "tier_tables",
]

#: Names bound in one ``IN (...)`` list: well under every backend's limit on parameters.
NAMES_PER_STATEMENT = 500


class SchemaBackend(Protocol):
    """What the DDL of the library's tables needs to know of a database (a ``TicketBackend``
    of ``dialects/`` is one)."""

    @property
    def flickr_stride_from_server(self) -> bool:
        """Whether Flickr's tables are auto-increment tables taking their stride from the
        server (MySQL/MariaDB: Flickr's published schema, shared with ``REPLACE INTO``
        clients)."""

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        """An INSERT of ``row`` that does nothing when its key is already there."""

    def tier_table_options(self) -> dict[str, Any]:
        """Dialect options of the stamp and tier tables (MySQL: a transactional engine)."""

    def drop_if_empty_statements(self, table: sa.Table) -> list[sa.sql.Executable] | None:
        """Statements dropping ``table`` if it has no row, decided by the database as they
        run; ``None`` where SQL cannot say it."""


@dataclass(frozen=True)
class TableSpec:
    """How to create a ticket table: which table, and where its id space starts."""

    table: TicketTable
    start: int = 1
    increment: int = 1
    offset: int = 1
    #: Storage engine, where the backend has a choice (MySQL: ``InnoDB`` or ``MyISAM``).
    storage_engine: str = "InnoDB"

    @property
    def first_id(self) -> int:
        return first_id(self.start, self.increment, self.offset)


# -- ticket tables ---------------------------------------------------------------------------


def ticket_table(
    backend: SchemaBackend,
    spec: TableSpec,
    metadata: sa.MetaData | None = None,
    *,
    schema: str | None = None,
) -> sa.Table:
    """The Core ``Table`` of a ticket table (its DDL is what :func:`create_statements` emits);
    ``schema``: in that schema (or attached database) rather than the default one."""
    metadata = metadata if metadata is not None else sa.MetaData()
    t = spec.table
    if t.flickr:
        return flickr_table(backend, spec, metadata, schema=schema)
    return sa.Table(
        t.name,
        metadata,
        sa.Column("stub", sa.CHAR(1), primary_key=True),
        sa.Column("id", sa.BigInteger, nullable=False),
        # Quoted always: MariaDB reserves OFFSET, and an offline script for a mysql:// URL
        # cannot know which server it will run on.
        sa.Column("increment", sa.Integer, nullable=False, quote=True),
        sa.Column("offset", sa.Integer, nullable=False, quote=True),
        schema=schema,
    )


def flickr_table(
    backend: SchemaBackend, spec: TableSpec, metadata: sa.MetaData, *, schema: str | None = None
) -> sa.Table:
    """Flickr's ``Tickets64``/``Tickets32``: on MySQL/MariaDB its published schema (unsigned
    auto-increment ``id``, unique ``stub``), elsewhere the same columns without the
    auto-increment (the library's take moves the one row)."""
    if backend.flickr_stride_from_server:
        unsigned: sa.types.TypeEngine[int] = (
            mysql.BIGINT(20, unsigned=True)
            if spec.table.bits == 64
            else mysql.INTEGER(10, unsigned=True)
        )
        return sa.Table(
            spec.table.name,
            metadata,
            sa.Column("id", unsigned, primary_key=True, autoincrement=True),
            sa.Column("stub", sa.CHAR(1), nullable=False, server_default=""),
            sa.UniqueConstraint("stub", name="stub"),
            # The mariadb dialect reads only mariadb_* options, the mysql dialect mysql_*.
            mysql_engine=spec.storage_engine,
            mysql_auto_increment=str(spec.first_id),
            mariadb_engine=spec.storage_engine,
            mariadb_auto_increment=str(spec.first_id),
            schema=schema,
        )
    id_type = sa.BigInteger if spec.table.bits == 64 else sa.Integer
    return sa.Table(
        spec.table.name,
        metadata,
        sa.Column("id", id_type, primary_key=True, autoincrement=False),
        sa.Column("stub", sa.CHAR(1), nullable=False, server_default=""),
        # Constraint names are per schema on PostgreSQL: Tickets64 and Tickets32 each need
        # their own (MySQL keeps Flickr's UNIQUE KEY `stub`).
        sa.UniqueConstraint("stub", name=f"{spec.table.name}_stub"),
        schema=schema,
    )


def seed_row(backend: SchemaBackend, spec: TableSpec) -> dict[str, Any] | None:
    """The row a new ticket table starts with (``id`` = the id before the first one);
    ``None``: Flickr's auto-increment table, whose first ``REPLACE INTO`` makes it."""
    if spec.table.flickr:
        if backend.flickr_stride_from_server:
            return None
        if spec.increment != 1 or spec.offset != 1:
            raise TicketsError(
                f"Flickr's {spec.table.name} table has no stride columns on this backend; "
                "use a named sequence (e.g. create_ticket_table('Photos', increment=2, "
                "offset=2)) for odd/even ticket servers"
            )
        return {"id": spec.first_id - 1, "stub": "a"}
    return {
        "stub": "a",
        "id": spec.first_id - spec.increment,
        "increment": spec.increment,
        "offset": spec.offset,
    }


def create_statements(
    backend: SchemaBackend, spec: TableSpec, *, schema: str | None = None
) -> list[sa.sql.Executable]:
    """DDL and seed of a ticket table, and its registration in the stamp table (which must
    exist: :func:`stamp_statements` first); safe to run when they exist."""
    table = ticket_table(backend, spec, schema=schema)
    statements: list[sa.sql.Executable] = [sa.schema.CreateTable(table, if_not_exists=True)]
    row = seed_row(backend, spec)
    if row is not None:
        statements.append(backend.insert_seed(table, row))
    statements += register_statements(backend, [spec.table.name], schema=schema)
    return statements


def drop_statements(
    backend: SchemaBackend, specs: Sequence[TableSpec], *, stamps: bool = True
) -> list[sa.sql.Executable]:
    """DDL dropping ticket tables; with ``stamps`` (the stamp table is there), their rows
    forgotten (a table dropped on purpose and made again later is a new sequence, not a
    rewind) and the stamp table dropped where no row is left, where SQL can say so (see the
    module's documentation)."""
    statements: list[sa.sql.Executable] = [
        sa.schema.DropTable(ticket_table(backend, spec), if_exists=True) for spec in specs
    ]
    if specs and stamps:
        statements += forget_statements(backend, [spec.table.name for spec in specs])
        statements += drop_unused_stamps_statements(backend) or []
    return statements


# -- the stamp table -------------------------------------------------------------------------


def stamp_table(
    backend: SchemaBackend, metadata: sa.MetaData | None = None, *, schema: str | None = None
) -> sa.Table:
    """What the library records about a database to notice that it went back in time: each
    ticket table's and datacenter tier's identity (``stamp``, keyed by table name; empty:
    registered, nothing recorded yet), and the highest id a tier stored from each upstream
    lane (``last_id``). On a ticket table's row, a negative ``last_id`` is the lease of a
    synchronous failover (``synchronous``; see ``dialects/base._recorded``)."""
    metadata = metadata if metadata is not None else sa.MetaData()
    return sa.Table(
        STAMP_TABLE,
        metadata,
        sa.Column("name", sa.String(STAMP_NAME_LENGTH), primary_key=True),
        sa.Column("stamp", sa.String(255), nullable=False, server_default=""),
        sa.Column("synchronous", sa.SmallInteger, nullable=False, server_default="0"),
        sa.Column("last_id", sa.BigInteger, nullable=True),
        comment="sqlalchemy-tickets: identities and high-water marks, to notice rewinds",
        schema=schema,
        **backend.tier_table_options(),
    )


def stamp_statements(
    backend: SchemaBackend, *, schema: str | None = None
) -> list[sa.sql.Executable]:
    """DDL creating the stamp table, safe to run when it exists: made with the ticket tables,
    by every path that makes them, so that at run time a role with only SELECT, INSERT,
    UPDATE and DELETE keeps every guard against rewinds."""
    return [sa.schema.CreateTable(stamp_table(backend, schema=schema), if_not_exists=True)]


def register_statements(
    backend: SchemaBackend, names: Iterable[str], *, schema: str | None = None
) -> list[sa.sql.Executable]:
    """A row for each table of ``names`` in the stamp table, where it has none (a row a
    client wrote, with an identity, stays as it is): what keeps the stamp table while the
    table exists."""
    t = stamp_table(backend, schema=schema)
    return [backend.insert_seed(t, {"name": name}) for name in dict.fromkeys(names)]


def forget_statements(
    backend: SchemaBackend, names: Sequence[str], prefixes: Sequence[str] = ()
) -> list[sa.sql.Executable]:
    """DELETEs of the stamp rows ``names`` (a few hundred a statement) and of those whose
    name starts with one of ``prefixes``."""
    t = stamp_table(backend)
    statements: list[sa.sql.Executable] = []
    unique = list(dict.fromkeys(names))
    for at in range(0, len(unique), NAMES_PER_STATEMENT):
        chunk = unique[at : at + NAMES_PER_STATEMENT]
        which = t.c.name == chunk[0] if len(chunk) == 1 else t.c.name.in_(chunk)
        statements.append(sa.delete(t).where(which))
    for prefix in dict.fromkeys(prefixes):
        # Escaped: a table name's underscores are LIKE's one-character wildcard.
        statements.append(sa.delete(t).where(t.c.name.startswith(prefix, autoescape=True)))
    return statements


def drop_unused_stamps_statements(backend: SchemaBackend) -> list[sa.sql.Executable] | None:
    """Statements dropping the stamp table where no row is left (no table uses it any
    more), decided by the database as they run; ``None`` on a backend whose SQL cannot say
    it (SQLite)."""
    return backend.drop_if_empty_statements(stamp_table(backend))


# -- datacenter tiers ------------------------------------------------------------------------


def tier_tables(
    backend: SchemaBackend, names: TierTables, metadata: sa.MetaData | None = None
) -> tuple[sa.Table, sa.Table]:
    """The Core tables of a datacenter tier: its stock of id ranges, and one state row per
    (sequence, bits). See ``sources/datacenter.py`` for what each column means."""
    metadata = metadata if metadata is not None else sa.MetaData()
    options = backend.tier_table_options()
    stock = sa.Table(
        names.stock,
        metadata,
        sa.Column("sequence_name", sa.String(MAX_SEQUENCE_LENGTH), primary_key=True),
        sa.Column("bits", sa.SmallInteger, primary_key=True, autoincrement=False),
        # 0: given back, 1: never issued. The key's order is the order ids go out in:
        # ranges given back first, then upwards.
        sa.Column("kind", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("first_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("last_id", sa.BigInteger, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        comment="sqlalchemy-tickets: datacenter tier, ranges of ids in stock",
        **options,
    )
    state = sa.Table(
        names.state,
        metadata,
        sa.Column("sequence_name", sa.String(MAX_SEQUENCE_LENGTH), primary_key=True),
        sa.Column("bits", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("stock", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("issued", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("given_back", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("refills", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("refilled", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("rate", sa.Double, nullable=False, server_default="0"),
        sa.Column("rate_at", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("rate_count", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("claim_owner", sa.String(64), nullable=False, server_default=""),
        sa.Column("claim_until", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("refilled_at", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("exhausted", sa.SmallInteger, nullable=False, server_default="0"),
        # The range being handed out (empty when head_first > head_last), out of the stock
        # rows: a take moves this one row in one statement (see tier_take).
        sa.Column("head_kind", sa.SmallInteger, nullable=False, server_default="1"),
        sa.Column("head_first", sa.BigInteger, nullable=False, server_default="1"),
        sa.Column("head_last", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("head_step", sa.Integer, nullable=False, server_default="1"),
        # How many ids the latest take handed out: how a one-statement take returns its
        # block where RETURNING shows only new values.
        sa.Column("last_take", sa.BigInteger, nullable=False, server_default="0"),
        comment="sqlalchemy-tickets: datacenter tier, stock, rate and refill claim",
        **options,
    )
    return stock, state


def tier_mark_prefix(names: TierTables) -> str:
    """How the keys of a tier's upstream marks in the stamp table start (the tier's own
    identity is keyed by its state table's name)."""
    return f"upstream:{names.state}:"


def tier_statements(backend: SchemaBackend, names: TierTables) -> list[sa.sql.Executable]:
    """DDL creating a datacenter tier's tables, safe to run when they exist; with the stamp
    table, where the tier records its identity and its upstream lanes' marks, and the tier's
    registration there."""
    return [
        *(sa.schema.CreateTable(t, if_not_exists=True) for t in tier_tables(backend, names)),
        *stamp_statements(backend),
        *register_statements(backend, [names.state]),
    ]


def drop_tier_statements(
    backend: SchemaBackend, names: TierTables, *, stamps: bool = True
) -> list[sa.sql.Executable]:
    """DDL dropping a datacenter tier's tables (and the ids in stock with them); with
    ``stamps`` (the stamp table is there), the tier's identity and upstream marks forgotten
    and the stamp table dropped where no row is left (see :func:`drop_statements`)."""
    statements: list[sa.sql.Executable] = [
        sa.schema.DropTable(t, if_exists=True) for t in reversed(tier_tables(backend, names))
    ]
    if stamps:
        statements += forget_statements(backend, [names.state], [tier_mark_prefix(names)])
        statements += drop_unused_stamps_statements(backend) or []
    return statements


# -- the worker-lease table ------------------------------------------------------------------


def lease_table(
    metadata: sa.MetaData | None = None,
    *,
    name: str = DEFAULT_LEASE_TABLE,
    schema: str | None = None,
) -> sa.Table:
    """The Core ``Table`` of worker leases (added to ``metadata`` if given)."""
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("namespace", sa.String(64), primary_key=True),
        sa.Column("worker_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(32), nullable=False, server_default=""),
        sa.Column("owner", sa.String(200), nullable=False, server_default=""),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("issued_until", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("acquired_at", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("renewed_at", sa.BigInteger, nullable=False, server_default="0"),
        schema=schema,
        comment="sqlalchemy-tickets: Snowflake worker-id leases",
    )


def lease_table_statements(
    *, name: str = DEFAULT_LEASE_TABLE, schema: str | None = None
) -> list[sa.sql.Executable]:
    """DDL creating the lease table; safe to run when it exists."""
    return [sa.schema.CreateTable(lease_table(name=name, schema=schema), if_not_exists=True)]


def drop_lease_table_statements(
    *, name: str = DEFAULT_LEASE_TABLE, schema: str | None = None
) -> list[sa.sql.Executable]:
    """DDL dropping the lease table (forgets every worker's ``issued_until``)."""
    return [sa.schema.DropTable(lease_table(name=name, schema=schema), if_exists=True)]
