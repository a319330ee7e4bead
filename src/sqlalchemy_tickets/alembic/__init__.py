"""Alembic support: ``op.create_ticket_table`` / ``op.drop_ticket_table`` and autogenerate.

Importing this package registers everything with Alembic. In ``env.py``::

    import sqlalchemy_tickets.alembic
    from sqlalchemy_tickets.alembic import include_object

    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=include_object,   # optional: hide ticket tables from the table diff
    )

In a migration::

    op.create_ticket_table("Photos")                        # tickets__photos, ids 1, 2, 3, ...
    op.create_ticket_table("Photos", increment=2, offset=2) # even ids: server 2 of an odd/even pair
    op.create_ticket_table(bits=32)                         # Flickr's Tickets32
    op.drop_ticket_table("Photos")

Autogenerate proposes ``op.create_ticket_table(...)`` for the ``TicketId`` columns of the target
metadata whose ids are drawn from the database being migrated (the embedded default on
PostgreSQL and MySQL/MariaDB, or a ``TicketServer`` on that very database) and whose ticket table
is missing there; columns on dedicated ticket servers get nothing (their tables are made by
``sqlalchemy-tickets init`` or an Alembic project of the ticket servers). It never proposes to
drop a ticket table (``context.configure(..., sqlalchemy_tickets_autogenerate=False)`` turns the
comparator off). Autogenerate writes ``TicketId`` columns as ``sqlalchemy_tickets.TicketId(...)``
but writes ``import sqlalchemy_tickets.alembic`` only into scripts with a ticket-table operation:
keep ``import sqlalchemy_tickets`` in the project's ``script.py.mako``.
"""

from __future__ import annotations

from . import render, toimpl  # noqa: F401  (registration side effects)
from .compare import include_object, is_ticket_table_name, ticket_tables
from .ops import (
    CreateTicketTableOp,
    CreateWorkerLeaseTableOp,
    DropTicketTableOp,
    DropWorkerLeaseTableOp,
    RestrideTicketTableOp,
    SyncTicketSequenceOp,
)

__all__ = [
    "CreateTicketTableOp",
    "CreateWorkerLeaseTableOp",
    "DropWorkerLeaseTableOp",
    "DropTicketTableOp",
    "RestrideTicketTableOp",
    "SyncTicketSequenceOp",
    "include_object",
    "is_ticket_table_name",
    "ticket_tables",
]
