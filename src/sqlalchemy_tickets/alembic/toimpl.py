"""How the ticket-table operations run: online on the migration's connection, offline as SQL text.

The statements come from the schema module (``sqlalchemy_tickets._schema``: the same DDL and
seed row that :meth:`TicketServer.create_tables <sqlalchemy_tickets.TicketServer.create_tables>`
runs), built for the backend of the migration's dialect, and go through ``operations.execute``
one by one, so that ``alembic upgrade --sql`` prints them. Online,
the backend's ``check_create`` runs first (on MySQL/MariaDB it compares a Flickr table's
requested stride with the server's ``auto_increment_increment``/``auto_increment_offset`` and
raises :class:`~sqlalchemy_tickets.StrideMismatchError` before anything is created), and tables
that exist are left out; offline there is no server to ask, so the check is written into the
script as a comment instead, and every table's statements are written (each safe to run when
its table exists).

Online, the statements share the migration's transaction, unless the operation runs in
``op.get_context().autocommit_block()``: there tables are created in batches, each batch one
transaction under the tables' creation locks, as ``TicketServer.create_tables`` does.

The stamp table goes with the ticket tables and the tiers: made with them, each registered in
it (online, tables that were there already too), and dropped with the last of them — in SQL
the database runs where it can say "if no row is left" (PostgreSQL, MySQL/MariaDB); on SQLite
the operation looks itself online, and a script keeps the table with a comment saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from alembic.operations import Operations

from .._naming import STAMP_TABLE, TicketTable
from .ops import (
    CreateDatacenterTablesOp,
    CreateTicketTableOp,
    CreateTicketTablesOp,
    CreateWorkerLeaseTableOp,
    DropDatacenterTablesOp,
    DropTicketTableOp,
    DropTicketTablesOp,
    DropWorkerLeaseTableOp,
    RestrideTicketTableOp,
    SyncTicketSequenceOp,
    _NoOp,
)

# The schema module and the dialect modules are imported when an operation runs: this module
# registers the implementations, and every `import alembic` loads it through the package's plugin
# entry point. Nothing of the runtime sources is imported: the statements are the schema
# module's.
if TYPE_CHECKING:
    from .._schema import TableSpec
    from ..dialects.base import TicketBackend

#: Seconds a batch created in an autocommit block waits for another creator's locks (a
#: migration has no timeout of its own; the ticket servers' clients hold them for milliseconds).
_LOCK_WAIT = 60.0


def _backend(operations: Operations) -> TicketBackend:
    from ..dialects import backend_for

    dialect = operations.get_context().dialect
    return backend_for(dialect.name)


def _emit(operations: Operations, statement: sa.sql.Executable) -> None:
    """Run one statement; offline, print it with its values inlined."""
    context = operations.get_context()
    impl = context.impl
    if context.as_sql:
        is_ddl = isinstance(statement, sa.schema.ExecutableDDLElement)
        if not (is_ddl or impl.literal_binds):
            # Compile here: a script without literal_binds=True would print bare placeholders.
            assert isinstance(statement, sa.sql.ClauseElement)
            kw: dict[str, Any] = {} if is_ddl else {"compile_kwargs": {"literal_binds": True}}
            compiled = statement.compile(dialect=context.dialect, **kw)
            impl.static_output(
                str(compiled).replace("\t", "    ").strip() + impl.command_terminator
            )
            return
    operations.execute(statement)


def _emit_all(operations: Operations, statements: Iterable[sa.sql.Executable]) -> None:
    for statement in statements:
        _emit(operations, statement)


def _comment(operations: Operations, text: str) -> None:
    context = operations.get_context()
    if context.as_sql:
        lines = "\n".join(f"-- {line}" for line in text.splitlines())
        context.impl.static_output(lines)


@Operations.implementation_for(CreateTicketTableOp)
def create_ticket_table(operations: Operations, operation: CreateTicketTableOp) -> None:
    _create_ticket_tables(operations, [operation.spec])


@Operations.implementation_for(CreateTicketTablesOp)
def create_ticket_tables(operations: Operations, operation: CreateTicketTablesOp) -> None:
    _create_ticket_tables(operations, operation.specs)


def _create_ticket_tables(operations: Operations, specs: Sequence[TableSpec]) -> None:
    from .. import _schema

    backend = _backend(operations)
    # Build every statement before running any: a spec the backend refuses (e.g. a stride on a
    # Flickr table where the server cannot supply one) fails with nothing written.
    statements = {spec.table.name: _schema.create_statements(backend, spec) for spec in specs}
    # The stamp table goes with the ticket tables: the application's role, which may not
    # create tables, records their identities there (rewinds, docs/rewinds.md).
    if operations.get_context().as_sql:
        _emit_all(operations, _schema.stamp_statements(backend))
        for spec in specs:
            _offline_stride_note(operations, backend, spec)
            _emit_all(operations, statements[spec.table.name])
        return
    bind = operations.get_bind()
    for spec in specs:
        backend.check_create(bind, spec)
    existing = backend.existing_tables(bind, [*statements, STAMP_TABLE])
    if STAMP_TABLE not in existing:
        _emit_all(operations, _schema.stamp_statements(backend))
    missing = [spec for spec in specs if spec.table.name not in existing]
    # Tables that are there already (made by `init`, a first use, an older release) are
    # registered all the same: their registration keeps the stamp table while they exist.
    _emit_all(operations, _schema.register_statements(
        backend, [spec.table.name for spec in specs if spec.table.name in existing]))
    if bind.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        for spec in missing:
            _emit_all(operations, statements[spec.table.name])
        return
    # In an autocommit block: batches, each created and seeded as one step for other clients.
    for at in range(0, len(missing), backend.create_batch):
        batch = missing[at : at + backend.create_batch]
        with backend.creating(bind, [spec.table for spec in batch], _LOCK_WAIT):
            for spec in batch:
                _emit_all(operations, statements[spec.table.name])


def _offline_stride_note(operations: Operations, backend: TicketBackend, spec: TableSpec) -> None:
    if spec.table.flickr and backend.flickr_stride_from_server:
        if (spec.increment, spec.offset) == (1, 1):
            note = (
                f"{spec.table.name} takes its stride from this server's "
                "auto_increment_increment / auto_increment_offset."
            )
        else:
            note = (
                f"{spec.table.name} takes its stride from the server: run this only on a server "
                f"with auto_increment_increment={spec.increment} and "
                f"auto_increment_offset={spec.offset} (checked online, not in --sql mode)."
            )
        _comment(operations, f"sqlalchemy-tickets: {note}")


@Operations.implementation_for(DropTicketTableOp)
def drop_ticket_table(operations: Operations, operation: DropTicketTableOp) -> None:
    _drop_ticket_tables(operations, [operation.ticket_table])


@Operations.implementation_for(DropTicketTablesOp)
def drop_ticket_tables(operations: Operations, operation: DropTicketTablesOp) -> None:
    _drop_ticket_tables(operations, operation.ticket_tables)


def _drop_ticket_tables(operations: Operations, tables: Sequence[TicketTable]) -> None:
    from .. import _schema

    backend = _backend(operations)
    specs = [_schema.TableSpec(table) for table in tables]
    stamps = _has_stamps(operations, backend)
    _emit_all(operations, _schema.drop_statements(backend, specs, stamps=stamps))
    _drop_unused_stamps(operations, backend, stamps)


def _has_stamps(operations: Operations, backend: TicketBackend) -> bool:
    """Whether the database has the stamp table (offline: it is made with the ticket tables)."""
    if operations.get_context().as_sql:
        return True
    return STAMP_TABLE in backend.existing_tables(operations.get_bind(), [STAMP_TABLE])


def _drop_unused_stamps(operations: Operations, backend: TicketBackend, stamps: bool) -> None:
    """After a drop, on a backend whose SQL cannot drop the stamp table only where no row is
    left (SQLite; the others' drop statements hold it): online, look and drop; offline, say
    in the script what to run once no table of the library is left."""
    from .. import _schema

    if not stamps or _schema.drop_unused_stamps_statements(backend) is not None:
        return
    if not operations.get_context().as_sql:
        backend.drop_unused_stamps(operations.get_bind())
        return
    drop = sa.schema.DropTable(_schema.stamp_table(backend), if_exists=True)
    ddl = str(drop.compile(dialect=operations.get_context().dialect)).strip()
    _comment(operations, (
        f"sqlalchemy-tickets: {STAMP_TABLE} stays: this database cannot drop it only where no "
        "table uses it any more (no conditional DDL). Once no row is left in it (SELECT "
        f"count(*) FROM {STAMP_TABLE} says 0), it may go: {ddl};"
    ))


@Operations.implementation_for(SyncTicketSequenceOp)
def sync_ticket_sequence(operations: Operations, operation: SyncTicketSequenceOp) -> None:
    from .. import _schema

    backend = _backend(operations)
    spec = _schema.TableSpec(operation.ticket_table)
    attach = backend.embedded_attach(_EMBEDDED) if operation.embedded else None
    schema = None if attach is None else _EMBEDDED
    t = _schema.ticket_table(backend, spec, schema=schema)
    attached_here = False
    if attach is not None:
        # The embedded default's own database (SQLite: the -tickets sibling file), made with
        # the ticket table where the application never drew an id yet, as the embedded
        # default would make them on first use.
        attached_here = operations.get_context().as_sql or not backend.is_attached(
            operations.get_bind(), _EMBEDDED)
        if attached_here:
            _emit_all(operations, attach[0])
        _emit_all(operations, _schema.stamp_statements(backend, schema=schema))
        _emit_all(operations, _schema.create_statements(backend, spec, schema=schema))
    if _schema.seed_row(backend, spec) is None:
        # Flickr's table on MySQL/MariaDB starts without its row (the first REPLACE INTO makes
        # it), and an UPDATE of no row would move nothing: make the row as a legacy client
        # would, which costs one id that nobody gets.
        _emit(operations, backend.insert_seed(t, {"stub": "a"}))
    source = sa.table(operation.table, sa.column(operation.column))
    floor = sa.select(sa.func.coalesce(sa.func.max(source.c[operation.column]), 0))
    # The statement `sqlalchemy-tickets sync` runs, with the floor read by the database.
    _emit(operations, backend.raise_floor_statement(t, floor.scalar_subquery()))
    if attach is not None and attached_here:
        _detach(operations, attach[1])


#: The schema name the embedded default's database is attached as (``embedded=True``).
_EMBEDDED = "tickets_embedded"


def _detach(operations: Operations, statements: list[sa.sql.Executable]) -> None:
    if operations.get_context().as_sql:
        _emit_all(operations, statements)
        return
    try:
        _emit_all(operations, statements)
    except sa.exc.OperationalError as error:
        # SQLite detaches nothing inside a transaction (the migration's, once it wrote):
        # "database ... is locked". It stays attached until the connection closes, and a
        # later operation on this connection uses it as it is.
        if "locked" not in str(error.orig):
            raise


@Operations.implementation_for(RestrideTicketTableOp)
def restride_ticket_table(operations: Operations, operation: RestrideTicketTableOp) -> None:
    from .. import _schema
    from ..dialects.base import last_id_below

    backend = _backend(operations)
    t = _schema.ticket_table(backend, _schema.TableSpec(operation.ticket_table))
    floor = sa.case((t.c.id > operation.above, t.c.id), else_=operation.above)
    inc, off = operation.increment, operation.offset
    last = last_id_below(floor + 1, inc, off)
    _emit(operations, backend.restride_statement(t, offset=off, increment=inc, last_id=last))


@Operations.implementation_for(_NoOp)
def _no_op(operations: Operations, operation: _NoOp) -> None:
    """Nothing to undo."""


@Operations.implementation_for(CreateWorkerLeaseTableOp)
def create_worker_lease_table(operations: Operations, operation: CreateWorkerLeaseTableOp) -> None:
    from .._schema import lease_table_statements

    _emit_all(operations, lease_table_statements(name=operation.name))


@Operations.implementation_for(DropWorkerLeaseTableOp)
def drop_worker_lease_table(operations: Operations, operation: DropWorkerLeaseTableOp) -> None:
    from .._schema import drop_lease_table_statements

    _emit_all(operations, drop_lease_table_statements(name=operation.name))


@Operations.implementation_for(CreateDatacenterTablesOp)
def create_datacenter_tables(operations: Operations, operation: CreateDatacenterTablesOp) -> None:
    from .. import _schema

    context = operations.get_context()
    backend = _backend(operations)
    _emit_all(operations, _schema.tier_statements(backend, operation.names))
    if context.as_sql:
        _comment(operations, "tier tables made by a release before 0.4 need the columns of "
                 "the one-statement take: run this migration online, or `sqlalchemy-tickets "
                 "init --url URL --datacenter-tier`, to add them")
        return
    # Tables made by an older release: the columns of the one-statement take are added.
    _, state = _schema.tier_tables(backend, operation.names)
    for _, ddl in backend.missing_columns(operations.get_bind(), state):
        operations.execute(ddl)


@Operations.implementation_for(DropDatacenterTablesOp)
def drop_datacenter_tables(operations: Operations, operation: DropDatacenterTablesOp) -> None:
    from .. import _schema

    backend = _backend(operations)
    stamps = _has_stamps(operations, backend)
    _emit_all(operations, _schema.drop_tier_statements(backend, operation.names, stamps=stamps))
    _drop_unused_stamps(operations, backend, stamps)
