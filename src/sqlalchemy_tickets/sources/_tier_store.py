"""Every read and write of a datacenter tier's tables, for one sequence or many at once.

The state row of a sequence holds its counters, its shared rate, its refill claim and its
*head*: the range being handed out. The stock table holds the ranges queued behind it (given
back first, then upwards). So a take — on every cache refill of every process — moves one row
in one statement (the backend's ``tier_take``), holding its lock for that statement alone; the
rarer writes (a new head from the stock, a block stored, a claim, ranges given back) lock the
state rows they change (in key order, so that writers of several sequences never deadlock),
compute in Python, and write them back: one transaction for one sequence or a thousand.

Nothing here decides anything (that is :class:`~sqlalchemy_tickets.DatacenterTier`'s); every
method runs inside a unit of work its caller opened.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from .._naming import TierTables
from ..dialects._clock import db_now_ms
from ..dialects.base import TicketBackend

#: ``(sequence_name, bits)``: a sequence of the tier ('' for Flickr's Tickets64/Tickets32).
Key = tuple[str, int]

#: The largest id a head may hold and still be moved past in SQL: a head's first id advances
#: to just past its last, which must fit a BIGINT. The last ids of a 64-bit space stay in the
#: stock and go out through :meth:`TierStore.take_from_stock`.
_BIGINT_MAX = 2**63 - 1

#: Rows per statement where many go at once (SQLite counts bound parameters per statement).
CHUNK = 500

#: The state columns a locked write may change (the key and the take's ``last_take`` aside).
_WRITTEN = (
    "stock", "issued", "given_back", "refills", "refilled", "rate", "rate_at", "rate_count",
    "claim_owner", "claim_until", "refilled_at", "exhausted",
    "head_kind", "head_first", "head_last", "head_step",
)


@dataclass
class State:
    """A state row locked for a write: change its fields, then :meth:`TierStore.write` it."""

    name: str
    bits: int
    stock: int
    issued: int
    given_back: int
    refills: int
    refilled: int
    rate: float
    rate_at: int
    rate_count: int
    claim_owner: str
    claim_until: int
    refilled_at: int
    exhausted: int
    head_kind: int
    head_first: int
    head_last: int
    head_step: int
    #: The database's clock (Unix ms) when the row was locked.
    now: int = 0
    guard: tuple[Any, ...] = ()

    @property
    def key(self) -> Key:
        return self.name, self.bits

    @property
    def head(self) -> range:
        if self.head_first > self.head_last:
            return range(0)
        return range(self.head_first, self.head_last + self.head_step, self.head_step)

    def set_head(self, ids: range, kind: int) -> None:
        if ids:
            self.head_first, self.head_last, self.head_step = ids.start, ids[-1], ids.step
        else:
            self.head_first, self.head_last, self.head_step = 1, 0, 1
        self.head_kind = kind


@dataclass(frozen=True)
class Taken:
    """What a take handed out, and the stock as it left it."""

    block: range
    stock: int
    rate: float
    rate_at: int
    exhausted: bool
    now: int


@dataclass(frozen=True)
class Queued:
    """A range in the stock table (``kind`` 0: given back, 1: never issued)."""

    key: Key
    kind: int
    ids: range


def headable(ids: range) -> tuple[range, range]:
    """``ids`` split into what may be a head and what must stay in the stock (see
    ``_BIGINT_MAX``)."""
    if not ids or ids[-1] <= _BIGINT_MAX - ids.step:
        return ids, ids[len(ids) :]
    n = max(0, (_BIGINT_MAX - ids.step - ids.start) // ids.step + 1)
    return ids[:n], ids[n:]


@dataclass
class TierStore:
    """The SQL of one tier's tables on one backend."""

    backend: TicketBackend
    names: TierTables
    stock: sa.Table = field(init=False)
    state: sa.Table = field(init=False)
    stamps: sa.Table = field(init=False)
    #: Expressions whose values change when the tier's database is restored or fails over,
    #: read with (and checked by) the takes.
    guard_columns: list[sa.ColumnElement[Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.stock, self.state = self.backend.tier_tables(self.names)
        self.stamps = self.backend.stamp_table()
        self.guard_columns = self.backend.identity_columns(self.names.state)

    # -- keys ---------------------------------------------------------------------------------

    def _where(self, table: sa.Table, keys: Sequence[Key]) -> sa.ColumnElement[bool]:
        if len(keys) == 1:
            (name, bits), = keys
            return sa.and_(table.c.sequence_name == name, table.c.bits == bits)
        return self.backend.keys_in((table.c.sequence_name, table.c.bits), keys)

    # -- taking -------------------------------------------------------------------------------

    def take(
        self, conn: sa.Connection, key: Key, count: int, guard: tuple[Any, ...] | None
    ) -> Taken | None:
        """Up to ``count`` ids from the head, in one statement (in autocommit); ``None``: no
        row moved (see :meth:`look`)."""
        guards = self.guard_columns if guard is not None else []
        values: dict[str, Any] = {"k_name": key[0], "k_bits": key[1], "k_count": count}
        for i, value in enumerate(guard or ()):
            values[f"guard{i}"] = value
        row = self.backend.tier_take(conn, self.state, guards, values)
        if row is None:
            return None
        first, taken, step = int(row.first), int(row.taken), int(row.step)
        return Taken(
            block=range(first, first + taken * step, step),
            stock=int(row.stock),
            rate=float(row.rate),
            rate_at=int(row.rate_at),
            exhausted=bool(row.exhausted),
            now=int(row.now_ms),
        )

    def look(self, conn: sa.Connection, key: Key) -> Any:
        """The guards, head and stock of a sequence by a plain read (``None``: no state row)."""
        c = self.state.c
        return conn.execute(
            sa.select(
                *(g.label(f"guard{i}") for i, g in enumerate(self.guard_columns)),
                c.head_first, c.head_last, c.stock, c.exhausted,
            ).where(self._where(self.state, [key]))
        ).one_or_none()

    def read_guard(self, conn: sa.Connection) -> tuple[Any, ...]:
        """What the guard columns read now (nothing where the backend has none)."""
        columns = self.guard_columns
        return tuple(conn.execute(sa.select(*columns)).one()) if columns else ()

    def guard_of(self, row: Any) -> tuple[Any, ...]:
        return tuple(getattr(row, f"guard{i}") for i in range(len(self.guard_columns)))

    # -- locked rows --------------------------------------------------------------------------

    def lock(self, conn: sa.Connection, keys: Iterable[Key]) -> dict[Key, State]:
        """The state rows of ``keys`` (those that exist), locked until the end of the unit."""
        wanted = sorted(set(keys))
        found: dict[Key, State] = {}
        c = self.state.c
        for start in range(0, len(wanted), CHUNK):
            part = wanted[start : start + CHUNK]
            rows = conn.execute(
                sa.select(
                    c.sequence_name, c.bits, *(c[name] for name in _WRITTEN),
                    db_now_ms().label("now_ms"),
                    *(g.label(f"guard{i}") for i, g in enumerate(self.guard_columns)),
                )
                .where(self._where(self.state, part))
                .order_by(c.sequence_name, c.bits)
                .with_for_update()
            ).all()
            for row in rows:
                values: dict[str, Any] = {name: int(getattr(row, name)) for name in _WRITTEN
                                          if name not in ("rate", "claim_owner")}
                state = State(
                    name=row.sequence_name, bits=int(row.bits), rate=float(row.rate),
                    claim_owner=str(row.claim_owner), **values,
                    now=int(row.now_ms), guard=self.guard_of(row),
                )
                found[state.key] = state
        return found

    def write(self, conn: sa.Connection, states: Iterable[State]) -> None:
        """Write locked rows back (every column they may have changed)."""
        rows = [{"sequence_name": s.name, "bits": s.bits,
                 **{name: getattr(s, name) for name in _WRITTEN}} for s in states]
        for start in range(0, len(rows), CHUNK):
            self.backend.update_rows(conn, self.state, ("sequence_name", "bits"),
                                     rows[start : start + CHUNK])

    def seed(self, conn: sa.Connection, keys: Iterable[Key]) -> None:
        """State rows for ``keys`` where there are none (idempotent)."""
        rows = [{"k_name": name, "k_bits": bits} for name, bits in sorted(set(keys))]
        if not rows:
            return
        stmt = self.backend.insert_seed(self.state, {
            "sequence_name": sa.bindparam("k_name", type_=self.state.c.sequence_name.type),
            "bits": sa.bindparam("k_bits", type_=sa.SmallInteger),
        })
        for start in range(0, len(rows), CHUNK):
            conn.execute(stmt, rows[start : start + CHUNK])

    def release(self, conn: sa.Connection, owner: str, keys: Iterable[Key]) -> None:
        """Release ``owner``'s refill claims of ``keys`` (where it still holds them)."""
        c = self.state.c
        wanted = sorted(set(keys))
        for start in range(0, len(wanted), CHUNK):
            # Locked first in key order, as every writer of several rows locks them (two
            # writers locking in different orders would wait for each other), then changed
            # by key (a statement matching them as a list would lock the gaps between them
            # on InnoDB, rows of other writers included).
            held = [(row.sequence_name, int(row.bits)) for row in conn.execute(
                sa.select(c.sequence_name, c.bits)
                .where(self._where(self.state, wanted[start : start + CHUNK]),
                       c.claim_owner == owner)
                .order_by(c.sequence_name, c.bits)
                .with_for_update()
            )]
            self.backend.update_rows(conn, self.state, ("sequence_name", "bits"), [
                {"sequence_name": name, "bits": bits, "claim_owner": "", "claim_until": 0}
                for name, bits in held])

    def mark_exhausted(self, conn: sa.Connection, key: Key) -> None:
        """Record that upstream has no ids left for ``key``."""
        conn.execute(sa.update(self.state).where(self._where(self.state, [key]))
                     .values(exhausted=1))

    # -- the stock table ----------------------------------------------------------------------

    def queued(
        self, conn: sa.Connection, keys: Sequence[Key], *, upto: int | None = None
    ) -> dict[Key, list[Queued]]:
        """The ranges in stock of ``keys`` (their state rows locked first), in the order they
        go out; with ``upto``, only those starting at or below it."""
        s = self.stock.c
        found: dict[Key, list[Queued]] = {key: [] for key in keys}
        wanted = sorted(set(keys))
        for start in range(0, len(wanted), CHUNK):
            query = sa.select(s.sequence_name, s.bits, s.kind, s.first_id, s.last_id, s.step).where(
                self._where(self.stock, wanted[start : start + CHUNK])
            )
            if upto is not None:
                query = query.where(s.first_id <= upto)
            for r in conn.execute(query.order_by(s.sequence_name, s.bits, s.kind, s.first_id)):
                key = (r.sequence_name, int(r.bits))
                ids = range(int(r.first_id), int(r.last_id) + int(r.step), int(r.step))
                found.setdefault(key, []).append(Queued(key, int(r.kind), ids))
        return found

    def first_queued(self, conn: sa.Connection, key: Key) -> Queued | None:
        """The range that goes out next from the stock table (state row locked first)."""
        s = self.stock.c
        r = conn.execute(
            sa.select(s.kind, s.first_id, s.last_id, s.step)
            .where(self._where(self.stock, [key]))
            .order_by(s.kind, s.first_id)
            .limit(1)
        ).one_or_none()
        if r is None:
            return None
        return Queued(key, int(r.kind), range(int(r.first_id), int(r.last_id) + int(r.step),
                                              int(r.step)))

    def add(self, conn: sa.Connection, ranges: Iterable[Queued]) -> None:
        rows = [
            {"sequence_name": q.key[0], "bits": q.key[1], "kind": q.kind,
             "first_id": q.ids.start, "last_id": q.ids[-1], "step": q.ids.step}
            for q in ranges if q.ids
        ]  # plain column names: an INSERT with no explicit VALUES binds them itself
        for start in range(0, len(rows), CHUNK):
            conn.execute(sa.insert(self.stock), rows[start : start + CHUNK])

    def remove(self, conn: sa.Connection, ranges: Iterable[Queued]) -> None:
        """Delete stock rows (by their key: sequence, bits, kind, first id)."""
        rows = [(q.key[0], q.key[1], q.kind, q.ids.start) for q in ranges]
        for start in range(0, len(rows), CHUNK):
            self.backend.delete_rows(conn, self.stock, ("sequence_name", "bits", "kind",
                                                        "first_id"), rows[start : start + CHUNK])

    def discard_everything(self, conn: sa.Connection) -> int:
        """Every range in stock and every head, of every sequence, gone; how many ids went.
        (Every state row is locked first: every writer waits.)"""
        s = self.state.c
        conn.execute(sa.select(s.stock).order_by(s.sequence_name, s.bits).with_for_update()).all()
        dropped = int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(s.stock), 0)))
                      .scalar_one())
        conn.execute(sa.delete(self.stock))
        conn.execute(sa.update(self.state).values(stock=0, head_first=1, head_last=0))
        return dropped

    # -- upstream marks -----------------------------------------------------------------------

    def marks(self, conn: sa.Connection, names: Iterable[str], *, lock: bool) -> dict[str, Any]:
        """The stamp rows ``names`` (``last_id``, ``stamp``), locked if asked."""
        t = self.stamps.c
        wanted = sorted(set(names))
        found: dict[str, Any] = {}
        for start in range(0, len(wanted), CHUNK):
            query = sa.select(t.name, t.last_id, t.stamp).where(
                t.name.in_(wanted[start : start + CHUNK])
            ).order_by(t.name)
            if lock:
                query = query.with_for_update()
            for row in conn.execute(query):
                found[row.name] = row
        return found

    def marks_starting(self, conn: sa.Connection, prefixes: Iterable[str]) -> list[Any]:
        t = self.stamps.c
        rows: list[Any] = []
        for prefix in sorted(set(prefixes)):
            rows += conn.execute(
                sa.select(t.name, t.last_id).where(t.name.startswith(prefix, autoescape=True))
            ).all()
        return rows

    def seed_marks(self, conn: sa.Connection, names: Iterable[str]) -> None:
        """Mark rows for ``names`` where there are none (``last_id`` NULL: no id stored yet)."""
        t = self.stamps.c
        rows = [{"k_name": name} for name in sorted(set(names))]
        if rows:
            conn.execute(self.backend.insert_seed(self.stamps, {
                "name": sa.bindparam("k_name", type_=t.name.type)}), rows)

    def write_marks(self, conn: sa.Connection, marks: Mapping[str, tuple[int, str]],
                    existing: Iterable[str]) -> None:
        """Record ``name -> (last_id, stamp)``; rows not in ``existing`` are made first."""
        t = self.stamps.c
        known = set(existing)
        new = [name for name in marks if name not in known]
        if new:
            seed = self.backend.insert_seed(self.stamps, {
                "name": sa.bindparam("k_name", type_=t.name.type),
                "last_id": sa.bindparam("v_last", type_=sa.BigInteger),
            })
            conn.execute(seed, [{"k_name": name, "v_last": marks[name][0]} for name in new])
        rows = [{"name": name, "last_id": last, "stamp": stamp}
                for name, (last, stamp) in marks.items()]
        for start in range(0, len(rows), CHUNK):
            self.backend.update_rows(conn, self.stamps, ("name",), rows[start : start + CHUNK])
