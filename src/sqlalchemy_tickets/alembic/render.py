"""How autogenerate writes the ticket-table operations into a migration script.

``op.create_ticket_table('photos')``, ``op.create_ticket_table(bits=32)``,
``op.drop_ticket_table('photos')``, ``op.create_datacenter_tables()`` — arguments at their
defaults are left out. The script also gets ``import sqlalchemy_tickets.alembic``, which
registers the operations when it runs.
"""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import renderers
from alembic.autogenerate.api import AutogenContext

from .ops import (
    CreateDatacenterTablesOp,
    CreateTicketTableOp,
    DropDatacenterTablesOp,
    DropTicketTableOp,
)

#: One line for every operation of the library, so a script with several gets it once.
IMPORT_LINE = "import sqlalchemy_tickets.alembic  # noqa: F401 (registers its op.* operations)"


def _call(
    autogen_context: AutogenContext,
    name: str,
    sequence: str | None,
    kwargs: dict[str, Any],
) -> str:
    imports = getattr(autogen_context, "imports", None)
    if imports is not None:
        imports.add(IMPORT_LINE)
    args = [] if sequence is None else [repr(sequence)]
    args.extend(f"{key}={value!r}" for key, value in kwargs.items())
    return f"op.{name}({', '.join(args)})"


@renderers.dispatch_for(CreateTicketTableOp)
def render_create_ticket_table(autogen_context: AutogenContext, op: CreateTicketTableOp) -> str:
    return _call(autogen_context, "create_ticket_table", op.sequence, op.render_kwargs())


@renderers.dispatch_for(DropTicketTableOp)
def render_drop_ticket_table(autogen_context: AutogenContext, op: DropTicketTableOp) -> str:
    return _call(autogen_context, "drop_ticket_table", op.sequence, op.render_kwargs())


@renderers.dispatch_for(CreateDatacenterTablesOp)
def render_create_datacenter_tables(
    autogen_context: AutogenContext, op: CreateDatacenterTablesOp
) -> str:
    return _call(autogen_context, "create_datacenter_tables", None, op.render_kwargs())


@renderers.dispatch_for(DropDatacenterTablesOp)
def render_drop_datacenter_tables(
    autogen_context: AutogenContext, op: DropDatacenterTablesOp
) -> str:
    return _call(autogen_context, "drop_datacenter_tables", None, op.render_kwargs())
