"""How autogenerate writes the library's operations and column types into a migration script.

``op.create_ticket_table('photos')``, ``op.create_ticket_table(bits=32)``,
``op.drop_ticket_table('photos')``, ``op.create_ticket_tables(['orders', 'invoices'])``,
``op.sync_ticket_sequence('photos', 'photos', 'id')``, ``op.create_datacenter_tables()`` —
arguments at their defaults are left out. A script with one
of them also gets ``import sqlalchemy_tickets.alembic``, which registers the operations when it
runs (a project on Alembic < 1.18 may not import the package in ``env.py`` at upgrade time).

Column types of the package render as ``sqlalchemy_tickets.TicketId('photos')``,
``sqlalchemy_tickets.SnowflakeId()``, ``sqlalchemy_tickets.UUID7()``,
``sqlalchemy_tickets.PrefixedId('post')`` (Alembic writes ``<module>.<repr>`` for types that are
not SQLAlchemy's); :func:`add_type_imports` makes such a script ``import sqlalchemy_tickets``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

# The submodule, not the package: while Alembic >= 1.18 loads its plugins, alembic.autogenerate
# is only half imported, and its render module (which needs nothing of it) not yet at all.
from alembic.autogenerate.render import renderers

from .ops import (
    CreateDatacenterTablesOp,
    CreateTicketTableOp,
    CreateTicketTablesOp,
    DropDatacenterTablesOp,
    DropTicketTableOp,
    DropTicketTablesOp,
    SyncTicketSequenceOp,
    _NoOp,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from alembic.autogenerate.api import AutogenContext

    _RenderItem = Callable[[str, Any, AutogenContext], "str | Literal[False]"]

__all__ = ["IMPORT_LINE", "add_type_imports"]

#: One line for every operation of the library, so a script with several gets it once.
IMPORT_LINE = "import sqlalchemy_tickets.alembic  # noqa: F401 (registers its op.* operations)"

_PACKAGE = __name__.split(".", 1)[0]


def _call(
    autogen_context: AutogenContext,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
) -> str:
    imports = getattr(autogen_context, "imports", None)
    if imports is not None:
        imports.add(IMPORT_LINE)
    rendered = [repr(arg) for arg in args]
    rendered.extend(f"{key}={value!r}" for key, value in kwargs.items())
    return f"op.{name}({', '.join(rendered)})"


def _sequence(sequence: str | None) -> list[Any]:
    return [] if sequence is None else [sequence]


@renderers.dispatch_for(CreateTicketTableOp)
def render_create_ticket_table(autogen_context: AutogenContext, op: CreateTicketTableOp) -> str:
    return _call(autogen_context, "create_ticket_table", _sequence(op.sequence), op.render_kwargs())


@renderers.dispatch_for(DropTicketTableOp)
def render_drop_ticket_table(autogen_context: AutogenContext, op: DropTicketTableOp) -> str:
    return _call(autogen_context, "drop_ticket_table", _sequence(op.sequence), op.render_kwargs())


@renderers.dispatch_for(CreateTicketTablesOp)
def render_create_ticket_tables(autogen_context: AutogenContext, op: CreateTicketTablesOp) -> str:
    return _call(autogen_context, "create_ticket_tables", [op.sequences], op.render_kwargs())


@renderers.dispatch_for(DropTicketTablesOp)
def render_drop_ticket_tables(autogen_context: AutogenContext, op: DropTicketTablesOp) -> str:
    return _call(autogen_context, "drop_ticket_tables", [op.sequences], op.render_kwargs())


@renderers.dispatch_for(SyncTicketSequenceOp)
def render_sync_ticket_sequence(autogen_context: AutogenContext, op: SyncTicketSequenceOp) -> str:
    # The sequence is positional here even when it is None (Flickr's table): table and column
    # follow it.
    args = [op.sequence, op.table, op.column]
    return _call(autogen_context, "sync_ticket_sequence", args, op.render_kwargs())


@renderers.dispatch_for(_NoOp)
def render_no_op(autogen_context: AutogenContext, op: _NoOp) -> list[str]:
    """Nothing: the reverse of a sync (ids issued stay issued). No line at all, so that a
    downgrade left without any other operation still gets Alembic's ``pass``."""
    return []


@renderers.dispatch_for(CreateDatacenterTablesOp)
def render_create_datacenter_tables(
    autogen_context: AutogenContext, op: CreateDatacenterTablesOp
) -> str:
    return _call(autogen_context, "create_datacenter_tables", [], op.render_kwargs())


@renderers.dispatch_for(DropDatacenterTablesOp)
def render_drop_datacenter_tables(
    autogen_context: AutogenContext, op: DropDatacenterTablesOp
) -> str:
    return _call(autogen_context, "drop_datacenter_tables", [], op.render_kwargs())


class _TypeImports:
    """A ``render_item`` hook that, for a type of the package, adds the import of the module
    Alembic names it by, then lets Alembic (or the hook it wraps) render it as usual."""

    def __init__(self, wrapped: _RenderItem | None) -> None:
        self.wrapped = wrapped

    def __call__(
        self, type_: str, obj: Any, autogen_context: AutogenContext
    ) -> str | Literal[False]:
        if self.wrapped is not None:
            rendered = self.wrapped(type_, obj, autogen_context)
            if rendered is not False:
                return rendered  # the project renders it, and imports what that needs
        if type_ == "type":
            module = type(obj).__module__
            # With user_module_prefix set, Alembic writes the project's prefix, not the module.
            if (
                module.split(".", 1)[0] == _PACKAGE
                and autogen_context.opts.get("user_module_prefix") is None
            ):
                imports = getattr(autogen_context, "imports", None)
                if imports is not None:
                    imports.add(f"import {module}")
        return False


def add_type_imports(autogen_context: AutogenContext) -> None:
    """Make the scripts this autogenerate run writes import what the package's column types
    render as (``import sqlalchemy_tickets``), by adding a ``render_item`` hook to its options.

    Alembic writes a type that is not SQLAlchemy's as ``<its module>.<repr>``, without an
    import, and ``render_item`` is the one place where a type's rendering may add one. The
    options are those of the run's ``MigrationContext``, which rendering reads after the
    comparison: a ``render_item`` the project configured keeps running first, and one it
    renders itself is left to it.
    """
    opts = autogen_context.opts
    current = opts.get("render_item")
    if isinstance(current, _TypeImports):
        return
    opts["render_item"] = _TypeImports(current)
