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

The library's own tables are never compared with the metadata (:func:`hide_library_tables`,
which the package's plugin runs ahead of Alembic's table comparison): ticket tables are never
in the metadata, and Alembic would propose to drop them — a ticket table holds the last id
issued, and dropping it would issue the same ids twice — and so would it the stamp table
(``tickets_stamps``, where each table's identity is recorded to notice a restore or a
failover), a tier's tables that ``DatacenterTier`` made on first use (the ids in stock would be
burned, every process of the datacenter would fail until they are back) and the lease table.
Left out of the comparison, they are neither proposed for dropping nor logged as "removed".
:func:`include_object` hides the same tables by name, for users who pass their own hooks.

Datacenter tiers: when ``target_metadata`` holds a tier's two tables
(:func:`~sqlalchemy_tickets.sources.datacenter.datacenter_tables`) and the database lacks
them, the two ``op.create_table`` Alembic would write become one
``op.create_datacenter_tables(...)`` — the same DDL, and a downgrade of
``op.drop_datacenter_tables(...)``.

Cut-over: a table that already exists, whose integer primary key becomes a ``TicketId`` drawing
from a ticket table this same migration creates (the switch from an auto-increment key), also
gets ``op.sync_ticket_sequence(sequence, table, column)`` after the ``create_ticket_table``: the
new sequence starts above the ids the table holds when the migration runs. On a SQLite file,
whose embedded default keeps its ticket tables in the ``-tickets`` sibling, such a key drawing
from the embedded default gets ``op.sync_ticket_sequence(..., embedded=True)`` while the sibling
lacks the sequence's table: the operation makes it there, above the rows.

Every run also makes the script import the modules of the package's column types it writes
(``import sqlalchemy_tickets`` for ``sqlalchemy_tickets.TicketId(...)``; see
:func:`~sqlalchemy_tickets.alembic.render.add_type_imports`).

