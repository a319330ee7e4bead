"""Alembic environment for the SQLite example: the database comes from ``-x url=...``.

alembic -c migrations_examples/sqlite/alembic.ini -x url=sqlite:///app.db upgrade head
alembic -c migrations_examples/sqlite/alembic.ini -x url=sqlite:///app.db upgrade head --sql
"""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from alembic.util import CommandError

import sqlalchemy_tickets.alembic  # noqa: F401  (registers op.create_ticket_table & autogenerate)
from sqlalchemy_tickets import TicketId, TicketServer
from sqlalchemy_tickets.alembic import include_object

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)



def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise CommandError(
            "no database given: pass it with -x, e.g. "
            f"alembic -c {config.config_file_name} -x url=sqlite:///app.db upgrade head"
        )
    return url


# The application's models (normally imported from the application: `from app.models import Base`).
# This application keeps its ticket tables in its own file, made by its migrations, so its ids
# come from a TicketServer on that file (an application would rather say so once, with
# `configure("sqlite:///app.db")`). With the embedded default instead, the tickets would live in
# a sibling file, app.db-tickets, made on first use, and autogenerate would propose no ticket
# table: a migration creates only the ticket tables of the database it migrates.
tickets = TicketServer(database_url(), create_missing=False)
target_metadata = sa.MetaData()
sa.Table(
    "photos",
    target_metadata,
    sa.Column("id", TicketId("Photos", source=tickets), primary_key=True),
    sa.Column("title", sa.String(200), nullable=False),
)


def run_migrations_offline() -> None:
    """``--sql``: print the migration's SQL instead of running it."""
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        include_object=include_object,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sa.create_engine(database_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                include_object=include_object,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


try:
    if context.is_offline_mode():
        run_migrations_offline()
    else:
        run_migrations_online()
finally:
    tickets.close()
