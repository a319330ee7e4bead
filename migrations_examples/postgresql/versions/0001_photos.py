"""photos, with ids from the Photos ticket sequence (pair-ready)

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

The Photos sequence takes its stride from ``-x increment=N -x offset=I`` (default 1 and 1: one
ticket server). For a pair of ticket databases, run the same migration on each::

    alembic -c .../postgresql/alembic.ini -x url=postgresql+psycopg://tickets1/app \\
        -x increment=2 -x offset=1 upgrade head      # odd ids
    alembic -c .../postgresql/alembic.ini -x url=postgresql+psycopg://tickets2/app \\
        -x increment=2 -x offset=2 upgrade head      # even ids
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from alembic.util import CommandError

import sqlalchemy_tickets.alembic  # noqa: F401 (registers op.*_ticket_table)

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _x_int(name: str, default: int) -> int:
    value = context.get_x_argument(as_dictionary=True).get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"-x {name}= must be an integer, not {value!r}") from None


def upgrade() -> None:
    op.create_table(
        "photos",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("title", sa.String(200), nullable=False),
    )
    # One-row table tickets__photos; the first id is the smallest id >= 1 that is
    # congruent to offset (mod increment): 1, 2, 3, ... by default.
    op.create_ticket_table("Photos", increment=_x_int("increment", 1), offset=_x_int("offset", 1))


def downgrade() -> None:
    op.drop_ticket_table("Photos")
    op.drop_table("photos")
