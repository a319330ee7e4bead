"""Alembic support: ``op.create_ticket_table`` / ``op.drop_ticket_table`` (and
``op.create_ticket_tables`` / ``op.drop_ticket_tables`` for many sequences at once),
``op.create_datacenter_tables`` / ``op.drop_datacenter_tables``, and autogenerate.

With Alembic >= 1.18 everything is registered by the package's plugin, which Alembic loads
through the ``alembic.plugins`` entry point (:mod:`sqlalchemy_tickets.alembic.plugin`): a project
made by ``alembic init`` needs no edit. On older Alembic, importing this package registers the
same things. In ``env.py``::

    import sqlalchemy_tickets.alembic  # Alembic < 1.18
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
    op.create_ticket_tables(["Orders", "Invoices"])         # many sequences, one stride
    op.drop_ticket_tables(["Orders", "Invoices"])
    op.sync_ticket_sequence("Photos", "photos", "id")       # above max(photos.id): a cut-over
    op.create_datacenter_tables()                           # tickets_dc__stock, __state
    op.drop_datacenter_tables(table_prefix="tickets_eu")

Autogenerate proposes ``op.create_ticket_table(...)`` for the ``TicketId`` columns of the target
metadata whose ids are drawn from the database being migrated (the embedded default on
PostgreSQL and MySQL/MariaDB, or a ``TicketServer`` on that very database) and whose ticket table
is missing there; columns on dedicated ticket servers get nothing (their tables are made by
``sqlalchemy-tickets init`` or an Alembic project of the ticket servers). The library's own
tables (ticket tables, the stamp table, a tier's, the lease table) are left out of the
comparison unless the models declare them: never proposed for dropping, never logged
(``context.configure(..., sqlalchemy_tickets_autogenerate=False)`` turns all of it off). A table
that exists already and whose integer key now draws from a ticket table proposed this way also
gets ``op.sync_ticket_sequence(...)``, which starts the sequence above its rows (on a SQLite
file drawing from the embedded default: ``embedded=True``, in the ``-tickets`` sibling).
Dropping a database's last ticket table or tier drops the stamp table too
(:mod:`sqlalchemy_tickets._schema`). Autogenerate writes the package's column types as
``sqlalchemy_tickets.TicketId(...)`` and the like, and the script's ``import sqlalchemy_tickets``
with them; scripts with one of the operations also get ``import sqlalchemy_tickets.alembic``.
A datacenter tier's tables in the target metadata
(:func:`~sqlalchemy_tickets.sources.datacenter.datacenter_tables`) and missing from the
database are proposed as one ``op.create_datacenter_tables(...)``; a tier's tables are never
proposed for dropping.
"""

from __future__ import annotations

# Alembic first: from 1.18 on, importing it loads the package's plugin (this package's
# `plugin` module), before anything below is half imported.
import alembic  # noqa: F401

from . import plugin, render, toimpl  # noqa: F401  (registration side effects)
from .compare import include_object, is_ticket_table_name, ticket_tables
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
)

plugin.register()

__all__ = [
    "CreateDatacenterTablesOp",
    "CreateTicketTableOp",
    "CreateTicketTablesOp",
    "CreateWorkerLeaseTableOp",
    "DropDatacenterTablesOp",
    "DropWorkerLeaseTableOp",
    "DropTicketTableOp",
    "DropTicketTablesOp",
    "RestrideTicketTableOp",
    "SyncTicketSequenceOp",
    "include_object",
    "is_ticket_table_name",
    "ticket_tables",
]
