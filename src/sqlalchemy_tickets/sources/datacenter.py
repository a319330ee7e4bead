"""HubSpot's datacenter tier: a stock of ids in a database of the datacenter, shared by every
process on every host that names that database, refilled from the global tier in the background.

Two tables (names from :func:`~sqlalchemy_tickets._naming.tier_tables`, ``tickets_dc__stock`` and
``tickets_dc__state`` by default; the Core tables come from ``TicketBackend.tier_tables``)::

    tickets_dc__stock: one row per range of ids in stock
        sequence_name  VARCHAR(40)  ┐ the sequence ('' for Flickr's Tickets64/Tickets32)
        bits           SMALLINT     │ 32 or 64
        kind           SMALLINT     │ 0: given back, 1: never issued
        first_id       BIGINT       ┘ primary key, in the order ids go out: given back first
        last_id        BIGINT         the range's last id (inclusive)
        step           INTEGER        its stride (the upstream's: 2 for an odd/even pair)

    tickets_dc__state: one row per (sequence_name, bits)
        stock          BIGINT   ids in stock (the sum over the stock rows, kept beside them)
        issued         BIGINT   ids taken, by every process, ever
        given_back     BIGINT   ids given back, ever
        refills        BIGINT   blocks brought from upstream; refilled: their ids
        rate           DOUBLE   ids per second taken by every process together (EWMA)
        rate_at        BIGINT   database clock (Unix ms) of the rate's last sample
        rate_count     BIGINT   ``issued`` at that sample
        claim_owner    VARCHAR  host:pid:token of the process refilling ('' when none)
        claim_until    BIGINT   database clock (Unix ms) after which the claim is void
        refilled_at    BIGINT   database clock of the last block stored
        exhausted      SMALLINT 1 once upstream said the sequence has no ids left

**Taking ids** (:meth:`DatacenterTier.next_block`) is one short transaction: lock the state row,
read the first stock row (ranges given back first, then upwards), shorten or delete it, update the
state row (stock, issued, rate). The state row's lock orders every writer of a sequence — takers,
refillers, givers-back — so a range is never handed out twice, and a process killed mid-take
either committed (those ids are its, burned) or changed nothing. Upstream is never called there.

**Refilling** runs in a background thread per sequence, when a take leaves the stock under the
low-water mark (half the target). The refiller first *claims* the refill in the state row — only
if the stock is still low and no live claim exists — so one process at a time refills a sequence,
whatever the number of processes and hosts. It then asks ``upstream.next_block`` for blocks (asking
again after a short one), stores each as a stock row in its own transaction, renewing the claim,
and releases the claim. A claim is void after ``claim_timeout`` seconds without renewal, so a
refiller that dies or stalls blocks nobody for longer. A refiller killed with a block in transit
burns that block and nothing else: stored blocks are durable, and ids are unique at the source.

**Sizing**: the stock aims at ``supply`` seconds of ids at the rate all processes take them,
within ``min_block`` and the ``waste_budget``. The rate is kept in the state row, so every process
sizes from the same figure; it rises at once with a spike and forgets it over ``window`` seconds
(as :class:`~sqlalchemy_tickets.CachedSource`'s): ids in stock are durable, so stocking for a
spike costs id space, not ids lost on a restart.

**Rewinds.** Two databases can go back in time under a tier (``docs/rewinds.md``):

* *upstream* (a global ticket server restored from a backup, or a replica promoted that missed
  writes) offers ids the tier already stored. The tier records, per upstream lane (the stride
  and residue of the blocks: one lane per server of an odd/even pair), the highest id it ever
  stored, in ``tickets_stamps`` of its own database, beside the store in one transaction; a
  block at or below it is refused (burned), upstream is told to move above it
  (``ensure_above``) and the refill asks again.
* *its own database* (restored, or a lagging replica promoted) brings back ranges already
  issued. Its identity (``Identity``) is recorded in ``tickets_stamps``, checked in every take
  (the expressions of ``identity_columns`` read with the state row), on each new connection and
  at ``identity_interval``; when it changed, the first process to see it discards the whole stock
  (a compare-and-set on the recorded identity, so it happens once) and refills from upstream,
  which never rewound. Nobody needs to act.

**Which clock.** Everything shared — the rate's samples and the claims' expiry — uses the database
server's clock, read in the same statements: the one clock every process on every host agrees
on, whatever their own clocks say. Local monotonic clocks only bound local waits (``timeout``,
back-off).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from .. import _process
from .._naming import (
    DEFAULT_TIER_PREFIX,
    TicketTable,
    TierTables,
    check_bits,
    check_seconds,
    max_id,
    normalize_sequence,
    tier_tables,
)
from ..dialects._connect import Bind, OwnEngine
from ..dialects.base import Identity, TicketBackend
from ..errors import (
    DatabaseUnavailable,
    ExhaustedError,
    RewindError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from . import _rewind
from ._rewind import RewindPolicy
from .base import KeepsAbove, TicketSource, above, check_count, ensure_above_in
from .lease import db_now_ms
from .server import _sync_bind

__all__ = [
    "DatacenterTier",
    "TierStatus",
    "create_datacenter_tables",
    "datacenter_table_statements",
    "datacenter_tables",
    "describe_datacenter",
    "drop_datacenter_table_statements",
]

logger = logging.getLogger("sqlalchemy_tickets")

#: Shortest interval between two samples of the shared rate (database clock, ms).
RATE_INTERVAL_MS = 1000

#: The most ids in stock by default (and never more than 0.1 % of the id space).
DEFAULT_WASTE_BUDGET = 10_000_000

#: How often a caller waiting on an empty stock looks again for ids another process stored.
_POLL = 0.05

#: Times a block taken from upstream is offered to the database before it counts as burned.
_STORE_ATTEMPTS = 3


def _name(sequence: str | None) -> str:
    """The ``sequence_name`` column's value: Flickr's tables (``None``) are ``''``."""
    return "" if sequence is None else sequence


def _sequence(name: str) -> str | None:
    return None if name == "" else name


def _missing(backend: TicketBackend, error: sa_exc.DBAPIError) -> bool:
    return error.orig is not None and backend.is_missing_table(error.orig)


class _MissingTables(Exception):
    """The tier's tables are not there (raised inside a unit, handled by its caller)."""


class _NoState(Exception):
    """The sequence has no state row yet."""


class _Moved(Exception):
    """The tier's database is not the one this process last saw (restored, failed over)."""


class _UpstreamRewound(Exception):
    """Upstream offered ids at or below the highest the tier stored from that lane."""

    def __init__(self, high: int) -> None:
        super().__init__(high)
        self.high = high


# -- tables ------------------------------------------------------------------------------------


