"""Autogenerate support: ticket tables follow the ``TicketId`` columns of the target metadata.

A migration creates the ticket tables of the database it migrates, and only those. So
autogenerate proposes ``op.create_ticket_table(...)`` (once per table, when the table is missing)
for the ``TicketId`` columns whose ids are drawn **from the database being migrated**:

- columns that use the embedded default (no ``source=``, nothing set by
  :func:`~sqlalchemy_tickets.configure`), on backends where the embedded default keeps its
  tables in the application's database (PostgreSQL, MySQL/MariaDB; on a SQLite file it keeps
  them in a sibling file, which it creates itself on first use);
- columns whose source (``source=``, else the configured one) is one
  :class:`~sqlalchemy_tickets.TicketServer`, or a :class:`~sqlalchemy_tickets.CachedSource`
  over one, on that same database (e.g. ``configure("sqlite:///app.db")`` in an app on
  ``app.db``).

Columns drawing from dedicated ticket servers (any other database, a
:class:`~sqlalchemy_tickets.TicketServers` pair, any other source) get nothing: their tables
belong to the ticket servers, made by ``sqlalchemy-tickets init`` at deploy time or by an
Alembic project of their own (see ``migrations_examples/mysql-flickr-two-servers``).
Foreign keys to ticket ids draw nothing either.

Ticket tables are never in the metadata, so Alembic itself would propose to drop them; those
``DropTableOp``\\ s are taken out again — a ticket table holds the last id issued, and dropping it
would issue the same ids twice. :func:`include_object` does the same at the source, for users
who prefer it (or who run a version of Alembic where the comparator below is not reached).

Turn the comparator off with ``context.configure(..., sqlalchemy_tickets_autogenerate=False)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import alembic.util
import sqlalchemy as sa
from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy.engine import URL

from .._naming import DEFAULT_TABLE_TEMPLATE, TicketTable, ticket_table
from ..columns import TicketId
from ..dialects import backend_for
from ..errors import TicketsError
from ..sources.cache import CachedSource
from ..sources.default import configured_source
from ..sources.server import TicketServer
from .ops import CreateTicketTableOp

__all__ = ["include_object", "is_ticket_table_name", "ticket_tables"]

#: ``context.configure`` option that turns the comparator off when set to False.
OPTION = "sqlalchemy_tickets_autogenerate"

_FLICKR_NAMES = frozenset({"tickets64", "tickets32"})


def _template_regex(template: str) -> re.Pattern[str]:
    before, _, after = template.partition("{sequence}")
    return re.compile(re.escape(before) + r"[A-Za-z][A-Za-z0-9_]*" + re.escape(after) + r"\Z", re.I)


_DEFAULT_RE = _template_regex(DEFAULT_TABLE_TEMPLATE)


def is_ticket_table_name(name: str, table_template: str = DEFAULT_TABLE_TEMPLATE) -> bool:
    """Whether ``name`` is a ticket table's name: Flickr's ``Tickets64``/``Tickets32`` or one
    the template makes (default ``tickets__<sequence>``). Case-insensitive, because backends
    fold names differently."""
    if name.lower() in _FLICKR_NAMES:
        return True
    pattern = (
        _DEFAULT_RE if table_template == DEFAULT_TABLE_TEMPLATE else _template_regex(table_template)
    )
    return pattern.match(name) is not None


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """An ``include_object`` hook that hides ticket tables from autogenerate.

    Pass it to ``context.configure(include_object=include_object)`` in ``env.py`` (or call it
    from your own hook). Only tables that exist in the database but not in the metadata and
    have a ticket table's name are hidden; everything else is included.
    """
    if type_ != "table" or not reflected or not isinstance(name, str):
        return True
    return not is_ticket_table_name(name)


def ticket_tables(
    metadata: sa.MetaData | Iterable[sa.Table], *, database: str | URL | None = None
) -> list[TicketTable]:
    """The ticket tables that the ``TicketId`` columns of ``metadata`` draw from, in table order.

    Columns that are foreign keys (to another table's ticket id) draw nothing and are skipped.
    With ``database``, only the tables a migration of that database creates: those of columns
    whose ids are drawn from it (see the module's documentation).
    """
    url = sa.engine.make_url(database) if database is not None else None
    return list(_wanted(metadata, url, only_migrated=database is not None))


def draws_from(type_: TicketId, database: URL | None) -> bool:
    """Whether a ``TicketId`` column's ids are drawn from ``database`` (the one a migration
    runs on; ``None``: unknown, so only the embedded default counts)."""
    source = type_.source if type_.source is not None else configured_source()
    if source is None:  # the embedded default, beside the rows
        if database is None:
            return True
        try:
            backend = backend_for(database.get_backend_name())
        except TicketsError:
            return True
        return same_database(backend.embedded_url(database), database)
    seen: set[int] = set()
    while isinstance(source, CachedSource) and id(source) not in seen:
        seen.add(id(source))
        source = source.source
    if not isinstance(source, TicketServer) or database is None:
        return False
    return same_database(source.url, database)


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs name one database (drivers, users and options aside)."""
    if a.get_backend_name() != b.get_backend_name():
        return False
    try:
        backend = backend_for(a.get_backend_name())
    except TicketsError:
        return a == b
    return backend.database_key(a) == backend.database_key(b)


def _wanted(
    metadata: sa.MetaData | Iterable[sa.Table],
    database: URL | None = None,
    *,
    only_migrated: bool = False,
) -> dict[TicketTable, str]:
    """Ticket tables of the metadata's ``TicketId`` columns, each with its table template
    (``only_migrated``: only those drawn from ``database``)."""
    tables = metadata.sorted_tables if isinstance(metadata, sa.MetaData) else metadata
    found: dict[TicketTable, str] = {}
    for table in tables:
        for column in table.columns:
            type_ = column.type
            if isinstance(type_, TicketId) and not column.foreign_keys:
                if only_migrated and not draws_from(type_, database):
                    continue
                # A source with its own table template (TicketServer(table_template=...)).
                template = getattr(type_.source, "table_template", None)
                if not isinstance(template, str):
                    template = DEFAULT_TABLE_TEMPLATE
                found.setdefault(ticket_table(type_.sequence, type_.bits, template), template)
    return found


def _exists(name: str, existing: set[str], autogen_context: AutogenContext) -> bool:
    """Whether the database has the table ``name``, going by the names it reports.

    An exact match settles it. A match in another case (MySQL with ``lower_case_table_names``,
    SQLite's case-insensitive names — but not PostgreSQL, where the quoted ``"Tickets64"`` and an
    unquoted ``tickets64`` are two tables) is left to the database's own rules.
    """
    if name in existing:
        return True
    if name.lower() not in {n.lower() for n in existing}:
        return False
    return bool(autogen_context.inspector.has_table(name))


def _walk(container: ops.OpContainer) -> Iterator[ops.OpContainer]:
    yield container
    for op in container.ops:
        if isinstance(op, ops.OpContainer):
            yield from _walk(op)


def compare_ticket_tables(
    autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps, schemas: Any
) -> None:
    """The ``"schema"``-level comparator (see the module docstring)."""
    if autogen_context.opts.get(OPTION, True) is False:
        return
    if None not in set(schemas):
        # Ticket tables live in the default schema; a run limited to other schemas skips them.
        return
    metadata_tables = list(autogen_context.sorted_tables)
    connection = autogen_context.connection
    database = connection.engine.url if connection is not None else None
    # Every template in use, for recognising ticket tables not to drop; only the tables drawn
    # from this database, for proposing.
    templates = {DEFAULT_TABLE_TEMPLATE, *_wanted(metadata_tables).values()}
    wanted = _wanted(metadata_tables, database, only_migrated=True)

    # Never drop a ticket table: the last id issued would be lost, and ids issued again. (For a
    # table it is about to drop, Alembic may also propose index changes: drop those too.)
    in_metadata = {t.name.lower() for t in metadata_tables if t.schema is None}

    def unwanted(op: ops.MigrateOperation) -> bool:
        if not isinstance(op, (ops.DropTableOp, ops.ModifyTableOps)):
            return False
        name = op.table_name
        return (
            op.schema is None
            and name.lower() not in in_metadata
            and any(is_ticket_table_name(name, template) for template in templates)
        )

    for container in _walk(upgrade_ops):
        container.ops = [op for op in container.ops if not unwanted(op)]

    if not wanted:
        return
    existing = set(autogen_context.inspector.get_table_names())
    proposed = {
        op.table_name.lower() for op in upgrade_ops.ops if isinstance(op, CreateTicketTableOp)
    }
    for table, template in wanted.items():
        if _exists(table.name, existing, autogen_context):
            continue
        if table.name.lower() in in_metadata or table.name.lower() in proposed:
            continue
        upgrade_ops.ops.append(
            CreateTicketTableOp(table.sequence, bits=table.bits, table_template=template)
        )
        proposed.add(table.name.lower())


def _register() -> None:
    priority = getattr(alembic.util, "DispatchPriority", None)
    if priority is not None:
        # Alembic >= 1.18: run after the built-in table comparison, whose DropTableOps we filter.
        comparators.dispatch_for("schema", priority=priority.LAST)(compare_ticket_tables)
    else:  # pragma: no cover - Alembic < 1.18 runs third-party comparators after its own
        comparators.dispatch_for("schema")(compare_ticket_tables)


_register()
