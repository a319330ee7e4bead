"""A ticket server's first contact with a sequence: its table found (or made, where allowed),
its stride checked against the server's position, its identity compared with the one recorded
(or recorded) — for one sequence, or for thousands in a few round trips."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sqlalchemy import exc as sa_exc

from .._naming import TicketTable, check_bits, ticket_table
from ..dialects.base import Identity, TableInfo, TableSpec
from ..errors import (
    StrideMismatchError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from ._server_guard import IdentityGuard, Known, leased
from ._ticket_ddl import TableMaker

logger = logging.getLogger("sqlalchemy_tickets")

#: The offset a restride gives a table while it pauses it: no position has it.
PAUSED_OFFSET = 0


class FirstContact:
    """First contact with the sequences of one ticket database.

    Args:
        guard: the identity checks (and through it, the database and its stamps).
        maker: where missing tables are made.
        stride: the ``(increment, offset)`` the server's position needs (``None``: any).
        create_missing: whether missing tables are made.
        template: how a sequence becomes a table name.
        starts: where each of some new tables must start (above what the other servers of a
            pair issued and what this process knows in use), ``table -> first id``.
    """

    def __init__(
        self,
        guard: IdentityGuard,
        maker: TableMaker,
        *,
        stride: tuple[int, int] | None,
        create_missing: bool,
        template: Callable[[], str],
        starts: Callable[[list[TicketTable]], dict[TicketTable, int]],
    ) -> None:
        self.guard = guard
        self.db = guard.db
        self.maker = maker
        self.stride = stride
        self.create_missing = create_missing
        self._template = template
        self._starts = starts

    def __repr__(self) -> str:
        return repr(self.db)

    def one(self, sequence: str | None, bits: int) -> Known:
        """Validate the name, read (or create) the table's stride, refuse one that disagrees,
        check its identity."""
        table = ticket_table(sequence, check_bits(bits), self._template())
        try:
            info = self.db.describe(table)
        except UnknownSequenceError:
            if not self.create_missing:
                raise
            self.create([table], reseed=True)
            info = self.db.describe(table)
        if info is None and not table.flickr and self.create_missing:
            # A named table without its row: a creator that seeds outside the creation lock
            # (or an emptied table). Seeding is idempotent; whoever seeds first wins.
            self.create([table], reseed=True)
            info = self.db.describe(table)
        if info is None:
            # Flickr's table with no row yet; its stride comes from the server.
            info = TableInfo(*(self.stride or (1, 1)), None)
        self.check_stride(table, info)
        known = Known(table, info)
        # Before the table is known to the server: a rewind with no floor to heal above
        # raises, and the next call checks again (after an operator's sync, it passes).
        self.guard.check(known)
        return known

    def many(
        self, items: Sequence[tuple[str | None, TicketTable]], bits: int
    ) -> tuple[list[tuple[str | None, Known]], TicketsError | None]:
        """First contact with many sequences in a few round trips: the known tables, and the
        first error a sequence met (the others are ready). A sequence that needs more than the
        common path (no row yet, an identity changed since recorded) goes through :meth:`one`."""
        tables = [table for _, table in items]
        lives = self.db.identities(tables)
        missing = [t for t in tables if lives.get(t) is None]
        if missing:
            if not self.create_missing:
                raise UnknownSequenceError(
                    f"no ticket table {missing[0].name} for sequence {missing[0].label} on "
                    f"{self} (and {len(missing) - 1} more); create them with "
                    "`sqlalchemy-tickets init` or op.create_ticket_tables()"
                )
            self.create(missing)
            lives.update(self.db.identities(missing))
        present = [t for t in tables if lives.get(t) is not None]
        infos = self.db.describe_many(present)
        stamps = self.guard.stamps
        recorded = stamps.read_many(present) if present else {}
        new: dict[TicketTable, tuple[Identity, int | None]] = {}
        first_error: TicketsError | None = None
        alone: list[str | None] = []
        ready: list[tuple[str | None, Known]] = []
        now = time.monotonic()
        for sequence, table in items:
            live, info = lives.get(table), infos.get(table)
            if live is None or (info is None and not table.flickr):
                alone.append(sequence)  # went away, or no row yet: the long way
                continue
            if info is None:
                info = TableInfo(*(self.stride or (1, 1)), None)  # Flickr's, no row yet
            try:
                self.check_stride(table, info)
            except TicketsError as error:
                first_error = first_error or error
                continue
            stored = recorded.get(table.name)
            if stored is not None and (
                not live.same(stored) or self.guard.to_follow(live, stored)
            ):
                alone.append(sequence)  # changed since recorded: a rewind (or more) to judge
                continue
            if stored is None and stamps.kept:
                new[table] = (leased(live), info.last_id)
            ready.append((sequence, Known(table, info, live, now)))
            self.guard.seen(live)
        try:
            stamps.record_many(new)
        except sa_exc.IntegrityError:
            pass  # recorded concurrently: the next check reads it
        epoch = self.db.own.connections
        for _, known in ready:
            known.epoch = epoch
        for sequence in alone:
            try:
                ready.append((sequence, self.one(sequence, bits)))
            except TicketsError as error:
                first_error = first_error or error
        return ready, first_error

    def create(self, tables: list[TicketTable], *, reseed: bool = False) -> None:
        """Create tables found missing on first contact, each above what the other servers
        issued and above ids known in use (a table's largest key told before its first
        block): a new table starts past them, no rewind. ``reseed``: seed those that exist
        too (found without their row)."""
        starts = self._starts(tables)
        increment, offset = self.stride or (1, 1)
        specs = [
            TableSpec(t, min(max(1, starts.get(t, 1)), t.max_id), increment, offset,
                      self.maker.storage_engine)
            for t in tables
        ]
        self.maker.create(specs, reseed=reseed)

    def check_stride(self, table: TicketTable, info: TableInfo) -> None:
        """Refuse a table paused by a restride, or whose stride disagrees with the server's
        position."""
        self.check_paused(table, info)
        if self.stride is not None and (info.increment, info.offset) != self.stride:
            increment, offset = self.stride
            raise StrideMismatchError(
                f"{self} has increment={info.increment}, offset={info.offset} for "
                f"{table.label}, but its position needs increment={increment}, "
                f"offset={offset}; fix the server (or the order of the servers) before "
                "issuing ids, or ids would be duplicated"
            )

    def check_paused(self, table: TicketTable, info: TableInfo) -> None:
        if info.offset == PAUSED_OFFSET:
            raise TicketServerUnavailable(
                f"{table.label} on {self} is paused while its servers are restrided; "
                "it issues ids again when the restride completes"
            )