def datacenter_tables(
    metadata: sa.MetaData | None = None,
    *,
    dialect: str = "postgresql",
    table_prefix: str = DEFAULT_TIER_PREFIX,
) -> tuple[sa.Table, sa.Table]:
    """The Core ``(stock, state)`` tables of a datacenter tier on ``dialect``'s backend (added
    to ``metadata`` if given), e.g. for Alembic's ``target_metadata``."""
    backend = _backend(dialect)
    return backend.tier_tables(tier_tables(table_prefix), metadata)


def datacenter_table_statements(
    *, dialect: str = "postgresql", table_prefix: str = DEFAULT_TIER_PREFIX
) -> list[sa.sql.Executable]:
    """DDL creating a datacenter tier's tables; safe to run when they exist."""
    return _backend(dialect).tier_statements(tier_tables(table_prefix))


def drop_datacenter_table_statements(
    *, dialect: str = "postgresql", table_prefix: str = DEFAULT_TIER_PREFIX
) -> list[sa.sql.Executable]:
    """DDL dropping a datacenter tier's tables (and the ids in stock with them)."""
    return _backend(dialect).drop_tier_statements(tier_tables(table_prefix))


def _backend(dialect: str) -> TicketBackend:
    from ..dialects import backend_for

    return backend_for(dialect)


def create_datacenter_tables(
    bind: Bind, *, table_prefix: str = DEFAULT_TIER_PREFIX, timeout: float = 5.0
) -> None:
    """Create a datacenter tier's tables in ``bind``'s database if they are not there.

    Safe to run from several processes at once (creators wait for each other, bounded by
    ``timeout`` seconds), and beside running tiers.
    """
    names = tier_tables(table_prefix)
    own = OwnEngine(_sync_bind(bind), timeout=timeout, pool_size=1, what="datacenter tier")
    try:
        _create(own, names)
    finally:
        own.dispose()


def _create(own: OwnEngine, names: TierTables) -> None:
    from ..dialects._connect import create_under_lock

    # The creation lock is keyed by a table name: the state table's stands for both.
    lock = TicketTable(None, 64, names.state)
    create_under_lock(own, [lock], lambda conn: own.backend.tier_statements(names))
    logger.info("datacenter tier tables %s, %s ready on %s", names.stock, names.state,
                own.url.render_as_string())


def _share_an_id(a: range, b: range) -> bool:
    """Whether two increasing ranges have an id in common (strides are small: a ticket server
    pair's N)."""
    low, high = max(a.start, b.start), min(a[-1], b[-1])
    if low > high:
        return False
    first = a.start + -(-(low - a.start) // a.step) * a.step  # a's first id >= low
    period = a.step * b.step // math.gcd(a.step, b.step)
    return any(x in b for x in range(first, min(high, first + period - 1) + 1, a.step))


# -- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierStatus:
    """One sequence of a datacenter tier, as :func:`describe_datacenter` reads it."""

    sequence: str | None
    bits: int
    #: Ids in stock, and how many of them were given back.
    stock: int
    given_back_in_stock: int
    #: Rows (ranges) in stock.
    ranges: int
    #: Ids taken, ever, by every process.
    issued: int
    given_back: int
    refills: int
    refilled: int
    #: Ids per second taken by every process together (EWMA), and how old its last sample is.
    rate: float
    rate_age: float | None
    #: Seconds the stock lasts at that rate with upstream down (``None``: no rate yet).
    runway: float | None
    #: Who is refilling, and in how many seconds the claim is void (negative: already void).
    claim_owner: str | None
    claim_expires_in: float | None
    #: Seconds since a block was last stored (``None``: never).
    last_refill_age: float | None
    exhausted: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_datacenter(
    bind: Bind, *, table_prefix: str = DEFAULT_TIER_PREFIX, timeout: float = 5.0
) -> list[TierStatus]:
    """Every sequence of the datacenter tier in ``bind``'s database: stock, rate, runway, claim.

    Raises :class:`UnknownSequenceError` if the tier's tables are not there, and
    :class:`DatabaseUnavailable` if the database does not answer.
    """
    own = OwnEngine(_sync_bind(bind), timeout=timeout, pool_size=1, what="datacenter tier")
    try:
        return _describe(own, tier_tables(table_prefix))
    finally:
        own.dispose()


def _describe(own: OwnEngine, names: TierTables) -> list[TierStatus]:
    stock_t, state_t = own.backend.tier_tables(names)
    try:
        with own.connect() as conn:
            states = conn.execute(
                sa.select(state_t, db_now_ms().label("now_ms")).order_by(
                    state_t.c.sequence_name, state_t.c.bits
                )
            ).all()
            ranges = conn.execute(
                sa.select(
                    stock_t.c.sequence_name, stock_t.c.bits, stock_t.c.kind,
                    stock_t.c.first_id, stock_t.c.last_id, stock_t.c.step,
                )
            ).all()
    except sa_exc.DBAPIError as error:
        if _missing(own.backend, error):
            raise UnknownSequenceError(
                f"no datacenter tier tables ({names.stock}, {names.state}) on "
                f"{own.url.render_as_string()}; create them with `sqlalchemy-tickets init` "
                "or create_datacenter_tables()"
            ) from error
        raise own.unavailable(error) from error
    counted: dict[tuple[str, int], list[int]] = {}
    for r in ranges:
        n = (int(r.last_id) - int(r.first_id)) // int(r.step) + 1
        figures = counted.setdefault((r.sequence_name, int(r.bits)), [0, 0, 0])
        figures[0] += n
        figures[1] += n if r.kind == 0 else 0
        figures[2] += 1
    result = []
    for s in states:
        now = int(s.now_ms)
        stock, back, rows = counted.get((s.sequence_name, int(s.bits)), [0, 0, 0])
        rate = float(s.rate)
        result.append(
            TierStatus(
                sequence=_sequence(s.sequence_name),
                bits=int(s.bits),
                stock=stock,
                given_back_in_stock=back,
                ranges=rows,
                issued=int(s.issued),
                given_back=int(s.given_back),
                refills=int(s.refills),
                refilled=int(s.refilled),
                rate=rate,
                rate_age=(now - int(s.rate_at)) / 1000 if s.rate_at else None,
                runway=stock / rate if rate > 0 else None,
                claim_owner=s.claim_owner or None,
                claim_expires_in=(int(s.claim_until) - now) / 1000 if s.claim_owner else None,
                last_refill_age=(now - int(s.refilled_at)) / 1000 if s.refilled_at else None,
                exhausted=bool(s.exhausted),
            )
        )
    return result


# -- the tier ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Lane:
    """One (sequence, bits) of this process: its refiller and counters (under ``lock``)."""

    sequence: str | None
    bits: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False  # its state row is known to exist
    due: bool = False  # the refiller should look at the stock
    refilling: bool = False
    thread: threading.Thread | None = None
    not_before: float = 0.0  # monotonic: no refill attempt before (back-off, another's claim)
    wanted: int = 0  # ids a caller asked for beyond the stock: the next refill brings them
    error: BaseException | None = None
    failures: int = 0
    stored: int = 0  # blocks this process stored: what a waiting caller waits for
    floor: int = 0  # ids up to here are in use (ensure_above): upstream must offer above it
    told: bool = False  # upstream was told the marks of this lane, in this process
    claimed_at: int = 0  # database clock (ms) of this process's last refill claim
    # Counters.
    issued: int = 0
    round_trips: int = 0
    upstream_round_trips: int = 0
    refills: int = 0
    refilled: int = 0
    claims: int = 0
    claims_lost: int = 0
    burned: int = 0
    given_back: int = 0
    blocking_waits: int = 0
    rewinds: int = 0  # blocks upstream offered at or below what the tier stored from it
    #: Notified for the refiller (due, closed), and for callers waiting on an empty stock
    #: (a block stored, a range given back, a refill failed, closed).
    changed: threading.Condition = field(init=False)
    arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)
        self.arrived = threading.Condition(self.lock)

    @property
    def name(self) -> str:
        return _name(self.sequence)


