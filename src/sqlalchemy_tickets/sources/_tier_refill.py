"""The refills of a datacenter tier: claim, bring blocks from upstream, store them, release.

They run on the tier's refill threads (``_refill.py``), several sequences at once: one
transaction claims the refills of every sequence of the batch whose stock is low (sampling the
shared rate on the way), one round trip asks upstream for all their blocks where upstream serves
many, one transaction stores them (checking each against the highest id the tier ever stored
from its upstream lane: a lower one means upstream went back in time), and one statement
releases the claims. A sequence whose last refill failed goes alone, so that one stalled
sequence does not hold the others back. See :mod:`~sqlalchemy_tickets.sources.datacenter`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .._backoff import Backoff
from .._naming import TicketTable
from .._schema import tier_mark_prefix
from ..errors import DatabaseUnavailable, ExhaustedError, TicketsError
from . import _rewind
from ._lanes import FailurePolicy
from ._rewind import RewindPolicy
from ._sizing import StockSizing, next_rate
from ._tier_db import MissingTables, NoState, TierDatabase, TierLane
from ._tier_ledger import NEVER_ISSUED, Moves, put
from ._tier_store import State
from .base import KeepsAbove, Request, TicketSource, blocks_from, ensure_above_in

logger = logging.getLogger("sqlalchemy_tickets")

#: Shortest interval between two samples of the shared rate (database clock, ms).
RATE_INTERVAL_MS = 1000

#: Times a batch of blocks from upstream is offered to the database before it counts as burned.
_STORE_ATTEMPTS = 3

#: Seconds before a sequence another process refills is looked at again.
_BUSY_LOOK = 1.0

#: Longest pause between two attempts to release refill claims.
_RELEASE_PAUSE = 0.5


class Schedule(Protocol):
    """When a lane's refill runs (the tier's ``Refiller``)."""

    def wake(self, lane: TierLane, *, runway: float = ...) -> None: ...

    def defer(self, lane: TierLane, seconds: float, *, runway: float = ...) -> None: ...


@dataclass
class _Refill:
    """One lane's refill in progress, in a refill thread."""

    lane: TierLane
    size: int
    got: int = 0
    claimed_at: int = 0

    @property
    def left(self) -> int:
        return self.size - self.got


#: Lanes whose marks are looked for one by one when a refill tells upstream; more, and every
#: mark of the tier is read at once.
_MARK_LOOKS = 8


