"""Alembic environment for one ticket server of a Flickr-style odd/even pair.

The same project runs once per server, with only that server's URL: the revision reads which
server it is from the server's own ``auto_increment_increment``/``auto_increment_offset``
(Flickr's my.cnf). ``-x offset=N`` / ``-x increment=N`` override them (and ``--sql``, with no
server to ask, needs ``-x offset``)::

    alembic -c migrations_examples/mysql-flickr-two-servers/alembic.ini \
        -x url=mysql+pymysql://root@tickets1/tickets upgrade head
    alembic -c migrations_examples/mysql-flickr-two-servers/alembic.ini \
        -x url=mysql+pymysql://root@tickets2/tickets upgrade head
"""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from alembic.util import CommandError

import sqlalchemy_tickets.alembic  # noqa: F401  (registers op.create_ticket_table & autogenerate)
from sqlalchemy_tickets.alembic import include_object

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# A ticket server holds ticket tables only: no application tables. (include_object and the
# sqlalchemy-tickets comparator keep autogenerate from proposing to drop the ticket tables.)
target_metadata = sa.MetaData()


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise CommandError(
            "no database given: pass it with -x, e.g. "
            f"alembic -c {config.config_file_name} "
            "-x url=mysql+pymysql://root@tickets1/tickets upgrade head"
        )
    return url


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


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
