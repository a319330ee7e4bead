"""photos as it was: an auto-increment (identity) key, with rows already in it

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    photos = op.create_table(
        "photos",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("title", sa.String(200), nullable=False),
    )
    # Rows written under auto-increment, before the cut-over.
    op.bulk_insert(photos, [{"title": f"legacy #{i}"} for i in range(1, 101)])


def downgrade() -> None:
    op.drop_table("photos")
