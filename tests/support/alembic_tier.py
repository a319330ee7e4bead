"""A throwaway Alembic project whose one revision creates a datacenter tier's tables, for the
online and offline (``--sql``) tests of ``op.create_datacenter_tables``. Alembic runs in a
process of its own, as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support import forked

EXAMPLES = Path(__file__).resolve().parents[2] / "migrations_examples"

#: An ``env.py`` for both modes: the database from ``-x url=...``; the tier's tables are in
#: the target metadata when ``-x tier=PREFIX`` says so (for autogenerate).
ENV = '''
import sqlalchemy as sa
from alembic import context

import sqlalchemy_tickets.alembic  # noqa: F401
from sqlalchemy_tickets.sources.datacenter import datacenter_tables

x = context.get_x_argument(as_dictionary=True)
url = sa.engine.make_url(x["url"])
target_metadata = sa.MetaData()
if x.get("tier"):
    datacenter_tables(target_metadata, dialect=url.get_backend_name(), table_prefix=x["tier"])

if context.is_offline_mode():
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
'''

REVISION = '''"""the datacenter tier"""
from alembic import op

import sqlalchemy_tickets.alembic  # noqa: F401

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_datacenter_tables(table_prefix={prefix!r})


def downgrade():
    op.drop_datacenter_tables(table_prefix={prefix!r})
'''


def tier_project(root: Path, prefix: str | None = "tickets_dc") -> Path:
    """A project in ``root/project``; with ``prefix``, its revision 0001 creates that tier
    (``None``: no revision yet, for autogenerate)."""
    project = root / "project"
    (project / "versions").mkdir(parents=True)
    shutil.copy(EXAMPLES / "postgresql" / "alembic.ini", project / "alembic.ini")
    shutil.copy(EXAMPLES / "postgresql" / "script.py.mako", project / "script.py.mako")
    (project / "env.py").write_text(ENV)
    if prefix is not None:
        (project / "versions" / "0001_tier.py").write_text(REVISION.format(prefix=prefix))
    return project


def run_alembic(project: Path, *args: str, **x: str) -> subprocess.CompletedProcess[str]:
    """``alembic -c project/alembic.ini -x k=v ... args`` in a process of its own, from an
    unrelated working directory (never raises on failure: callers assert)."""
    argv = ["-c", str(project / "alembic.ini")]
    for key, value in x.items():
        argv += ["-x", f"{key}={value}"]
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning:alembic"}
    return forked.run_module("alembic", *argv, *args, cwd="/", env=env, timeout=300)