class TierRefills:
    """The refill jobs of one :class:`~sqlalchemy_tickets.DatacenterTier`, handed what they
    need.

    Args:
        db: the tier's database and its units of work.
        upstream: where blocks come from.
        sizing: how much the stock aims at.
        schedule: when each lane's refill runs again.
        failures: what a failed refill does.
        owner: who this process is in a claim row.
        claim_timeout: seconds a claim lasts without renewal.
        max_block: the most ids asked of upstream in one call.
        on_rewind: what to do when upstream offers ids the tier stored already.
        backoff: the pauses between attempts to store a block.
        closed: set once the tier is closed.
        name: how messages name the tier.
    """

    def __init__(
        self,
        db: TierDatabase,
        upstream: TicketSource,
        *,
        sizing: StockSizing,
        schedule: Schedule,
        failures: FailurePolicy[TierLane],
        owner: str,
        claim_timeout: float,
        max_block: int,
        on_rewind: RewindPolicy,
        backoff: Backoff,
        closed: threading.Event,
        name: Callable[[], str],
    ) -> None:
        self.db = db
        self.store = db.store
        self.upstream = upstream
        self.sizing = sizing
        self.schedule = schedule
        self.failures = failures
        self.owner = owner
        self.claim_timeout = claim_timeout
        self.max_block = max_block
        self.on_rewind = on_rewind
        self.backoff = backoff
        self._closed = closed
        self._name = name

    def __repr__(self) -> str:
        return self._name()

    def sample(self, state: State) -> None:
        """Take a sample of the shared rate into ``state`` (locked), if one is due."""
        now = state.now
        if state.rate_at <= 0 or now < state.rate_at:
            # The first sample, or the database's clock went back: start measuring again.
            state.rate_at, state.rate_count = now, state.issued
            return
        elapsed_ms = now - state.rate_at
        if elapsed_ms < RATE_INTERVAL_MS:
            return
        elapsed = elapsed_ms / 1000
        measured = (state.issued - state.rate_count) / elapsed
        state.rate = next_rate(state.rate, measured, elapsed, self.sizing.window)
        state.rate_at, state.rate_count = now, state.issued

    def run(self, lanes: list[TierLane]) -> None:
        """Claim, bring blocks from upstream, store them, release — for several sequences at
        once. Lanes that failed last time go alone, so that one stalled sequence does not hold
        back the others."""
        if self._closed.is_set():
            return
        together = [lane for lane in lanes if lane.failures == 0]
        for group in ([together] if together else []) + [[lane] for lane in lanes
                                                         if lane.failures]:
            try:
                self._refill_group(group)
            except Exception:  # a bug must not end refills for good
                logger.exception("%s: refill of %s failed", self,
                                 ", ".join(lane.label for lane in group))
                for lane in group:
                    self.schedule.defer(lane, self.backoff.cap)

    def _refill_group(self, lanes: list[TierLane]) -> None:
        claimed = self._claim(lanes)
        if not claimed:
            return
        try:
            self._tell_marks([r.lane for r in claimed if not r.lane.told])
            done = self._bring(claimed)
        except TicketsError as error:  # the tier's database, or upstream as a whole
            for refill in claimed:
                self.failed(refill.lane, error, final=False)
            return
        finally:
            self._release([r.lane for r in claimed])
        for lane in done:
            with lane.lock:
                lane.wanted = 0
                if lane.failures:
                    logger.info("%s: refills of %s work again", self, lane.label)
                lane.failures = 0
                lane.error = None
            # Look once more: the rate may have grown, or blocks came short.
            self.schedule.wake(lane)

    def _claim(self, lanes: list[TierLane]) -> list[_Refill]:
        """Claim the refills of the lanes whose stock is low and that nobody else refills
        (sampling the shared rate on the way); the claimed, with how many ids to bring.
        Lanes another process refills are looked at again once its claim is void."""
        wanted = {lane.key: lane.wanted for lane in lanes}
        busy: list[tuple[TierLane, float]] = []

        def work(conn: sa.Connection) -> list[_Refill]:
            busy.clear()
            states = self.store.lock(conn, wanted)
            if len(states) < len(wanted):
                raise NoState
            claimed: list[_Refill] = []
            for lane in lanes:
                state = states[lane.key]
                self.sample(state)
                stock, now = state.stock, state.now
                target = self.sizing.target(state.rate, lane.bits)
                low = self.sizing.low(state.rate, lane.bits)
                need = wanted[lane.key]
                if stock >= low and stock >= need:
                    continue
                owner, until = state.claim_owner, state.claim_until
                if owner and owner != self.owner and until > now:
                    busy.append((lane, (until - now) / 1000))
                    continue
                if owner and owner != self.owner:
                    logger.warning("%s: taking over the refill claim of %s from %s (void for "
                                   "%.1f s)", self, lane.label, owner, (now - until) / 1000)
                size = max(target - stock, need - stock, self.sizing.min_block)
                size = min(size, self.sizing.budget(lane.bits) - stock)
                if size < 1:
                    continue
                state.claim_owner = self.owner
                state.claim_until = now + int(self.claim_timeout * 1000)
                claimed.append(_Refill(lane, size, claimed_at=now))
            self.store.write(conn, states.values())
            return claimed

        try:
            claimed: list[_Refill] = self.db.transaction(lanes, work)
        except DatabaseUnavailable as error:
            for lane in lanes:
                self.failed(lane, error, final=False)
            return []
        for lane, busy_for in busy:
            # Another process holds a live claim: look again soon (it usually stores and
            # releases within a round trip), at the latest once the claim is void.
            self.schedule.defer(lane, max(min(busy_for, _BUSY_LOOK), self.backoff.first))
        for refill in claimed:
            with refill.lane.lock:
                refill.lane.claims += 1
                refill.lane.claimed_at = refill.claimed_at
        return claimed

    def _tell_marks(self, lanes: list[TierLane]) -> None:
        """A fresh process over a restored upstream server: the marks are the floor it heals
        above (it knows none of its own yet). Told once per lane per process."""
        if not lanes:
            return
        prefixes = {self._mark_prefix(lane): lane for lane in lanes}
        # A look per lane where there are a few; else one for every mark of the tier (a look
        # by name prefix is a scan of the stamp table: one per lane grows as lanes squared).
        looks = list(prefixes) if len(prefixes) <= _MARK_LOOKS else [
            tier_mark_prefix(self.db.names)]
        rows = self.db.own.run(lambda conn: self.store.marks_starting(conn, looks))
        highs: dict[int, int] = {}
        for row in rows:
            lane = prefixes.get(self._mark_prefix_of(row.name))
            if lane is not None and row.last_id is not None:
                highs[id(lane)] = max(highs.get(id(lane), 0), int(row.last_id))
        for lane in lanes:
            high = highs.get(id(lane), 0)
            if high:
                ensure_above_in(self.upstream, lane.sequence, high, lane.bits)
            lane.told = True

    def _bring(self, claimed: list[_Refill]) -> list[TierLane]:
        """Ask upstream for the claimed ids (many sequences per round trip where it serves
        many) and store them; the lanes whose refill completed."""
        going = list(claimed)
        done: list[TierLane] = []
        while going and not self._closed.is_set():
            asks: list[Request] = [
                (r.lane.sequence, min(r.left, self.max_block), r.lane.bits) for r in going
            ]
            try:
                found = blocks_from(self.upstream, asks)
            except TicketsError as error:
                found = [error] * len(going)
            arrived: list[tuple[_Refill, range]] = []
            still: list[_Refill] = []
            for refill, (_, ask, _), outcome in zip(going, asks, found, strict=True):
                lane = refill.lane
                if isinstance(outcome, range):
                    if len(outcome) == 0:
                        self.failed(lane, TicketsError(
                            f"{self.upstream!r} returned an empty block"), final=False)
                        continue
                    with lane.lock:
                        lane.upstream_round_trips += 1
                    arrived.append((refill, outcome))
                elif isinstance(outcome, ExhaustedError):
                    remaining = outcome.remaining
                    if remaining and remaining < ask:
                        refill.size = refill.got + remaining  # the sequence's last ids
                        still.append(refill)
                        continue
                    if refill.got == 0:
                        self._mark_exhausted(lane)
                    self.failed(lane, outcome, final=True)
                else:
                    self.failed(lane, outcome, final=False)
            for refill, stored in self._store(arrived):
                lane = refill.lane
                if stored in ("rewound", "stored"):
                    if refill.left > 0:
                        still.append(refill)
                    else:
                        done.append(lane)
                elif stored == "lost":
                    with lane.lock:
                        lane.claims_lost += 1
                    logger.warning("%s: refill claim of %s lost (it outlived claim_timeout=%g "
                                   "s)", self, lane.label, self.claim_timeout)
            going = still
        return done

    def _store(self, arrived: list[tuple[_Refill, range]]) -> list[tuple[_Refill, str]]:
        """Put blocks from upstream in stock (one transaction), renewing the claims; for each,
        ``"stored"``, ``"lost"`` (stored, but the claim is another's now), ``"rewound"`` (at
        or below what the tier stored from upstream: refused, upstream told) or ``"failed"``
        (the database did not take it: burned, logged)."""
        if not arrived:
            return []
        try:
            return self._store_together(arrived)
        except sa_exc.IntegrityError:
            if len(arrived) == 1:
                refill, block = arrived[0]
                with refill.lane.lock:
                    refill.lane.burned += len(block)
                self.failed(refill.lane, TicketsError(
                    f"{self.upstream!r} returned {block!r}, which starts where a range in "
                    "stock does: upstream issued ids twice; the block is not used"), final=False)
                return [(refill, "failed")]
            # One of them clashes with the stock: store them one by one to find which.
            return [outcome for one in arrived for outcome in self._store([one])]

    def _store_together(
        self, arrived: list[tuple[_Refill, range]]
    ) -> list[tuple[_Refill, str]]:
        outcomes: list[tuple[_Refill, str]] = []
        rewound: list[tuple[_Refill, range, int]] = []

        def work(conn: sa.Connection) -> None:
            outcomes.clear()
            rewound.clear()
            states = self.store.lock(conn, {refill.lane.key for refill, _ in arrived})
            if len(states) < len({refill.lane.key for refill, _ in arrived}):
                raise NoState
            names = {self._mark_name(refill.lane, block) for refill, block in arrived}
            marks = self.store.marks(conn, names, lock=True)
            new_marks: dict[str, tuple[int, str]] = {}
            moves = Moves()
            for refill, block in arrived:
                lane = refill.lane
                state = states[lane.key]
                key = self._mark_name(lane, block)
                row = marks.get(key)
                high = int(row.last_id or 0) if row is not None else 0
                set_at = int(row.stamp) if row is not None and str(row.stamp).isdigit() else 0
                if key in new_marks:
                    high, set_at = new_marks[key][0], int(new_marks[key][1])
                # Blocks of one lane come from upstream in increasing order, but are stored in
                # the order their refills finish: a refill that stalled past its claim stores a
                # block below the one its successor stored. The mark keeps when the refill
                # that set it was claimed (database clock, in ``stamp``): a lower block from a
                # refill claimed before that is late, not a rewind.
                late = block.start <= high and refill.claimed_at and refill.claimed_at < set_at
                if block[-1] == high and refill.claimed_at and set_at == refill.claimed_at:
                    # Stored already, by an attempt of this very store whose COMMIT's answer
                    # was lost (the connection was closed as it came back).
                    outcomes.append((refill, "stored"))
                    continue
                if block.start <= lane.floor or (block.start <= high and not late):
                    rewound.append((refill, block, max(high, lane.floor)))
                    continue
                if not late:
                    new_marks[key] = (block[-1], str(refill.claimed_at))
                moves += put(state, block, NEVER_ISSUED)
                n = len(block)
                state.refills += 1
                state.refilled += n
                state.refilled_at = state.now
                state.exhausted = 0
                mine = state.claim_owner == self.owner
                if mine:
                    state.claim_until = state.now + int(self.claim_timeout * 1000)
                outcomes.append((refill, "stored" if mine else "lost"))
            self.store.add(conn, moves.added)
            self.store.write(conn, states.values())
            self.store.write_marks(conn, new_marks, marks)

        lanes = [refill.lane for refill, _ in arrived]
        # The marks' rows made first, on their own: a transaction that locks a row not there
        # yet locks a gap (InnoDB), and two stores inserting into it deadlock.
        self._seed_marks({self._mark_name(refill.lane, block) for refill, block in arrived})
        for attempt in range(1, _STORE_ATTEMPTS + 1):
            try:
                self.db.transaction(lanes, work)
                break
            except DatabaseUnavailable as error:
                if attempt == _STORE_ATTEMPTS:
                    for refill, block in arrived:
                        with refill.lane.lock:
                            refill.lane.burned += len(block)
                        self.failed(refill.lane, error, final=False)
                    logger.error("%s: %d ids burned: the datacenter database did not take "
                                 "them", self, sum(len(b) for _, b in arrived))
                    return [(refill, "failed") for refill, _ in arrived]
                time.sleep(self.backoff.first * attempt)
        stored = {id(refill) for refill, _ in outcomes}
        for refill, block in arrived:
            if id(refill) in stored:
                with refill.lane.lock:
                    refill.lane.refills += 1
                    refill.lane.refilled += len(block)
                    refill.lane.stored += 1
                    refill.lane.changed.notify_all()
                refill.got += len(block)
        for refill, block, high in rewound:
            healed = self._upstream_rewound(refill.lane, block, high)
            outcomes.append((refill, "rewound" if healed else "refused"))
        return outcomes

    def _seed_marks(self, names: set[str]) -> None:
        try:
            self.db.run(lambda conn: self.store.seed_marks(conn, names),
                           transaction=False)
        except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
            logger.debug("%s: making mark rows failed (the store makes them): %s", self, error)

    def _release(self, lanes: list[TierLane]) -> None:
        """Release the refill claims of ``lanes``, trying again until it works or the claims
        run out by themselves: a writer holding a state row past ``timeout`` (the release
        waits for its row lock, and is cut) must not leave the sequences unrefilled by every
        process until ``claim_timeout``."""
        keys = [lane.key for lane in lanes]
        deadline = time.monotonic() + self.claim_timeout
        pause = min(self.backoff.first, _RELEASE_PAUSE)
        while True:
            try:
                self.db.run(lambda conn: self.store.release(conn, self.owner, keys))
                return
            except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
                if isinstance(error, MissingTables) or time.monotonic() + pause >= deadline:
                    logger.warning("%s: releasing the refill claims of %s failed (they run out "
                                   "by themselves within %g s): %s", self,
                                   ", ".join(lane.label for lane in lanes[:3]),
                                   self.claim_timeout, error)
                    return
                logger.debug("%s: releasing refill claims failed, again: %s", self, error)
            time.sleep(pause)
            pause = min(2 * pause, _RELEASE_PAUSE)

    def _mark_exhausted(self, lane: TierLane) -> None:
        try:
            self.db.run(lambda conn: self.store.mark_exhausted(conn, lane.key))
        except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
            logger.warning("%s: recording that %s is exhausted failed: %s",
                           self, lane.label, error)

    def failed(self, lane: TierLane, error: BaseException, *, final: bool) -> None:
        self.failures.failed(lane, error, final=final)

    def _mark_prefix(self, lane: TierLane) -> str:
        return f"{tier_mark_prefix(self.db.names)}{lane.name}/{lane.bits}:"

    def _mark_name(self, lane: TierLane, block: range) -> str:
        """The key of an upstream lane's high-water mark in the stamp table."""
        return f"{self._mark_prefix(lane)}{block.step}:{block.start % block.step}"

    @staticmethod
    def _mark_prefix_of(name: str) -> str:
        """The :meth:`_mark_prefix` of a mark's key: :meth:`_mark_name` without its
        ``step:offset``."""
        return name.rsplit(":", 2)[0] + ":"

    def _upstream_rewound(self, lane: TierLane, block: range, high: int) -> bool:
        """Upstream offered ``block``, at or below ``high``: it went back in time. The block is
        burned; upstream is told to move above ``high`` (heal: returns ``True``, ask again),
        or the lane's refills fail with :class:`RewindError` (refuse: ``False``)."""
        with lane.lock:
            lane.burned += len(block)
            # A retry of a refused one meets the same rewind: counted once.
            again = lane.refused
            if not again:
                lane.rewinds += 1
        table = TicketTable(lane.sequence, lane.bits, lane.name)
        if not again:
            _rewind.counted(table)
        seen = (f"{self.upstream!r} offered ids {block.start}..{block[-1]}, at or below "
                f"{high}, the highest this datacenter tier stored from it")
        if self.on_rewind == "refuse" or not isinstance(self.upstream, KeepsAbove):
            self.failed(lane, _rewind.refusal(repr(self.upstream), None, table, seen, [high]),
                         final=False)
            return False
        try:
            self.upstream.ensure_above(lane.sequence, high, bits=lane.bits)
        except TicketsError as error:
            self.failed(lane, error, final=False)
            return False
        logger.warning("%s: %s went back in time upstream: %s; told it to move above %d: no id "
                       "is issued twice", self, table.label, seen, high)
        return True

