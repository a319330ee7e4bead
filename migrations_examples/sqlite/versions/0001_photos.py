"""photos, with ids from the Photos ticket sequence

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import sqlalchemy_tickets.alembic  # noqa: F401 (registers op.*_ticket_table)

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "photos",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("title", sa.String(200), nullable=False),
    )
    # One-row table tickets__photos: Photos ids 1, 2, 3, ...
    op.create_ticket_table("Photos")


def downgrade() -> None:
    op.drop_ticket_table("Photos")
    op.drop_table("photos")
