"""Flickr's Tickets64 and Tickets32, and a Photos sequence, on one server of an odd/even pair

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

Run once per ticket server, with that server's position::

    -x url=mysql+pymysql://root@tickets1/tickets -x offset=1   # odd ids
    -x url=mysql+pymysql://root@tickets2/tickets -x offset=2   # even ids

Flickr's tables take their stride from the server (my.cnf: ``auto-increment-increment = 2``,
``auto-increment-offset = 1`` or ``2``); the operation checks those settings against the
requested stride and refuses, before anything is created, a server that disagrees. The named
sequence Photos carries its stride in its own row.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op
from alembic.util import CommandError

import sqlalchemy_tickets.alembic  # noqa: F401 (registers op.*_ticket_table)

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _stride() -> tuple[int, int]:
    x = context.get_x_argument(as_dictionary=True)
    if "offset" not in x:
        raise CommandError(
            "which server of the pair is this? pass -x offset=1 (odd ids) or -x offset=2 "
            "(even ids); -x increment=2 is the default"
        )
    try:
        return int(x.get("increment", "2")), int(x["offset"])
    except ValueError:
        raise CommandError("-x increment= and -x offset= must be integers") from None


def upgrade() -> None:
    increment, offset = _stride()
    # Flickr's tables first: their stride check against the server runs before anything exists.
    op.create_ticket_table(increment=increment, offset=offset)  # Tickets64
    op.create_ticket_table(bits=32, increment=increment, offset=offset)  # Tickets32
    op.create_ticket_table("Photos", increment=increment, offset=offset)  # tickets__photos


def downgrade() -> None:
    op.drop_ticket_table("Photos")
    op.drop_ticket_table(bits=32)
    op.drop_ticket_table()
