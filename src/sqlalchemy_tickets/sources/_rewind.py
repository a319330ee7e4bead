"""Rewinds: a ticket database that went back in time, and what the sources do about it.

A restore from a backup, a promoted replica that had not seen its last writes, or a sequence
that starts below ids its tables already hold would make a source issue ids again. Each layer
of the library notices what it can (see ``docs/rewinds.md``):

* every :class:`~sqlalchemy_tickets.TicketServer` keeps, per table, the highest id it issued
  or was told is in use (its *floor*): a block at or below it is a rewind;
* the table's identity (``dialects/base.py``: :class:`Identity`) is recorded in the database's
  ``tickets_stamps`` table and checked on first contact, on every new connection, and in
  each block's own statement where the backend allows it (PostgreSQL), else at an interval;
* floors kept outside the database that rewound: the other servers of a pair, the
  application tables a sequence serves, the datacenter tier's record of each upstream lane.

Where a floor is known the sequence is moved above it plus a margin (``heal``); otherwise, or
with ``on_rewind="refuse"``, :class:`~sqlalchemy_tickets.RewindError` is raised before any id.
This module holds what those layers share: the policy, the margin, the message and the
process-wide counters that metrics read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from .._commands import sync_command
from .._naming import TicketTable
from ..errors import RewindError, TicketsError

#: How far above the highest id known to be in use a healed sequence starts: room for ids
#: other processes issued that no floor recorded. Ids are cheap (a 64-bit sequence has 9.2e18).
DEFAULT_REWIND_MARGIN = 1_000_000

#: What a source does on a rewind it could heal.
RewindPolicy = Literal["heal", "refuse"]
POLICIES: tuple[RewindPolicy, ...] = ("heal", "refuse")

_lock = threading.Lock()
_counts: dict[str, int] = {}


def check_policy(on_rewind: object) -> RewindPolicy:
    """``on_rewind`` if it is ``"heal"`` or ``"refuse"``, else a :class:`TicketsError`."""
    if on_rewind == "heal":
        return "heal"
    if on_rewind == "refuse":
        return "refuse"
    raise TicketsError(f"on_rewind must be 'heal' or 'refuse', not {on_rewind!r}")


def check_margin(margin: object) -> int:
    """``margin`` if it is a non-negative int, else a :class:`TicketsError`."""
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise TicketsError(f"rewind_margin must be a non-negative number of ids, not {margin!r}")
    return margin


def counted(table: TicketTable) -> None:
    """Count one rewind of ``table``'s sequence, process-wide (metric ``tickets.rewinds``)."""
    key = f"{table.sequence or 'Tickets'}/{table.bits}"
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1


def counts() -> dict[str, int]:
    """Rewinds seen in this process, per ``name/bits``."""
    with _lock:
        return dict(_counts)


def refusal(
    server: str, url: str | None, table: TicketTable, seen: str, floors: Iterable[int]
) -> RewindError:
    """The :class:`RewindError` for a rewind of ``table`` on ``server``: what was seen, and
    the one command that fixes it."""
    known = max(floors, default=None)
    # Never a number as if it were enough: other processes may have issued above it.
    above = "the highest id ever issued (max(id) of the tables the sequence serves)" + (
        f", never less than {known} (the highest this process knows of)"
        if known is not None else ""
    )
    fix = sync_command(url or "URL", table.sequence, table.bits)
    return RewindError(
        f"{table.label} on {server} went back in time: {seen}. Nothing was issued. Move the "
        f"sequence above every id already in use with `{fix}`, N being {above}"
        + ("" if url else " and URL the database's") + "; issuing then resumes"
    )
