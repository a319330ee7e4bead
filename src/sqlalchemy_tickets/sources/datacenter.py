"""HubSpot's datacenter tier: a stock of ids in a database of the datacenter, shared by every
process on every host that names that database, refilled from the global tier in the background.

Two tables (names from :func:`~sqlalchemy_tickets._naming.tier_tables`, ``tickets_dc__stock`` and
``tickets_dc__state`` by default; the Core tables come from ``TicketBackend.tier_tables``)::

    tickets_dc__stock: one row per range of ids queued in stock
        sequence_name  VARCHAR(40)  ┐ the sequence ('' for Flickr's Tickets64/Tickets32)
        bits           SMALLINT     │ 32 or 64
        kind           SMALLINT     │ 0: given back, 1: never issued
        first_id       BIGINT       ┘ primary key, in the order ids go out: given back first
        last_id        BIGINT         the range's last id (inclusive)
        step           INTEGER        its stride (the upstream's: 2 for an odd/even pair)

    tickets_dc__state: one row per (sequence_name, bits)
        stock          BIGINT   ids in stock (the head and every queued range)
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
        head_kind, head_first, head_last, head_step
                                the range being handed out (empty: head_first > head_last)
        last_take      BIGINT   ids handed out by the latest take

**Taking ids** (:meth:`DatacenterTier.next_block`) is one statement: it moves the state row's head
by up to ``count`` ids and returns them (``_tier_store.py``; per backend, ``tier_take``), so the
row's lock is held for one round trip and no process ever waits on another's transaction. The
row's lock orders every writer of a sequence — takers, refillers, givers-back — so a range is
never handed out twice, and a process killed mid-take either committed (those ids are its,
burned) or changed nothing. When the head is empty, the next queued range becomes the head (a
short transaction, once per range). Upstream is never called there.

**Refilling** runs on the tier's refill threads (``_refill.py``: a few threads for every
sequence, the shortest runway first, several sequences per round trip), when a take leaves the
stock under the low-water mark. The refiller first *claims* the refill in the state row — only if
the stock is still low and no live claim exists — so one process at a time refills a sequence,
whatever the number of processes and hosts. It then asks ``upstream`` for blocks (of many
sequences at once where upstream serves many), stores each in its own transaction, renewing the
claim, and releases the claim. A claim is void after ``claim_timeout`` seconds without renewal,
so a refiller that dies or stalls blocks nobody for longer. A refiller killed with a block in
transit burns that block and nothing else: stored blocks are durable, and ids are unique at the
source.

**Sizing** (``_sizing.py``): the stock aims at ``supply`` seconds of ids at the rate all processes
take them, within ``min_block`` and the ``waste_budget``. The rate is kept in the state row, so
every process sizes from the same figure; it is sampled (at most once a second, by the refill
threads, under the claim's lock) from the ``issued`` count the takes keep. Ids in stock are
durable, so stocking for a spike costs id space, not ids lost on a restart.

**Rewinds.** Two databases can go back in time under a tier (``docs/rewinds.md``):

* *upstream* (a global ticket server restored from a backup, or a replica promoted that missed
  writes) offers ids the tier already stored. The tier records, per upstream lane (the stride
  and residue of the blocks: one lane per server of an odd/even pair), the highest id it ever
  stored, in ``tickets_stamps`` of its own database, beside the store in one transaction; a
  block at or below it is refused (burned), upstream is told to move above it
  (``ensure_above``) and the refill asks again.
* *its own database* (restored, or a lagging replica promoted) brings back ranges already
  issued. Its identity (``Identity``) is recorded in ``tickets_stamps``, checked in every take
  (the expressions of ``identity_columns`` compared in the take's own statement), on each new
  connection and at ``identity_interval``; when it changed, the first process to see it
  discards the whole stock (a compare-and-set on the recorded identity, so it happens once) and
  refills from upstream, which never rewound. Nobody needs to act.

**The parts.** This module holds the tier's API; ``_tier_db.py`` its units of work and the
identity check; ``_tier_ledger.py`` how ranges move between head and stock (pure, no SQL);
``_tier_refill.py`` the refill jobs; ``_tier_store.py`` (and ``dialects/``) every statement;
``_tier_admin.py`` the tables as an operator sees them.

**Which clock.** Everything shared — the rate's samples and the claims' expiry — uses the database
server's clock, read in the same statements: the one clock every process on every host agrees
on, whatever their own clocks say. Local monotonic clocks only bound local waits (``timeout``,
back-off).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from .. import _process
from .._backoff import Backoff
from .._commands import init_command
from .._naming import DEFAULT_TIER_PREFIX, check_bits, check_seconds, tier_tables
from ..dialects._connect import Bind, OwnEngine, sync_bind
from ..dialects.base import TicketBackend
from ..errors import ExhaustedError, RewindError, TicketsError, TicketServerUnavailable
from . import _rewind
from ._lanes import FailurePolicy, LaneMap
from ._options import check_budget, check_sizing, check_workers
from ._refill import Refiller
from ._rewind import RewindPolicy
from ._sizing import StockSizing, runway
from ._stamps import Stamps
from ._tier_admin import (
    TierStatus,
    create_datacenter_tables,
    datacenter_table_statements,
    datacenter_tables,
    describe,
    describe_datacenter,
    drop_datacenter_table_statements,
)
from ._tier_db import Moved, NoState, TierDatabase, TierLane
from ._tier_ledger import (
    GIVEN_BACK,
    Moves,
    cut_below,
    next_head,
    promote,
    put,
    share_an_id,
    take_from_head,
)
from ._tier_refill import RATE_INTERVAL_MS, TierRefills
from ._tier_store import Key, Taken
from .base import Request, TicketSource, check_count, check_ids, ensure_above_in, prepare_in

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

#: How often a caller waiting on an empty stock looks again for ids another process stored.
_POLL = 0.05

#: Most sequences in one refill (one claim, one round trip upstream, one store).
REFILL_BATCH = 64

#: Most sequences in one transaction of many (takes, give-backs: a few statements, whatever
#: their number, on PostgreSQL): each one is bounded by the timeout, and holds the state rows
#: it locked until it ends.
TIER_CHUNK = 500

#: Up to this many sequences asked for at once, each gets the one-statement take.
_ONE_BY_ONE = 4

#: Times a take looks for ids again after making the next queued range the head.
_TAKE_ATTEMPTS = 5


class DatacenterTier:
    """A stock of ids in a database of the datacenter, shared by every process that names it.

    Args:
        bind: the datacenter's database (URL or ``Engine``; PostgreSQL, MySQL/MariaDB or
            SQLite), reached on connections of the library's own, in autocommit.
        upstream: where the stock is refilled from: any source (typically the global pair,
            :class:`~sqlalchemy_tickets.TicketServers`). Called only in background threads
            (and by :meth:`prepare`).
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
        workers: refill threads, for every sequence together (a refill that waits on upstream
            holds one; the others go on).
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
        workers: int = 3,
    ) -> None:
        self.on_rewind: RewindPolicy = _rewind.check_policy(on_rewind)
        self.identity_interval = check_seconds("identity_interval", identity_interval)
        if not isinstance(upstream, TicketSource):
            raise TicketsError(f"{upstream!r} is not a ticket source (needs next_id, next_block)")
        check_sizing(min_block=min_block, max_block=max_block, supply=supply, window=window,
                     claim_timeout=claim_timeout, backoff=backoff, max_backoff=max_backoff)
        if waste_budget is not None:
            check_budget(waste_budget, at_least=min_block, what="the id space")
        if isinstance(low_water, bool) or not isinstance(low_water, (int, float)) or not (
            0 < low_water <= 1
        ):
            raise TicketsError(f"low_water must be a share in (0, 1], not {low_water!r}")
        self.workers = check_workers(workers)
        self.names = tier_tables(table_prefix)
        #: The tier's own engine: the one pool every unit of work goes through.
        self.own = OwnEngine(
            sync_bind(bind),
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
        #: How much the stock aims at (``_sizing.py``).
        self.sizing = StockSizing(self.supply, self.window, min_block, waste_budget,
                                  self.low_water)
        #: The identities and marks recorded in the tier's database (its stamp table).
        self.stamps = Stamps(self.own, create=create_missing, command=(
            f"`{init_command(self.url.render_as_string(hide_password=True), '--datacenter-tier')}`"
            " (or op.create_datacenter_tables() in a migration)"))
        self._closed = threading.Event()
        self._reset_state()
        _process.track(self)

    def _reset_state(self) -> None:
        self._lanes: LaneMap[TierLane] = LaneMap(TierLane)
        #: Who this process is in a claim row: host, pid, and a token (pids are reused).
        self.owner = f"{socket.gethostname()[:32]}:{os.getpid()}:{secrets.token_hex(6)}"[-64:]
        self.db = TierDatabase(
            self.own, self.names, create_missing=self.create_missing,
            identity_interval=self.identity_interval, stamps=self.stamps,
            rewound=lambda discarded: self._wake_all(),
        )
        self.store = self.db.store
        self._refiller: Refiller[TierLane] = Refiller(
            self._refill, name="tickets-dc-refill", workers=self.workers, batch=REFILL_BATCH,
        )
        backoff = Backoff(self.backoff, self.max_backoff)
        self._failures: FailurePolicy[TierLane] = FailurePolicy(
            lambda: repr(self), backoff,
            lambda lane, pause: self._refiller.defer(lane, pause, runway=0.0),
        )
        self._refills = TierRefills(
            self.db, self.upstream, sizing=self.sizing, schedule=self._refiller,
            failures=self._failures, owner=self.owner, claim_timeout=self.claim_timeout,
            max_block=self.max_block, on_rewind=self.on_rewind, backoff=backoff,
            closed=self._closed, name=lambda: repr(self),
        )

    def _refill(self, lanes: list[TierLane]) -> None:
        self._refills.run(lanes)

    def _wake_all(self) -> None:
        for lane in self._lanes.distinct():
            self._refiller.wake(lane, runway=0.0)

    def __repr__(self) -> str:
        return f"DatacenterTier({self.url.render_as_string()!r}, upstream={self.upstream!r})"

    # -- the source protocol ------------------------------------------------------------------

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """One id of ``sequence`` from the stock."""
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """Up to ``count`` ids from the stock (the range being handed out may hold fewer; never
        none), in one statement on the datacenter's database. Never waits on upstream while
        the stock holds ids; on an empty stock, waits up to ``timeout`` for a refill, then
        raises :class:`TicketServerUnavailable` (:class:`ExhaustedError` if upstream has no
        ids left; :class:`RewindError` at once while upstream's rewind is refused)."""
        lane = self._lanes.get(sequence, bits)
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
                error = lane.error
            if isinstance(error, RewindError):
                raise error
            if now >= deadline or self._closed.is_set():
                reason = f": {error}" if error is not None else ""
                state = " (the tier is closed)" if self._closed.is_set() else ""
                raise TicketServerUnavailable(
                    f"no ids for {lane.label} within {self.timeout:g} s: the datacenter "
                    f"tier's stock is empty{state} and no refill from {self.upstream!r} "
                    f"arrived{reason}"
                )
            # A caller waits: the next attempt comes soon, whatever the back-off.
            self._refiller.hurry(lane, self.backoff)
            # Woken by a block this process stored, or after a short poll for one stored by
            # another process: a plain read, which neither locks the state row nor takes a
            # write lock, so waiting callers do not hold up the refill they wait for.
            poll_until = min(deadline, now + _POLL)
            with lane.lock:
                while lane.stored == stored and not self._closed.is_set():
                    left = poll_until - time.monotonic()
                    if left <= 0:
                        break
                    lane.changed.wait(left)
                arrived = lane.stored != stored
            look = arrived or self.db.peek(lane.key)

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """:meth:`next_block` for each ``(sequence, count, bits)``: a few sequences one
        statement each, many in one transaction per few hundred (a cache refilling many lanes
        at once); those whose stock is empty wait for a refill as :meth:`next_block` does."""
        out: list[range | TicketsError | None] = [None] * len(requests)
        for i, (sequence, count, bits) in enumerate(requests):
            try:
                check_count(count, self._lanes.get(sequence, bits).bits)
            except TicketsError as error:
                out[i] = error
        wanted = [(i, self._lanes.get(s, b), c) for i, (s, c, b) in enumerate(requests)
                  if out[i] is None]
        if len(wanted) <= _ONE_BY_ONE:
            wanted = []  # the one-statement take beats a transaction for a few
        for start in range(0, len(wanted), TIER_CHUNK):
            part = wanted[start : start + TIER_CHUNK]
            found: list[range | None] | list[TicketsError]
            takes = [(lane, c) for _, lane, c in part]
            try:
                found = self.db.transaction(
                    [lane for lane, _ in takes], functools.partial(self._take_many, takes=takes)
                )
            except TicketsError as error:
                found = [error] * len(part)
            for (i, _, _), block in zip(part, found, strict=True):
                out[i] = block
        result: list[range | TicketsError] = []
        for i, (sequence, count, bits) in enumerate(requests):
            got = out[i]
            if got is None:  # an empty stock: wait for its refill
                try:
                    got = self.next_block(sequence, count, bits=bits)
                except TicketsError as error:
                    got = error
            result.append(got)
        return result

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None:
        """Get ``sequences`` ready: the tier's tables and their state rows made (one
        transaction), upstream prepared (its tables made, first contact), and every stock
        under its low-water mark refilled — a few sequences per round trip — before this
        returns, so that their first takes find ids.

        Raises the first :class:`TicketsError` a refill met."""
        check_bits(bits)
        lanes = list({id(lane): lane for lane in (
            self._lanes.get(sequence, bits) for sequence in sequences)}.values())
        if not lanes:
            return
        self.db.transaction(lanes, lambda conn: None)  # tables, state rows, identity
        prepare_in(self.upstream, [lane.sequence for lane in lanes], bits)
        for lane in lanes:
            self._refiller.wake(lane, runway=0.0)
        deadline = self.timeout + 2 * self.timeout * math.ceil(len(lanes) / REFILL_BATCH)
        self._refiller.wait_idle(deadline, lanes)
        for lane in lanes:
            with lane.lock:
                error = lane.error
            if isinstance(error, TicketsError):
                raise error

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ``ids``, a range this tier issued that nobody used; returns how many were
        taken back (0 if any of them is already in stock: a range given back twice). Ids given
        back go out again before ids never issued."""
        return self.give_back_many([(sequence, ids, bits)])[0]

    def give_back_many(self, items: Sequence[tuple[str | None, range, int]]) -> list[int]:
        """:meth:`give_back` of each ``(sequence, ids, bits)``, in one transaction (a cache
        closing with thousands of lanes)."""
        lanes: list[TierLane] = []
        for sequence, ids, bits in items:
            lane = self._lanes.get(sequence, bits)
            if not isinstance(ids, range):
                raise TicketsError(f"give_back takes a range of ids, not {type(ids).__name__}")
            check_ids(ids, lane.bits)
            lanes.append(lane)
        wanted = [(lane, ids) for lane, (_, ids, _) in zip(lanes, items, strict=True) if ids]
        if not wanted:
            return [0] * len(items)
        taken_by: dict[int, int] = {}
        for start in range(0, len(wanted), TIER_CHUNK):
            self._give_back_part(wanted, start, taken_by)
        for n, (lane, ids) in enumerate(wanted):
            taken = taken_by.get(n, 0)
            if taken == 0:
                logger.warning("%s: %r (%s) overlaps ids in stock: not taken back",
                               self, ids, lane.label)
            with lane.lock:
                lane.given_back += taken
                lane.stored += 1
                lane.changed.notify_all()
        out: list[int] = []
        n = 0
        for _, ids, _ in items:
            if ids:
                out.append(taken_by.get(n, 0))
                n += 1
            else:
                out.append(0)
        return out

    def _give_back_part(
        self, wanted: list[tuple[TierLane, range]], start: int, taken_by: dict[int, int]
    ) -> None:
        """One transaction taking back ``wanted[start:start + TIER_CHUNK]`` (indexes into
        ``taken_by``)."""
        part = [(n, wanted[n]) for n in range(start, min(start + TIER_CHUNK, len(wanted)))]

        def work(conn: sa.Connection) -> None:
            for n, _ in part:
                taken_by.pop(n, None)
            keys = {lane.key for _, (lane, _) in part}
            states = self.store.lock(conn, keys)
            if len(states) < len(keys):
                raise NoState
            queued = self.store.queued(conn, list(states))
            moves = Moves()
            added: dict[Key, list[range]] = {}  # what this part queued, per lane
            for n, (lane, ids) in part:
                state = states[lane.key]
                held = [state.head, *(q.ids for q in queued[lane.key]),
                        *added.get(lane.key, ())]
                if any(share_an_id(ids, b) for b in held):
                    continue
                put_now = put(state, ids, GIVEN_BACK)
                added.setdefault(lane.key, []).extend(q.ids for q in put_now.added)
                moves += put_now
                state.given_back += len(ids)
                taken_by[n] = len(ids)
            self.store.write(conn, states.values())
            self.store.add(conn, moves.added)

        self.db.transaction([lane for _, (lane, _) in part], work)

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id issued from now on be above ``floor`` (ids known to be in use): the
        ranges in stock at or below it are dropped, upstream is told too, and blocks it offers
        at or below are refused. Returns whether anything was dropped or moved."""
        lane = self._lanes.get(sequence, bits)
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise TicketsError(f"a floor is a number of ids >= 0, not {floor!r}")
        with lane.lock:
            lane.floor = max(lane.floor, floor)

        def work(conn: sa.Connection) -> int:
            state = self.store.lock(conn, [lane.key]).get(lane.key)
            if state is None:
                raise NoState
            queued = self.store.queued(conn, [lane.key], upto=floor)[lane.key]
            dropped, moves = cut_below(state, queued, floor)
            if dropped:
                self.store.remove(conn, moves.gone)
                self.store.add(conn, moves.added)
                self.store.write(conn, [state])
            return dropped

        dropped: int = self.db.transaction([lane], work)
        if dropped:
            with lane.lock:
                lane.burned += dropped
            logger.warning("%s dropped %d ids of %s at or below %d from its stock: they are "
                           "in use", self, dropped, lane.label, floor)
        moved = ensure_above_in(self.upstream, lane.sequence, floor, lane.bits)
        return bool(dropped) or moved

    # -- management ---------------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the tier's tables in its database if they are not there (and add the columns
        an older release's tables lack)."""
        self.db.create_tables()

    def describe(self) -> list[TierStatus]:
        """Every sequence in this tier's database: stock, shared rate, runway, claim."""
        return describe(self.own, self.names)

    def stats(self) -> dict[str, Any]:
        """This process's counters, in total and per sequence (keyed ``name/bits``)."""
        keys = (
            "issued", "round_trips", "upstream_round_trips", "refills", "refilled", "claims",
            "claims_lost", "burned", "given_back", "blocking_waits", "failures", "rewinds",
        )
        per: dict[str, dict[str, Any]] = {}
        for lane in self._lanes.distinct():
            with lane.lock:
                figures: dict[str, Any] = {key: getattr(lane, key) for key in keys}
                figures["error"] = None if lane.error is None else str(lane.error)
            per[lane.label] = figures
        total: dict[str, Any] = {key: sum(p[key] for p in per.values()) for key in keys}
        total["rewinds"] += self.db.rewinds
        # Rewinds upstream healed itself are counted there: one figure for the whole path.
        beneath = getattr(self.upstream, "stats", None)
        found = beneath().get("rewinds", 0) if callable(beneath) else 0
        total["rewinds"] += found if isinstance(found, int) else 0
        total["threads"] = self._refiller.threads()
        total["sequences"] = per
        return total

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no refill of this process is running or due (for tests and shutdowns)."""
        return self._refiller.wait_idle(timeout)

    def close(self) -> None:
        """Stop refilling (a block on its way is stored first, within twice ``timeout``; claims
        are released). No id is lost: the stock stays in the database. The tier still takes ids
        back and hands out what is in stock afterwards (a cache closed later gives its ids
        back here), but refills no more."""
        if self._closed.is_set():
            return
        self._closed.set()
        for lane in self._lanes.distinct():
            with lane.lock:
                lane.changed.notify_all()
        # A block on its way lands and is stored within about one round trip each way. A
        # refill hung on upstream is left behind rather than hold the exit back: at worst its
        # block is burned, and its claim runs out by itself after claim_timeout.
        if not self._refiller.close(2 * self.timeout):
            logger.warning("%s: a refill still waits on upstream after close(); its claim runs "
                           "out within %g s", self, self.claim_timeout)
        self.own.dispose()

    def __enter__(self) -> DatacenterTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        # The parent's sockets and threads are not the child's; the stock is in the database.
        self.own.dispose(close=False)
        self._reset_state()

    # -- internals: taking ids ---------------------------------------------------------------

    def _take(self, lane: TierLane, count: int) -> tuple[range | None, bool]:
        """Up to ``count`` ids from the stock: the block (``None``: the stock is empty) and
        whether upstream said the sequence is exhausted."""
        for _ in range(_TAKE_ATTEMPTS):
            guard = self.db.guard
            taken: Taken | None = self.db.transaction(
                [lane], functools.partial(self.store.take, key=lane.key, count=count,
                                          guard=guard),
                transaction=False,
            )
            if taken is None:
                # Why not: a new head to make from the stock, a moved database, or none left.
                taken, again, exhausted = self.db.transaction(
                    [lane], lambda conn: self._next_head(conn, lane, count)
                )
                if taken is None:
                    if again:
                        continue
                    with lane.lock:
                        lane.round_trips += 1
                    self._look_after(lane, None)
                    return None, exhausted
            with lane.lock:
                lane.round_trips += 1
                lane.issued += len(taken.block)
            self._look_after(lane, taken)
            return taken.block, False
        raise TicketServerUnavailable(
            f"{self}: the stock of {lane.label} changed under every one of {_TAKE_ATTEMPTS} "
            "takes; try again"
        )

    def _next_head(
        self, conn: sa.Connection, lane: TierLane, count: int
    ) -> tuple[Taken | None, bool, bool]:
        """The take found no ids in the head (in a transaction): make the next queued range
        the head. Returns ``(ids taken here, take again, exhausted)``."""
        state = self.store.lock(conn, [lane.key]).get(lane.key)
        if state is None:
            raise NoState
        if self.db.guard is not None and state.guard != self.db.guard:
            raise Moved  # restored or failed over since the last check: nothing taken
        if state.head:
            return None, True, False  # another process made one already
        first = self.store.first_queued(conn, lane.key)
        if first is None:
            if state.stock != 0:
                # The count disagrees with the rows (tables edited by hand): the rows win.
                state.stock = 0
                self.store.write(conn, [state])
            return None, False, bool(state.exhausted)
        block, moves = next_head(state, first, count)
        self.store.remove(conn, moves.gone)
        self.store.add(conn, moves.added)
        self.store.write(conn, [state])
        if not block:
            return None, True, False  # a head now: take from it
        return Taken(block, state.stock, state.rate, state.rate_at, False, state.now), False, False

    def _take_many(
        self, conn: sa.Connection, takes: list[tuple[TierLane, int]]
    ) -> list[range | None]:
        """A block from the stock of each lane, in one transaction (``None``: empty)."""
        keys = {lane.key for lane, _ in takes}
        states = self.store.lock(conn, keys)
        if len(states) < len(keys):
            raise NoState
        for state in states.values():
            if self.db.guard is not None and state.guard != self.db.guard:
                raise Moved
        empty = [key for key, state in states.items() if not state.head and state.stock > 0]
        # One read for every lane without a head (all of them, on first contact).
        firsts = {key: ranges[0] for key, ranges in self.store.queued(conn, empty).items()
                  if ranges}
        moves = Moves()
        out: list[range | None] = []
        for lane, count in takes:
            state = states[lane.key]
            if not state.head:
                moves += promote(state, firsts.pop(lane.key, None))
                if not state.head:  # none, or the last ids of the space: from the stock
                    out.append(None)
                    continue
            block = take_from_head(state, count)
            out.append(block or None)
            with lane.lock:
                lane.round_trips += 1
                lane.issued += len(block)
        self.store.remove(conn, moves.gone)
        self.store.add(conn, moves.added)
        self.store.write(conn, states.values())
        for lane, _ in takes:
            state = states[lane.key]
            self._look_after(lane, Taken(range(0), state.stock, state.rate, state.rate_at,
                                         bool(state.exhausted), state.now))
        return out

    def _look_after(self, lane: TierLane, taken: Taken | None) -> None:
        """After a take: have the refill threads look at the stock when it is low, or when the
        shared rate is due a sample."""
        if self._closed.is_set():
            return
        if taken is None:
            self._refiller.wake(lane, runway=0.0)
            return
        low = self.sizing.low(taken.rate, lane.bits)
        if taken.stock < low or taken.now - taken.rate_at >= RATE_INTERVAL_MS:
            self._refiller.wake(lane, runway=runway(taken.stock, taken.rate))


@_process.at_exit
def _close_all() -> None:
    # Caches closed after this still give their ids back: a closed tier takes them.
    for tier in _process.tracked(DatacenterTier):
        tier.close()