_tiers: weakref.WeakSet[DatacenterTier] = weakref.WeakSet()
_tiers_lock = threading.Lock()


class DatacenterTier:
    """A stock of ids in a database of the datacenter, shared by every process that names it.

    Args:
        bind: the datacenter's database (URL or ``Engine``; PostgreSQL, MySQL/MariaDB or
            SQLite), reached on connections of the library's own, in autocommit.
        upstream: where the stock is refilled from: any source (typically the global pair,
            :class:`~sqlalchemy_tickets.TicketServers`). Called only in background threads.
        supply: seconds of ids, at the rate every process together takes them, that the stock
            aims to hold: how long the datacenter keeps issuing with upstream down.
        timeout: seconds a round trip to ``bind`` may take, and that a caller waits for a
            refill when the stock is empty before :class:`TicketServerUnavailable`.
        window: seconds over which the shared rate forgets a spike (HubSpot: 15 minutes).
        min_block: the smallest stock aimed at, and the least a refill brings.
        max_block: the most ids asked of upstream in one call (a refill makes several).
        waste_budget: the most ids in stock: an ``int``, or a ``float`` in (0, 1), a share of
            the sequence's id space (default: 10 million, and never more than 0.1 % of a
            32-bit sequence's). Ids in stock outlive restarts; they are lost only if the tier's
            tables are dropped.
        low_water: the share of the target under which a refill starts.
        claim_timeout: seconds a refill claim lasts without renewal; a refiller that dies or
            stalls blocks other processes' refills for at most this long.
        backoff, max_backoff: pauses after a failed refill (doubling).
        table_prefix: the tier's tables are ``<prefix>__stock`` and ``<prefix>__state``.
        create_missing: create the tables on first use (else :class:`UnknownSequenceError`).
        pool_size: connections kept open to ``bind``.
        on_rewind: when upstream offers ids at or below the highest the tier stored from it
            (a global server restored or failed over): ``"heal"`` tells upstream to move above
            it (``ensure_above``) and asks again; ``"refuse"`` stops refilling that sequence
            with :class:`~sqlalchemy_tickets.RewindError` until an operator's ``sync``.
            A rewind of the tier's own database always discards its stock and refills.
        identity_interval: seconds between checks of the tier database's identity beyond
            those made in every take and on every new connection.
    """

    def __init__(
        self,
        bind: Bind,
        upstream: TicketSource,
        *,
        supply: float = 900.0,
        timeout: float = 2.0,
        window: float = 900.0,
        min_block: int = 1000,
        max_block: int = 1_000_000,
        waste_budget: int | float | None = None,
        low_water: float = 0.5,
        claim_timeout: float = 15.0,
        backoff: float = 0.1,
        max_backoff: float = 10.0,
        table_prefix: str = DEFAULT_TIER_PREFIX,
        create_missing: bool = True,
        pool_size: int = 5,
        on_rewind: RewindPolicy = "heal",
        identity_interval: float = 1.0,
    ) -> None:
        self.on_rewind: RewindPolicy = _rewind.check_policy(on_rewind)
        self.identity_interval = check_seconds("identity_interval", identity_interval)
        if not isinstance(upstream, TicketSource):
            raise TicketsError(f"{upstream!r} is not a ticket source (needs next_id, next_block)")
        for label, value in (
            ("supply", supply), ("window", window),
            ("claim_timeout", claim_timeout), ("backoff", backoff), ("max_backoff", max_backoff),
        ):
            check_seconds(label, value)
        check_count(min_block)
        check_count(max_block)
        if min_block > max_block:
            raise TicketsError(f"min_block ({min_block}) must not exceed max_block ({max_block})")
        if waste_budget is not None and (isinstance(waste_budget, bool) or not (
            (isinstance(waste_budget, int) and waste_budget >= min_block)
            or (isinstance(waste_budget, float) and 0 < waste_budget < 1)
        )):
            raise TicketsError(
                f"waste_budget must be an int >= min_block (ids) or a float in (0, 1) (a share "
                f"of the id space), not {waste_budget!r}"
            )
        if isinstance(low_water, bool) or not isinstance(low_water, (int, float)) or not (
            0 < low_water <= 1
        ):
            raise TicketsError(f"low_water must be a share in (0, 1], not {low_water!r}")
        self.names = tier_tables(table_prefix)
        #: The tier's own engine and bounded round trip.
        self.own = OwnEngine(
            _sync_bind(bind),
            timeout=timeout,
            pool_size=pool_size,
            what="datacenter tier",
            unavailable=TicketServerUnavailable,
        )
        self.url: URL = self.own.url
        self.timeout = self.own.timeout
        self.backend: TicketBackend = self.own.backend
        self.upstream = upstream
        self.supply = float(supply)
        self.window = float(window)
        self.min_block = min_block
        self.max_block = max_block
        self.waste_budget = waste_budget
        self.low_water = float(low_water)
        self.claim_timeout = float(claim_timeout)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.create_missing = create_missing
        self._stock, self._state = self.backend.tier_tables(self.names)
        self._stamps = self.backend.stamp_table()
        self._guard_columns = self.backend.identity_columns(self.names.state)
        self._reset_state()
        # A new connection may reach another database (a failover behind the same name).
        sa.event.listen(self.own.engine, "connect", self._connected)
        with _tiers_lock:
            _tiers.add(self)

    def _reset_state(self) -> None:
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._lanes: dict[tuple[str | None, int], _Lane] = {}
        self._closed = threading.Event()
        #: Who this process is in a claim row: host, pid, and a token (pids are reused).
        self.owner = f"{socket.gethostname()[:32]}:{os.getpid()}:{secrets.token_hex(6)}"[-64:]
        # The tier database's identity as last checked, what ``identity_columns`` read then,
        # when (monotonic) and on which connection epoch.
        self._identity: Identity | None = None
        self._guard: tuple[Any, ...] | None = None
        self._checked = 0.0
        self._epoch = 0
        self._checked_epoch = -1
        self._rewinds = 0  # times this process found the tier's own database rewound
        self._created = False  # _create ran in this process

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        self._epoch += 1
    def __repr__(self) -> str:
        return f"DatacenterTier({self.url.render_as_string()!r}, upstream={self.upstream!r})"

    # -- the source protocol ------------------------------------------------------------------

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """One id of ``sequence`` from the stock."""
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """Up to ``count`` ids from the stock (the first range in stock may hold fewer; never
        none), in one transaction on the datacenter's database. Never waits on upstream while
        the stock holds ids; on an empty stock, waits up to ``timeout`` for a refill, then
        raises :class:`TicketServerUnavailable` (:class:`ExhaustedError` if upstream has no
        ids left)."""
        lane = self._lane(sequence, bits)
        check_count(count, lane.bits)
        deadline: float | None = None
        look = True  # take: at once, then after ids arrived or a look found some
        while True:
            with lane.lock:
                stored = lane.stored
            exhausted = False
            if look:
                block, exhausted = self._take(lane, count)
                if block is not None:
                    return block
            if exhausted:
                raise ExhaustedError(
                    f"sequence {lane.sequence or f'Tickets{lane.bits}'} has no ids left: the "
                    f"datacenter tier's stock is empty and {self.upstream!r} is exhausted; move "
                    "to a 64-bit sequence or a new sequence",
                    remaining=0,
                )
            now = time.monotonic()
            with lane.lock:
                if deadline is None:
                    deadline = now + self.timeout
                    lane.blocking_waits += 1
                    lane.wanted = max(lane.wanted, count)
                    # A caller waits: the next attempt comes soon, whatever the back-off.
                    lane.not_before = min(lane.not_before, now + self.backoff)
                error = lane.error
            if now >= deadline or self._closed.is_set():
                if isinstance(error, RewindError):
                    raise error
                reason = f": {error}" if error is not None else ""
                state = " (the tier is closed)" if self._closed.is_set() else ""
                raise TicketServerUnavailable(
                    f"no ids for {lane.sequence or 'Tickets'}/{lane.bits} within "
                    f"{self.timeout:g} s: the datacenter tier's stock is empty{state} and no "
                    f"refill from {self.upstream!r} arrived{reason}"
                )
            self._wake(lane)
            # Woken by a block this process stored, or after a short poll for one stored by
            # another process: a plain read, which neither locks the state row nor takes a
            # write lock, so waiting callers do not hold up the refill they wait for.
            poll_until = min(deadline, now + _POLL)
            with lane.lock:
                while lane.stored == stored and not self._closed.is_set():
                    left = poll_until - time.monotonic()
                    if left <= 0:
                        break
                    lane.arrived.wait(left)
                arrived = lane.stored != stored
            look = arrived or self._peek(lane)

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ``ids``, a range this tier issued that nobody used; returns how many were
        taken back (0 if any of them is already in stock: a range given back twice). Ids given
        back go out again before ids never issued."""
        lane = self._lane(sequence, bits)
        if not isinstance(ids, range):
            raise TicketsError(f"give_back takes a range of ids, not {type(ids).__name__}")
        if len(ids) == 0:
            return 0
        if ids.step < 1 or ids.start < 1 or ids[-1] > max_id(lane.bits):
            raise TicketsError(
                f"cannot give back {ids!r}: ids of a {lane.bits}-bit sequence are increasing "
                f"ranges within 1..{max_id(lane.bits)}"
            )
        last = ids[-1]
        state, stock = self._state, self._stock

        def work(conn: sa.Connection) -> int:
            row = conn.execute(
                sa.select(state.c.stock).where(*self._state_key(lane)).with_for_update()
            ).one_or_none()
            if row is None:
                raise _NoState
            # Ranges of an odd/even pair interleave: rows spanning the same interval may
            # still share no id, so the ids themselves are compared.
            near = conn.execute(
                sa.select(stock.c.first_id, stock.c.last_id, stock.c.step).where(
                    *self._stock_key(lane), stock.c.first_id <= last, stock.c.last_id >= ids.start
                )
            ).all()
            if any(
                _share_an_id(ids, range(int(r.first_id), int(r.last_id) + 1, int(r.step)))
                for r in near
            ):
                return 0
            conn.execute(
                sa.insert(stock).values(
                    sequence_name=lane.name, bits=lane.bits, kind=0,
                    first_id=ids.start, last_id=last, step=ids.step,
                )
            )
            conn.execute(
                sa.update(state).where(*self._state_key(lane)).values(
                    stock=state.c.stock + len(ids), given_back=state.c.given_back + len(ids)
                )
            )
            return len(ids)

        taken: int = self._transaction(lane, work)
        if taken == 0:
            logger.warning("%s: %r (%s/%d) overlaps ids in stock: not taken back",
                           self, ids, lane.sequence, lane.bits)
        with lane.lock:
            lane.given_back += taken
            lane.stored += 1
            lane.arrived.notify_all()
        return taken

    # -- management ---------------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the tier's tables in its database if they are not there."""
        _create(self.own, self.names)

    def describe(self) -> list[TierStatus]:
        """Every sequence in this tier's database: stock, shared rate, runway, claim."""
        return _describe(self.own, self.names)

    def stats(self) -> dict[str, Any]:
        """This process's counters, in total and per sequence (keyed ``name/bits``)."""
        keys = (
            "issued", "round_trips", "upstream_round_trips", "refills", "refilled", "claims",
            "claims_lost", "burned", "given_back", "blocking_waits", "failures", "rewinds",
        )
        per: dict[str, dict[str, Any]] = {}
        for lane in self._distinct_lanes():
            with lane.lock:
                figures: dict[str, Any] = {key: getattr(lane, key) for key in keys}
                figures["error"] = None if lane.error is None else str(lane.error)
            per[f"{lane.sequence or 'Tickets'}/{lane.bits}"] = figures
        total: dict[str, Any] = {key: sum(p[key] for p in per.values()) for key in keys}
        total["rewinds"] += self._rewinds
        # Rewinds upstream healed itself are counted there: one figure for the whole path.
        beneath = getattr(self.upstream, "stats", None)
        found = beneath().get("rewinds", 0) if callable(beneath) else 0
        total["rewinds"] += found if isinstance(found, int) else 0
        total["sequences"] = per
        return total

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no refill of this process is running or due (for tests and shutdowns)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self._distinct_lanes():
            with lane.lock:
                while lane.due or lane.refilling:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    lane.changed.wait(left if left is not None else _POLL)
        return True

    def close(self) -> None:
        """Stop refilling (a block on its way is stored first, within twice ``timeout``; claims
        are released). No id is lost: the stock stays in the database. The tier still takes ids
        back and hands out what is in stock afterwards (a cache closed later gives its ids
        back here), but refills no more."""
        if self._closed.is_set():
            return
        self._closed.set()
        threads = []
        for lane in self._distinct_lanes():
            with lane.lock:
                lane.changed.notify_all()
                lane.arrived.notify_all()
                if lane.thread is not None:
                    threads.append(lane.thread)
        # A block on its way lands and is stored within about one round trip each way. A
        # refill hung on upstream is left behind rather than hold the exit back: at worst its
        # block is burned, and its claim runs out by itself after claim_timeout.
        deadline = time.monotonic() + 2 * self.timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                logger.warning("%s: a refill still waits on upstream after close(); its "
                               "claim runs out within %g s", self, self.claim_timeout)
        self.own.dispose()
        with _tiers_lock:
            _tiers.discard(self)

    def __enter__(self) -> DatacenterTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        # The parent's sockets and threads are not the child's; the stock is in the database.
        self.own.dispose(close=False)
        self._reset_state()

    # -- internals: lanes and units of work ---------------------------------------------------

    def _distinct_lanes(self) -> list[_Lane]:
        with self._lock:
            return list({id(lane): lane for lane in self._lanes.values()}.values())

    def _lane(self, sequence: str | None, bits: int) -> _Lane:
        lane = self._lanes.get((sequence, bits))
        if lane is None:
            bits = check_bits(bits)
            name = normalize_sequence(sequence)
            with self._lock:
                lane = self._lanes.get((name, bits))
                if lane is None:
                    lane = self._lanes[name, bits] = _Lane(name, bits)
                self._lanes[sequence, bits] = lane
        return lane

    def _state_key(self, lane: _Lane) -> list[sa.ColumnElement[bool]]:
        return [self._state.c.sequence_name == lane.name, self._state.c.bits == lane.bits]

    def _stock_key(self, lane: _Lane) -> list[sa.ColumnElement[bool]]:
        return [self._stock.c.sequence_name == lane.name, self._stock.c.bits == lane.bits]

    @contextmanager
    def _unit(self) -> Iterator[sa.Connection]:
        """One bounded transaction on the tier's database; its errors in the library's terms."""
        queued = self.backend.queue_local_writers
        if queued and not self._writing.acquire(timeout=self.timeout):
            raise TicketServerUnavailable(
                f"{self}: the database stayed busy with this process's other writers for "
                f"{self.timeout:g} s"
            )
        try:
            with self.own.connect() as conn, self.backend.transaction(conn, self.timeout):
                yield conn
        except sa_exc.DBAPIError as error:
            if _missing(self.backend, error):
                raise _MissingTables from error
            if isinstance(error, sa_exc.IntegrityError):
                raise
            raise self.own.unavailable(error) from error
        finally:
            if queued:
                self._writing.release()

    def _transaction(self, lane: _Lane, work: Any) -> Any:
        """``work(conn)`` in one transaction, creating the tables and the sequence's state row
        first if they are missing."""
        for _ in range(3):
            if not lane.ready:
                self._ensure(lane)
            if self._checked_epoch != self._epoch or (
                time.monotonic() - self._checked >= self.identity_interval
            ):
                self._verify_identity()
            try:
                with self._unit() as conn:
                    return work(conn)
            except (_MissingTables, _NoState):
                lane.ready = False
            except _Moved:
                self._checked_epoch = -1  # checked (and its stock discarded) before the next
        raise TicketServerUnavailable(
            f"{self}: the tables of {lane.sequence or 'Tickets'}/{lane.bits} went away under "
            "every attempt to use them; try again"
        )

    def _ensure(self, lane: _Lane) -> None:
        """The sequence's state row (and the tables) exist: made on first use, race-free."""
        if self.create_missing and not self._created:
            # Once per process, even where the tier's tables exist: its stamp table may not
            # (tables made by an older release, or by a migration).
            _create(self.own, self.names)
            self._created = True
        row = {"sequence_name": lane.name, "bits": lane.bits}
        seed = self.backend.insert_seed(self._state, row)
        for attempt in (1, 2):
            try:
                with self._unit() as conn:
                    conn.execute(seed)
                lane.ready = True
                return
            except _MissingTables:
                if attempt == 2:
                    raise TicketServerUnavailable(
                        f"{self}: the tier's tables went away right after they were created"
                    ) from None
            if not self.create_missing:
                raise UnknownSequenceError(
                    f"no datacenter tier tables ({self.names.stock}, {self.names.state}) on "
                    f"{self.url.render_as_string()}; create them with `sqlalchemy-tickets init` "
                    "or create_datacenter_tables()"
                )
            _create(self.own, self.names)

    # -- internals: taking ids ---------------------------------------------------------------

    def _take(self, lane: _Lane, count: int) -> tuple[range | None, bool]:
        """Up to ``count`` ids from the stock in one transaction: the block (``None``: the
        stock is empty) and whether upstream said the sequence is exhausted."""
        state, stock = self._state, self._stock
        outcome: dict[str, Any] = {}

        def work(conn: sa.Connection) -> range | None:
            row = conn.execute(
                sa.select(
                    *self._guard_columns,
                    state.c.stock, state.c.issued, state.c.rate, state.c.rate_at,
                    state.c.rate_count, state.c.exhausted, db_now_ms(),
                ).where(*self._state_key(lane)).with_for_update()
            ).one_or_none()
            if row is None:
                raise _NoState
            if self._guard is not None and tuple(row[: len(self._guard)]) != self._guard:
                raise _Moved  # restored or failed over since the last check: nothing taken
            outcome["exhausted"] = bool(row.exhausted)
            outcome["rate"] = float(row.rate)
            outcome["stock"] = int(row.stock)
            if row.stock <= 0:
                return None
            head = conn.execute(
                sa.select(stock.c.kind, stock.c.first_id, stock.c.last_id, stock.c.step)
                .where(*self._stock_key(lane))
                .order_by(stock.c.kind, stock.c.first_id)
                .limit(1)
                .with_for_update()
            ).one_or_none()
            if head is None:
                # The count disagrees with the rows (tables edited by hand): the rows win.
                conn.execute(sa.update(state).where(*self._state_key(lane)).values(stock=0))
                outcome["stock"] = 0
                return None
            first, last, step = int(head.first_id), int(head.last_id), int(head.step)
            n = min(count, (last - first) // step + 1)
            where = [*self._stock_key(lane), stock.c.kind == head.kind, stock.c.first_id == first]
            if first + (n - 1) * step >= last:
                conn.execute(sa.delete(stock).where(*where))
            else:
                conn.execute(sa.update(stock).where(*where).values(first_id=first + n * step))
            issued = int(row.issued) + n
            values: dict[str, Any] = {"stock": state.c.stock - n, "issued": issued}
            values.update(self._sample(row, issued))
            conn.execute(sa.update(state).where(*self._state_key(lane)).values(**values))
            outcome["stock"] -= n
            outcome["rate"] = float(values.get("rate", row.rate))
            return range(first, first + n * step, step)

        block: range | None = self._transaction(lane, work)
        with lane.lock:
            lane.round_trips += 1
            if block is not None:
                lane.issued += len(block)
        if not self._closed.is_set():
            target = self._target(outcome["rate"], lane.bits)
            if outcome["stock"] < max(1, int(target * self.low_water)):
                self._wake(lane)
        return block, block is None and outcome["exhausted"]

    def _peek(self, lane: _Lane) -> bool:
        """Whether the stock holds ids (or upstream is exhausted), by a plain read."""
        state = self._state
        try:
            with self.own.connect() as conn:
                row = conn.execute(
                    sa.select(state.c.stock, state.c.exhausted).where(*self._state_key(lane))
                ).one_or_none()
        except (sa_exc.DBAPIError, DatabaseUnavailable):
            return True  # the take says what is wrong
        return row is None or row.stock > 0 or bool(row.exhausted)

    def _sample(self, row: Any, issued: int) -> dict[str, Any]:
        """The shared rate's new sample, if one is due (by the database clock)."""
        now = int(row[-1])
        rate_at = int(row.rate_at)
        if rate_at <= 0 or now < rate_at:
            # The first sample, or the database's clock went back: start measuring again.
            return {"rate_at": now, "rate_count": int(row.issued)}
        elapsed_ms = now - rate_at
        if elapsed_ms < RATE_INTERVAL_MS:
            return {}
        elapsed = elapsed_ms / 1000
        measured = (issued - int(row.rate_count)) / elapsed
        rate = float(row.rate)
        if measured > rate:
            rate = measured  # rise at once on a spike...
        else:  # ...and forget it slowly.
            rate += (measured - rate) * (1 - math.exp(-elapsed / self.window))
        return {"rate": rate, "rate_at": now, "rate_count": issued}

    def _budget(self, bits: int) -> int:
        budget = self.waste_budget
        if budget is None:
            return max(self.min_block, min(DEFAULT_WASTE_BUDGET, max_id(bits) // 1000))
        if isinstance(budget, float):
            return max(self.min_block, int(max_id(bits) * budget))
        return budget

    def _target(self, rate: float, bits: int) -> int:
        """The stock aimed at: ``supply`` seconds at the shared rate, within the bounds."""
        return min(self._budget(bits), max(self.min_block, math.ceil(rate * self.supply)))

    # -- internals: refilling ----------------------------------------------------------------

    def _wake(self, lane: _Lane, *, after: float | None = None) -> None:
        """Have the refiller look at the stock (``after``: not before that many seconds)."""
        if self._closed.is_set():
            return
        with lane.lock:
            lane.due = True
            if after is not None:
                lane.not_before = time.monotonic() + after
            lane.changed.notify_all()
            if lane.thread is None:
                lane.thread = threading.Thread(
                    target=self._refiller, args=(lane,), daemon=True,
                    name=f"tickets-dc-refill-{lane.sequence or 'Tickets'}-{lane.bits}",
                )
                lane.thread.start()

    def _refiller(self, lane: _Lane) -> None:
        """The background refills of one sequence, for as long as the tier is open."""
        while True:
            with lane.lock:
                while True:
                    if self._closed.is_set():
                        return
                    delay = lane.not_before - time.monotonic()
                    if lane.due and delay <= 0:
                        break
                    lane.changed.wait(delay if lane.due else None)
                lane.due = False
                lane.refilling = True
            try:
                self._refill(lane)
            except Exception:  # a bug must not end refills for good
                logger.exception("%s: refill of %s/%d failed", self, lane.sequence, lane.bits)
                self._wake(lane, after=self.max_backoff)
            finally:
                with lane.lock:
                    lane.refilling = False
                    lane.changed.notify_all()

    def _refill(self, lane: _Lane) -> None:
        """Claim, bring blocks from upstream, store them, release. Sets when to look again."""
        claimed = self._claim(lane)
        if claimed is None:
            return  # nothing to do: the stock is high enough
        size, busy_for = claimed
        with lane.lock:
            claimed_at = lane.claimed_at
        if size == 0:
            # Another process holds a live claim: look again once it is void, if still low.
            self._wake(lane, after=max(busy_for, self.backoff))
            return
        got = 0
        try:
            if not lane.told:
                # A fresh process over a restored upstream server: the marks are the floor it
                # heals above (it knows none of its own yet).
                high = self._highest_mark(lane)
                if high:
                    ensure_above_in(self.upstream, lane.sequence, high, lane.bits)
                lane.told = True
            while got < size and not self._closed.is_set():
                ask = min(size - got, self.max_block)
                try:
                    block = self.upstream.next_block(lane.sequence, ask, bits=lane.bits)
                except ExhaustedError as error:
                    remaining = error.remaining
                    if remaining and remaining < ask:
                        size = got + remaining  # the sequence's last ids, exactly
                        continue
                    if got == 0:
                        self._mark_exhausted(lane)
                    self._failed(lane, error, final=True)
                    return
                with lane.lock:
                    lane.upstream_round_trips += 1
                if len(block) == 0:
                    raise TicketsError(f"{self.upstream!r} returned an empty block")
                try:
                    held = self._store(lane, block, claimed_at)
                except _UpstreamRewound as rewound:
                    self._upstream_rewound(lane, block, rewound.high)
                    continue
                got += len(block)
                if not held:
                    with lane.lock:
                        lane.claims_lost += 1
                    logger.warning("%s: refill claim of %s/%d lost (it outlived "
                                   "claim_timeout=%g s)", self, lane.sequence, lane.bits,
                                   self.claim_timeout)
                    return
        except TicketsError as error:
            self._failed(lane, error, final=False)
            return
        finally:
            self._release(lane)
        with lane.lock:
            lane.wanted = 0
            if lane.failures:
                logger.info("%s: refills of %s/%d work again", self, lane.sequence, lane.bits)
            lane.failures = 0
            lane.error = None
        self._wake(lane)  # look once more: the rate may have grown, or blocks came short

    def _failed(self, lane: _Lane, error: BaseException, *, final: bool) -> None:
        with lane.lock:
            lane.error = error
            lane.failures += 1
            pause = min(self.max_backoff, self.backoff * 2 ** (lane.failures - 1))
            lane.arrived.notify_all()
        (logger.error if final else logger.warning)(
            "%s: refill of %s/%d from upstream failed (%d in a row): %s",
            self, lane.sequence, lane.bits, lane.failures, error,
        )
        if not final:
            self._wake(lane, after=pause)

    def _claim(self, lane: _Lane) -> tuple[int, float] | None:
        """Claim the sequence's refill if its stock is low and nobody holds a live claim.

        Returns ``None`` when no refill is needed, ``(0, seconds)`` when another process's
        claim is live for that long, else ``(ids to bring, 0)`` with the claim held."""
        state = self._state
        with lane.lock:
            wanted = lane.wanted

        def work(conn: sa.Connection) -> tuple[int, float] | None:
            row = conn.execute(
                sa.select(
                    state.c.stock, state.c.rate, state.c.claim_owner, state.c.claim_until,
                    db_now_ms(),
                ).where(*self._state_key(lane)).with_for_update()
            ).one_or_none()
            if row is None:
                raise _NoState
            now = int(row[-1])
            stock = int(row.stock)
            target = self._target(float(row.rate), lane.bits)
            low = max(1, int(target * self.low_water))
            if stock >= low and stock >= wanted:
                return None
            owner, until = row.claim_owner, int(row.claim_until)
            if owner and owner != self.owner and until > now:
                return 0, (until - now) / 1000
            if owner and owner != self.owner:
                logger.warning("%s: taking over the refill claim of %s/%d from %s (void for "
                               "%.1f s)", self, lane.sequence, lane.bits, owner,
                               (now - until) / 1000)
            size = max(target - stock, wanted - stock, self.min_block)
            size = min(size, self._budget(lane.bits) - stock)
            if size < 1:
                return None
            conn.execute(
                sa.update(state).where(*self._state_key(lane)).values(
                    claim_owner=self.owner, claim_until=now + int(self.claim_timeout * 1000)
                )
            )
            with lane.lock:
                lane.claimed_at = now
            return size, 0.0

        try:
            claimed: tuple[int, float] | None = self._transaction(lane, work)
        except DatabaseUnavailable as error:
            self._failed(lane, error, final=False)
            return None
        if claimed is not None and claimed[0] > 0:
            with lane.lock:
                lane.claims += 1
        return claimed

    def _store(self, lane: _Lane, block: range, claimed_at: int = 0) -> bool:
        """Put a block from upstream in stock, renewing the claim; returns whether the claim
        is still this process's. A block the database never took is burned (logged)."""
        state, stock = self._state, self._stock
        n = len(block)

        def work(conn: sa.Connection) -> bool:
            row = conn.execute(
                sa.select(state.c.claim_owner, db_now_ms())
                .where(*self._state_key(lane)).with_for_update()
            ).one_or_none()
            if row is None:
                raise _NoState
            now = int(row[-1])
            self._check_mark(conn, lane, block, claimed_at)
            conn.execute(
                sa.insert(stock).values(
                    sequence_name=lane.name, bits=lane.bits, kind=1,
                    first_id=block.start, last_id=block[-1], step=block.step,
                )
            )
            values: dict[str, Any] = {
                "stock": state.c.stock + n,
                "refills": state.c.refills + 1,
                "refilled": state.c.refilled + n,
                "refilled_at": now,
                "exhausted": 0,
            }
            mine = row.claim_owner == self.owner
            if mine:
                values["claim_until"] = now + int(self.claim_timeout * 1000)
            conn.execute(sa.update(state).where(*self._state_key(lane)).values(**values))
            return bool(mine)

        for attempt in range(1, _STORE_ATTEMPTS + 1):
            try:
                held: bool = self._transaction(lane, work)
                break
            except sa_exc.IntegrityError as error:
                # Two blocks starting at one id: upstream issued an id twice. Never store it.
                with lane.lock:
                    lane.burned += n
                raise TicketsError(
                    f"{self.upstream!r} returned {block!r}, which starts where a range in stock "
                    f"does: upstream issued ids twice; the block is not used"
                ) from error
            except DatabaseUnavailable:
                if attempt == _STORE_ATTEMPTS:
                    with lane.lock:
                        lane.burned += n
                    logger.error("%s: %d ids of %s/%d burned: the datacenter database did not "
                                 "take them", self, n, lane.sequence, lane.bits)
                    raise
                time.sleep(self.backoff * attempt)
        with lane.lock:
            lane.refills += 1
            lane.refilled += n
            lane.stored += 1
            lane.arrived.notify_all()
        return held

    # -- internals: rewinds -------------------------------------------------------------------

    def _mark_name(self, lane: _Lane, block: range) -> str:
        """The key of an upstream lane's high-water mark in the stamp table."""
        return (f"upstream:{self.names.state}:{lane.name}/{lane.bits}:"
                f"{block.step}:{block.start % block.step}")

    def _highest_mark(self, lane: _Lane) -> int:
        """The highest id the tier ever stored of this sequence, over its upstream lanes."""
        stamps = self._stamps
        prefix = f"upstream:{self.names.state}:{lane.name}/{lane.bits}:"
        try:
            with self.own.connect() as conn:
                rows = conn.execute(
                    sa.select(stamps.c.name, stamps.c.last_id).where(
                        stamps.c.name.startswith(prefix, autoescape=True)
                    )
                ).all()
        except sa_exc.DBAPIError as error:
            raise self.own.unavailable(error) from error
        return max((int(r.last_id) for r in rows if r.last_id is not None), default=0)

    def _check_mark(
        self, conn: sa.Connection, lane: _Lane, block: range, claimed_at: int
    ) -> None:
        """Refuse a block at or below what the tier stored from its upstream lane (or below
        a floor it was told of); record its end as the lane's new mark (same transaction).

        Blocks of one lane come from upstream in increasing order, but are stored in the order
        their refills finish: a refill that stalled past its claim stores a block below the one
        its successor stored. The mark keeps when the refill that set it was claimed (database
        clock, in ``stamp``): a lower block from a refill claimed before that is late, not a
        rewind."""
        stamps = self._stamps
        key = self._mark_name(lane, block)
        row = conn.execute(
            sa.select(stamps.c.last_id, stamps.c.stamp).where(stamps.c.name == key)
            .with_for_update()
        ).one_or_none()
        high = int(row.last_id or 0) if row is not None else 0
        set_at = int(row.stamp) if row is not None and row.stamp.isdigit() else 0
        if block.start <= lane.floor:
            raise _UpstreamRewound(max(high, lane.floor))
        if block.start <= high:
            if claimed_at and claimed_at < set_at:
                return  # late: obtained before the block that set the mark
            raise _UpstreamRewound(high)
        if row is None:
            conn.execute(self.backend.insert_seed(stamps, {"name": key, "last_id": block[-1]}))
        conn.execute(sa.update(stamps).where(stamps.c.name == key).values(
            last_id=block[-1], stamp=str(claimed_at)))

    def _upstream_rewound(self, lane: _Lane, block: range, high: int) -> None:
        """Upstream offered ``block``, at or below ``high``: it went back in time. The block is
        burned; upstream is told to move above ``high`` (heal), or RewindError (refuse)."""
        with lane.lock:
            lane.burned += len(block)
            lane.rewinds += 1
        table = TicketTable(lane.sequence, lane.bits, lane.name)
        _rewind.counted(table)
        seen = (f"{self.upstream!r} offered ids {block.start}..{block[-1]}, at or below "
                f"{high}, the highest this datacenter tier stored from it")
        if self.on_rewind == "refuse" or not isinstance(self.upstream, KeepsAbove):
            raise _rewind.refusal(repr(self.upstream), None, table, seen, [high])
        self.upstream.ensure_above(lane.sequence, high, bits=lane.bits)
        logger.warning("%s: %s went back in time upstream: %s; told it to move above %d: no id "
                       "is issued twice", self, table.label, seen, high)

    def _verify_identity(self) -> None:
        """Check the tier database's identity; if it changed (restored, failed over), discard
        the stock once, whichever process sees it first, and record the new identity."""
        name = self.names.state
        pseudo = TicketTable(None, 64, name)  # the stamp of the tier is keyed by its state table
        try:
            with self._unit() as conn:
                cursor = conn.connection.cursor()
                try:
                    live = self.backend.identity(cursor, self.own.engine.dialect, pseudo)
                finally:
                    cursor.close()
                if live is None:
                    return  # the tables are not there yet
                guard = tuple(conn.execute(sa.select(*self._guard_columns)).one()) if (
                    self._guard_columns) else ()
                stored = self.backend.read_stamp(conn, pseudo)
                reference = self._identity or stored
                discarded = None
                if reference is None:
                    self.backend.record_stamp(conn, pseudo, live, None)
                elif live.same(reference) or live.promoted_from(reference):
                    if stored is None or not stored.same(live):
                        self.backend.record_stamp(conn, pseudo, live, None)
                elif stored is not None and stored.same(live):
                    pass  # another process saw it first and discarded the stock
                else:
                    discarded = self._discard_stock(conn, pseudo, live, reference)
        except (_MissingTables, sa_exc.DBAPIError, DatabaseUnavailable) as error:
            logger.debug("%s: identity check failed: %s", self, error)
            return
        if discarded is not None:
            self._rewinds += 1
            logger.warning(
                "%s: the datacenter database went back in time (its identity changed from %s "
                "to %s: restored, or a replica promoted): discarded its stock (%d ids, some "
                "possibly issued already) and refills from upstream: no id is issued twice",
                self, reference, live, discarded,
            )
            for lane in self._distinct_lanes():
                self._wake(lane)
        self._identity, self._guard = live, guard
        self._checked = time.monotonic()
        self._checked_epoch = self._epoch

    def _discard_stock(
        self, conn: sa.Connection, pseudo: TicketTable, live: Identity, reference: Identity
    ) -> int:
        """Every range in stock, of every sequence, deleted; the identity recorded. Returns
        how many ids went."""
        state, stock = self._state, self._stock
        conn.execute(sa.select(state.c.stock).with_for_update()).all()  # every writer waits
        dropped = int(conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(state.c.stock), 0))
        ).scalar_one())
        conn.execute(sa.delete(stock))
        conn.execute(sa.update(state).values(stock=0))
        self.backend.record_stamp(conn, pseudo, live, None)
        return dropped

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id issued from now on be above ``floor`` (ids known to be in use): the
        ranges in stock at or below it are dropped, upstream is told too, and blocks it offers
        at or below are refused. Returns whether anything was dropped or moved."""
        lane = self._lane(sequence, bits)
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise TicketsError(f"a floor is a number of ids >= 0, not {floor!r}")
        with lane.lock:
            lane.floor = max(lane.floor, floor)
        state, stock = self._state, self._stock

        def work(conn: sa.Connection) -> int:
            if conn.execute(
                sa.select(state.c.stock).where(*self._state_key(lane)).with_for_update()
            ).one_or_none() is None:
                raise _NoState
            rows = conn.execute(
                sa.select(stock.c.kind, stock.c.first_id, stock.c.last_id, stock.c.step)
                .where(*self._stock_key(lane), stock.c.first_id <= floor)
            ).all()
            dropped = 0
            for r in rows:
                ids = range(int(r.first_id), int(r.last_id) + 1, int(r.step))
                kept = above(ids, floor)
                dropped += len(ids) - len(kept)
                where = [*self._stock_key(lane), stock.c.kind == r.kind,
                         stock.c.first_id == r.first_id]
                if kept:
                    conn.execute(sa.update(stock).where(*where).values(first_id=kept.start))
                else:
                    conn.execute(sa.delete(stock).where(*where))
            if dropped:
                conn.execute(sa.update(state).where(*self._state_key(lane))
                             .values(stock=state.c.stock - dropped))
            return dropped

        dropped: int = self._transaction(lane, work)
        if dropped:
            with lane.lock:
                lane.burned += dropped
            logger.warning("%s dropped %d ids of %s/%d at or below %d from its stock: they are "
                           "in use", self, dropped, lane.sequence or "Tickets", lane.bits, floor)
        moved = ensure_above_in(self.upstream, lane.sequence, floor, lane.bits)
        return bool(dropped) or moved

    def _release(self, lane: _Lane) -> None:
        state = self._state
        try:
            with self._unit() as conn:
                conn.execute(
                    sa.update(state)
                    .where(*self._state_key(lane), state.c.claim_owner == self.owner)
                    .values(claim_owner="", claim_until=0)
                )
        except (sa_exc.DBAPIError, DatabaseUnavailable, _MissingTables) as error:
            # The claim runs out by itself after claim_timeout.
            logger.warning("%s: releasing the refill claim of %s/%d failed: %s",
                           self, lane.sequence, lane.bits, error)

    def _mark_exhausted(self, lane: _Lane) -> None:
        state = self._state
        try:
            with self._unit() as conn:
                conn.execute(
                    sa.update(state).where(*self._state_key(lane)).values(exhausted=1)
                )
        except (sa_exc.DBAPIError, DatabaseUnavailable, _MissingTables) as error:
            logger.warning("%s: recording that %s/%d is exhausted failed: %s",
                           self, lane.sequence, lane.bits, error)


def _after_fork_in_child() -> None:
    global _tiers_lock
    _tiers_lock = threading.Lock()
    for tier in list(_tiers):
        tier._after_fork_in_child()


_process.after_fork_in_child(_after_fork_in_child)


@_process.at_exit
def _close_all() -> None:
    # Caches closed after this still give their ids back: a closed tier takes them.
    with _tiers_lock:
        tiers = list(_tiers)
    for tier in tiers:
        tier.close()