Turn the comparator off with ``context.configure(..., sqlalchemy_tickets_autogenerate=False)``
(the imports are still written; the library's tables are then compared as any other).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from alembic.operations import ops
from sqlalchemy.engine import URL

from .._naming import (
    DEFAULT_LEASE_TABLE,
    DEFAULT_TABLE_TEMPLATE,
    DEFAULT_TIER_PREFIX,
    STAMP_TABLE,
    TicketTable,
    ticket_table,
    tier_tables,
)
from ..columns import TicketId
from ..errors import TicketsError
from .ops import CreateDatacenterTablesOp, CreateTicketTableOp, SyncTicketSequenceOp
from .render import add_type_imports

if TYPE_CHECKING:
    # Only for annotations: while Alembic >= 1.18 loads its plugins, which it does in the middle
    # of importing alembic.autogenerate, that package cannot be imported from yet.
    from alembic.autogenerate.api import AutogenContext

# The dialect modules are imported by the functions that compare against them (autogenerate, not
# the import): this module is imported with the package's Alembic support, which every
# `import alembic` loads through the plugin entry point. The runtime sources are never imported
# (see _runtime).

__all__ = ["include_object", "is_ticket_table_name", "ticket_tables"]

log = logging.getLogger(__name__)

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


_DEFAULT_TIER = tier_tables(DEFAULT_TIER_PREFIX)
_TIER_NAMES = frozenset({_DEFAULT_TIER.stock, _DEFAULT_TIER.state})
_STOCK, _STATE = "__stock", "__state"


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """An ``include_object`` hook that hides the library's tables from autogenerate.

    The package's plugin leaves them out of the comparison by itself; this is for projects
    that want it in their own hook (``context.configure(include_object=include_object)``, or
    called from theirs). Only tables that exist in the database but not in the metadata and
    have a ticket table's name (default template), the stamp table's, the lease table's
    default name, or the name of a datacenter tier's table under the default prefix
    (``tickets_dc__stock``, ``tickets_dc__state``), are hidden; everything else is included.
    """
    if type_ != "table" or not reflected or not isinstance(name, str):
        return True
    return not (
        is_ticket_table_name(name)
        or name.lower() in _TIER_NAMES
        or name.lower() in (STAMP_TABLE, DEFAULT_LEASE_TABLE)
    )


class _LibraryTablesLeftOut:
    """An autogenerate run's ``run_name_filters``, with the library's own tables left out:
    those of the database's default schema that the target metadata does not declare and
    that are the library's — ticket tables (by the default template and those of the
    metadata's sources, Flickr's ``Tickets64``/``Tickets32``), the stamp table, the
    worker-lease table under its default name, a datacenter tier's pair of tables (under the
    default prefix by name; under another, by both names and their columns). Alembic then
    neither reflects nor compares them: it proposes nothing for them and logs nothing
    ("Detected removed table ...").

    Tables the metadata declares (a tier's, the lease table's) are compared as any other."""

    def __init__(
        self, autogen_context: AutogenContext, wrapped: Callable[..., bool] | None
    ) -> None:
        self.context = autogen_context
        #: The filters the run had (``None``: Alembic's own method, for the class-wide hook).
        self.wrapped = wrapped
        self._names: frozenset[str] | None = None

    def __call__(self, name: str | None, type_: str, parent_names: Any) -> bool:
        if self.left_out(name, type_, parent_names):
            return False
        return True if self.wrapped is None else self.wrapped(name, type_, parent_names)

    def left_out(self, name: str | None, type_: str, parent_names: Any) -> bool:
        if type_ != "table" or not isinstance(name, str):
            return False
        if not isinstance(parent_names, MutableMapping) or parent_names.get("schema_name"):
            return False  # another schema than the default one: none of the library's
        if self.context.opts.get(OPTION, True) is False:
            return False
        return name.lower() in self.names()

    def names(self) -> frozenset[str]:
        """The library's tables of this run, lower case: found once, from the database's
        table names (read once per run, as Alembic reads them) and the metadata."""
        if self._names is None:
            self._names = _library_tables(self.context)
        return self._names


def _library_tables(autogen_context: AutogenContext) -> frozenset[str]:
    metadata_tables = list(autogen_context.sorted_tables)
    declared = {t.name.lower() for t in metadata_tables if t.schema is None}
    templates = {DEFAULT_TABLE_TEMPLATE, *_wanted(metadata_tables).values()}
    inspector = autogen_context.inspector
    present = {name.lower(): name for name in inspector.get_table_names()}
    found: set[str] = set()
    for low, name in present.items():
        if low in declared:
            continue
        if (
            low in (STAMP_TABLE, DEFAULT_LEASE_TABLE)
            or low in _TIER_NAMES
            or any(is_ticket_table_name(name, template) for template in templates)
        ):
            found.add(low)
            continue
        prefix = _tier_prefix(low)
        state = None if prefix is None or not low.endswith(_STOCK) else present.get(
            prefix + _STATE
        )
        if prefix is None or state is None or state.lower() in declared:
            continue
        want_stock, want_state = _tier_columns(prefix)
        if {c["name"].lower() for c in inspector.get_columns(name)} == want_stock and {
            c["name"].lower() for c in inspector.get_columns(state)
        } == want_state:
            found.update((low, state.lower()))
    return frozenset(found)


def hide_library_tables(autogen_context: AutogenContext) -> None:
    """Keep the library's own tables out of this autogenerate run's comparison (see
    :class:`_LibraryTablesLeftOut`): its name filters, which Alembic runs on every table name
    it reads from the database before reflecting the table, leave them out. Run by the
    package's plugin ahead of Alembic's table comparison (Alembic >= 1.18); a second call on
    the same run does nothing."""
    current = autogen_context.run_name_filters
    if not isinstance(current, _LibraryTablesLeftOut):
        # The method of this run's context, not a private list of filters: its own filters
        # (include_name) keep running, after the library's.
        autogen_context.run_name_filters = _LibraryTablesLeftOut(  # type: ignore[method-assign]
            autogen_context, current
        )


#: Each run's tables left out, where the hook is Alembic's class's (< 1.18).
_left_out: weakref.WeakKeyDictionary[Any, _LibraryTablesLeftOut] = weakref.WeakKeyDictionary()


def hide_library_tables_globally() -> None:
    """:func:`hide_library_tables` for every autogenerate run, where Alembic has no plugins
    (< 1.18) and so no hook that runs before its own table comparison: ``AutogenContext``'s
    ``run_name_filters`` leaves the library's tables out, then runs the run's filters.
    Once per process."""
    from alembic.autogenerate.api import AutogenContext

    with _register_lock:
        original = AutogenContext.run_name_filters
        if getattr(original, "sqlalchemy_tickets", False):
            return

        def run_name_filters(
            self: AutogenContext, name: str | None, type_: Any, parent_names: Any
        ) -> bool:
            left_out = _left_out.get(self)
            if left_out is None:
                left_out = _left_out.setdefault(self, _LibraryTablesLeftOut(self, None))
            if left_out.left_out(name, type_, parent_names):
                return False
            return bool(original(self, name, type_, parent_names))

        run_name_filters.sqlalchemy_tickets = True  # type: ignore[attr-defined]
        AutogenContext.run_name_filters = run_name_filters  # type: ignore[method-assign]


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
    from ..dialects import backend_for

    source = type_.source
    configured = _runtime("default", "configured_source")
    if source is None and configured is not None:
        source = configured()
    if source is None:  # the embedded default, beside the rows
        if database is None:
            return True
        try:
            backend = backend_for(database.get_backend_name())
        except TicketsError:
            return True
        return same_database(backend.embedded_url(database), database)
    cached, server = _runtime("cache", "CachedSource"), _runtime("server", "TicketServer")
    seen: set[int] = set()
    while cached is not None and isinstance(source, cached) and id(source) not in seen:
        seen.add(id(source))
        source = source.source
    if server is None or not isinstance(source, server) or database is None:
        return False
    return same_database(source.url, database)


def _runtime(module: str, name: str) -> Any:
    """``name`` of the runtime module ``sources.<module>`` if that module is loaded, else
    ``None``. The Alembic support never imports the sources (they start nothing here, but they
    are the runtime, which a migration does not need): a source object exists only once its
    class's module ran, and a source is configured only through ``sources.default``, so a
    module not loaded means no such object and nothing configured."""
    loaded = sys.modules.get(f"{__package__.rpartition('.')[0]}.sources.{module}")
    return None if loaded is None else getattr(loaded, name)


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs name one database (drivers, users and options aside)."""
    from ..dialects import backend_for

    if a.get_backend_name() != b.get_backend_name():
        return False
    try:
        backend = backend_for(a.get_backend_name())
    except TicketsError:
        return a == b
    return backend.database_key(a) == backend.database_key(b)


def _template(type_: TicketId) -> str:
    """The table template of a column's source (``TicketServer(table_template=...)``)."""
    template = getattr(type_.source, "table_template", None)
    return template if isinstance(template, str) else DEFAULT_TABLE_TEMPLATE


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
                template = _template(type_)
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


def compare_ticket_tables(
    autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps, schemas: Any
) -> None:
    """The ``"schema"``-level comparator (see the module docstring)."""
    # Whatever the option says: a script that writes sqlalchemy_tickets.TicketId(...) needs
    # its import.
    add_type_imports(autogen_context)
    if autogen_context.opts.get(OPTION, True) is False:
        return
    if None not in set(schemas):
        # Ticket tables live in the default schema; a run limited to other schemas skips them.
        return
    metadata_tables = list(autogen_context.sorted_tables)
    connection = autogen_context.connection
    database = connection.engine.url if connection is not None else None
    wanted = _wanted(metadata_tables, database, only_migrated=True)

    in_metadata = {t.name.lower() for t in metadata_tables if t.schema is None}
    _compare_tier_tables(upgrade_ops, metadata_tables)

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
    upgrade_ops.ops.extend(_cut_overs(autogen_context, metadata_tables, database, proposed,
                                      existing))
    upgrade_ops.ops.extend(_embedded_cut_overs(autogen_context, metadata_tables, database,
                                               existing))


def _switched_keys(
    autogen_context: AutogenContext, metadata_tables: list[sa.Table], existing: set[str]
) -> Iterator[tuple[sa.Table, sa.Column[Any], TicketId, str, TicketTable]]:
    """``(table, column, type, template, ticket table)`` of each table that already exists in
    the database and whose integer primary key now draws from a ``TicketId``: the switch from
    an auto-increment key (a foreign key draws nothing)."""
    for table in metadata_tables:
        if table.schema is not None or not _exists(table.name, existing, autogen_context):
            continue
        reflected: dict[str, Any] | None = None
        for column in table.primary_key.columns:
            type_ = column.type
            if not isinstance(type_, TicketId) or column.foreign_keys:
                continue
            if reflected is None:
                reflected = {
                    c["name"].lower(): c
                    for c in autogen_context.inspector.get_columns(table.name)
                }
            before = reflected.get(column.name.lower())
            if before is None or not isinstance(before["type"], sa.Integer):
                continue  # a new column, or one whose values no sequence could have issued
            template = _template(type_)
            yield table, column, type_, template, ticket_table(type_.sequence, type_.bits, template)


def _sync(
    table: sa.Table, column: sa.Column[Any], type_: TicketId, template: str, *, embedded: bool
) -> list[SyncTicketSequenceOp]:
    try:
        return [SyncTicketSequenceOp(type_.sequence, table.name, column.name, bits=type_.bits,
                                     table_template=template, embedded=embedded)]
    except TicketsError as error:
        log.warning("not proposing to sync %s above %s.%s: %s",
                    type_.sequence or "Tickets", table.name, column.name, error)
        return []


def _cut_overs(
    autogen_context: AutogenContext,
    metadata_tables: list[sa.Table],
    database: URL | None,
    new_ticket_tables: set[str],
    existing: set[str],
) -> list[SyncTicketSequenceOp]:
    """``SyncTicketSequenceOp``\\ s for the tables that already exist in the database and whose
    integer primary key now draws from a ticket table this migration creates (lower-case names
    in ``new_ticket_tables``): the switch from an auto-increment key to ``TicketId``.

    The rows of such a table hold ids the new sequence never issued; the database the migration
    runs on later (production) may hold many more than the one compared, so the move is
    proposed whether the table has rows here or not, and reads ``max(column)`` when it runs.
    Proposed only together with the ticket table, so the next autogenerate is quiet again.
    """
    found: list[SyncTicketSequenceOp] = []
    for table, column, type_, template, ticket in _switched_keys(
        autogen_context, metadata_tables, existing
    ):
        if ticket.name.lower() in new_ticket_tables and draws_from(type_, database):
            found += _sync(table, column, type_, template, embedded=False)
    return found


def _embedded_cut_overs(
    autogen_context: AutogenContext,
    metadata_tables: list[sa.Table],
    database: URL | None,
    existing: set[str],
) -> list[SyncTicketSequenceOp]:
    """The cut-over where the embedded default keeps the ticket tables in a database of their
    own (a SQLite file: the ``-tickets`` sibling, made on first use), so that no ticket table
    is proposed. A table switched from auto-increment still needs its sequence above its
    rows, or the first flush finds them in use and moves the sequence a margin above them (a
    WARNING, and a jump of a million ids): ``op.sync_ticket_sequence(..., embedded=True)``
    makes the sequence there above the rows as the migration runs. Proposed while that
    database lacks the sequence's table, so the next autogenerate is quiet again."""
    from ..dialects import backend_for

    if database is None or autogen_context.connection is None:
        return []
    try:
        backend = backend_for(database.get_backend_name())
    except TicketsError:
        return []
    if not backend.seen_apart(database):
        return []  # an in-memory database: its embedded default is out of a migration's reach
    configured = _runtime("default", "configured_source")
    if configured is not None and configured() is not None:
        return []  # the columns without a source draw from the configured one
    keys = [
        key for key in _switched_keys(autogen_context, metadata_tables, existing)
        if key[2].source is None
    ]
    if not keys:
        return []
    there = backend.embedded_tables(autogen_context.connection, [key[4].name for key in keys])
    if there is None:
        return []  # in the migrated database itself: proposed with the ticket table, above
    found: list[SyncTicketSequenceOp] = []
    for table, column, type_, template, ticket in keys:
        if ticket.name not in there:
            found += _sync(table, column, type_, template, embedded=True)
    return found


def _tier_prefix(name: str) -> str | None:
    """The prefix of a name of the form ``<prefix>__stock`` / ``<prefix>__state``."""
    for suffix in (_STOCK, _STATE):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            prefix = name[: -len(suffix)]
            try:
                tier_tables(prefix)
            except TicketsError:
                return None
            return prefix
    return None


def _tier_columns(prefix: str) -> tuple[set[str], set[str]]:
    """The column names of a tier's ``(stock, state)`` tables (the same on every backend)."""
    from .. import _schema
    from ..dialects import backend_for

    stock, state = _schema.tier_tables(backend_for("sqlite"), tier_tables(prefix))
    return {c.name for c in stock.columns}, {c.name for c in state.columns}


def _is_tier_pair(prefix: str, stock: sa.Table, state: sa.Table) -> bool:
    want_stock, want_state = _tier_columns(prefix)
    return (
        {c.name.lower() for c in stock.columns} == want_stock
        and {c.name.lower() for c in state.columns} == want_state
    )


def _compare_tier_tables(upgrade_ops: ops.UpgradeOps, metadata_tables: list[sa.Table]) -> None:
    """Two ``CreateTableOp`` of a tier's tables in the metadata become one
    ``CreateDatacenterTablesOp`` (module docstring); a tier's tables not in the metadata are
    not compared at all (:func:`hide_library_tables`)."""
    tiers: set[str] = set()  # prefixes (lower case) of the tiers declared in the metadata
    by_name = {t.name.lower(): t for t in metadata_tables if t.schema is None}
    for name in by_name:
        prefix = _tier_prefix(name)
        if prefix is None or not name.endswith(_STOCK):
            continue
        state = by_name.get(prefix.lower() + _STATE)
        if state is not None and _is_tier_pair(prefix, by_name[name], state):
            tiers.add(prefix.lower())

    rewritten: list[ops.MigrateOperation] = []
    created: set[str] = set()
    for op in upgrade_ops.ops:
        if isinstance(op, ops.ModifyTableOps) and op.schema is None:
            prefix = _tier_prefix(op.table_name)
            if prefix is not None and prefix.lower() in tiers:
                # PostgreSQL keeps a table's comment apart from its CREATE TABLE, which the
                # tier's DDL does not set there: a comment is no reason for a migration.
                op.ops = [
                    o for o in op.ops
                    if not isinstance(o, (ops.CreateTableCommentOp, ops.DropTableCommentOp))
                ]
                if not op.ops:
                    continue
        if isinstance(op, ops.CreateTableOp) and op.schema is None:
            prefix = _tier_prefix(op.table_name)
            key = prefix.lower() if prefix is not None else None
            if key in tiers:
                assert prefix is not None and key is not None
                if key not in created:
                    # The metadata's spelling of the prefix, from the stock table's name.
                    stock = by_name[key + _STOCK].name
                    rewritten.append(
                        CreateDatacenterTablesOp(table_prefix=stock[: -len(_STOCK)])
                    )
                    created.add(key)
                continue
        rewritten.append(op)
    upgrade_ops.ops = rewritten


def register_globally() -> None:
    """Put the comparator in Alembic's global registry, which every autogenerate runs: the
    only registry before Alembic 1.18 (which runs third-party comparators after its own). From
    1.18 on the comparator belongs to the package's plugin instead (see
    :mod:`sqlalchemy_tickets.alembic.plugin`)."""
    global _registered_globally
    with _register_lock:
        if _registered_globally:  # the registry appends: a second call would compare twice
            return
        from alembic.autogenerate import comparators

        comparators.dispatch_for("schema")(compare_ticket_tables)
        _registered_globally = True


_register_lock = threading.Lock()
_registered_globally = False
