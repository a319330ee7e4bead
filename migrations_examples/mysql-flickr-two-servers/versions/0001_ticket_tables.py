"""Flickr's Tickets64 and Tickets32, and a Photos sequence, on one server of an odd/even pair

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

Run once per ticket server, with only its URL::

    -x url=mysql+pymysql://root@tickets1/tickets   # odd ids  (my.cnf: offset 1)
    -x url=mysql+pymysql://root@tickets2/tickets   # even ids (my.cnf: offset 2)

Each server already says which one it is: Flickr's my.cnf sets ``auto-increment-increment = 2``
and ``auto-increment-offset = 1`` or ``2``, and this revision reads them
(``@@auto_increment_increment``, ``@@auto_increment_offset``: the values this connection's
auto-increments use). ``-x offset=N`` (and ``-x increment=N``) override them; Flickr's tables
still take their stride from the server, so an override that disagrees is refused before
anything is created. The named sequence Photos carries its stride in its own row. ``--sql``
has no server to ask: there, ``-x offset`` is required.
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
    """``(increment, offset)``: from ``-x``, else from the server's own settings."""
    x = context.get_x_argument(as_dictionary=True)
    try:
        given = {key: int(x[key]) for key in ("increment", "offset") if key in x}
    except ValueError:
        raise CommandError("-x increment= and -x offset= must be integers") from None
    if "offset" in given:
        return given.get("increment", 2), given["offset"]
    if context.is_offline_mode():
        raise CommandError(
            "--sql has no server to ask which of the pair it is: pass -x offset=1 (odd ids) "
            "or -x offset=2 (even ids); -x increment=2 is the default"
        )
    increment, offset = op.get_bind().exec_driver_sql(
        "SELECT @@auto_increment_increment, @@auto_increment_offset"
    ).one()
    increment = given.get("increment", int(increment))
    if increment < 2:
        raise CommandError(
            f"this server has auto_increment_increment={increment}: it is not one of a pair. "
            "Set auto-increment-increment = 2 and auto-increment-offset = 1 or 2 in its my.cnf "
            "(Flickr's setup), or pass -x offset=1 / -x offset=2"
        )
    return increment, int(offset)


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
