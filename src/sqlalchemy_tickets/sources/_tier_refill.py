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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .._naming import TicketTable
from ..errors import DatabaseUnavailable, ExhaustedError, TicketsError
from . import _rewind
from ._sizing import next_rate
from ._tier_store import Key, Queued, State, headable
from .base import KeepsAbove, Request, blocks_from, ensure_above_in

if TYPE_CHECKING:
    from .datacenter import DatacenterTier

logger = logging.getLogger("sqlalchemy_tickets")

#: Shortest interval between two samples of the shared rate (database clock, ms).
RATE_INTERVAL_MS = 1000

#: Times a batch of blocks from upstream is offered to the database before it counts as burned.
_STORE_ATTEMPTS = 3

#: Seconds before a sequence another process refills is looked at again.
_BUSY_LOOK = 1.0

#: Longest pause between two attempts to release refill claims.
_RELEASE_PAUSE = 0.5


class MissingTables(Exception):
    """The tier's tables are not there (raised inside a unit, handled by its caller)."""


class NoState(Exception):
    """A sequence has no state row yet."""


class Moved(Exception):
    """The tier's database is not the one this process last saw (restored, failed over)."""


def sequence_name(sequence: str | None) -> str:
    """The ``sequence_name`` column's value: Flickr's tables (``None``) are ``''``."""
    return "" if sequence is None else sequence


@dataclass(eq=False)
class Lane:
    """One (sequence, bits) of this process: its counters and waiters (under ``lock``)."""

    sequence: str | None
    bits: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False  # its state row is known to exist
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
    #: Notified for callers waiting on an empty stock (a block stored, a range given back, a
    #: refill failed, closed).
    arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.arrived = threading.Condition(self.lock)

    @property
    def name(self) -> str:
        return sequence_name(self.sequence)

    @property
    def key(self) -> Key:
        return self.name, self.bits

    @property
    def label(self) -> str:
        return f"{self.sequence or 'Tickets'}/{self.bits}"


@dataclass
class _Refill:
    """One lane's refill in progress, in a refill thread."""

    lane: Lane
    size: int
    got: int = 0
    claimed_at: int = 0

    @property
    def left(self) -> int:
        return self.size - self.got


class TierRefills:
    """The refill jobs of one :class:`~sqlalchemy_tickets.DatacenterTier`."""

    def __init__(self, tier: DatacenterTier) -> None:
        self.tier = tier

    def __repr__(self) -> str:
        return repr(self.tier)

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
        state.rate = next_rate(state.rate, measured, elapsed, self.tier.window)
        state.rate_at, state.rate_count = now, state.issued

    def run(self, lanes: list[Lane]) -> None:
        """Claim, bring blocks from upstream, store them, release — for several sequences at
        once. Lanes that failed last time go alone, so that one stalled sequence does not hold
        back the others."""
        if self.tier._closed.is_set():
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
                    self.tier._refiller.defer(lane, self.tier.max_backoff)

    def _refill_group(self, lanes: list[Lane]) -> None:
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
            self.tier._refiller.wake(lane)

    def _claim(self, lanes: list[Lane]) -> list[_Refill]:
        """Claim the refills of the lanes whose stock is low and that nobody else refills
        (sampling the shared rate on the way); the claimed, with how many ids to bring.
        Lanes another process refills are looked at again once its claim is void."""
        wanted = {lane.key: lane.wanted for lane in lanes}
        busy: list[tuple[Lane, float]] = []

        def work(conn: sa.Connection) -> list[_Refill]:
            busy.clear()
            states = self.tier.store.lock(conn, wanted)
            if len(states) < len(wanted):
                raise NoState
            claimed: list[_Refill] = []
            for lane in lanes:
                state = states[lane.key]
                self.sample(state)
                stock, now = state.stock, state.now
                target = self.tier._target(state.rate, lane.bits)
                low = max(1, int(target * self.tier.low_water))
                need = wanted[lane.key]
                if stock >= low and stock >= need:
                    continue
                owner, until = state.claim_owner, state.claim_until
                if owner and owner != self.tier.owner and until > now:
                    busy.append((lane, (until - now) / 1000))
                    continue
                if owner and owner != self.tier.owner:
                    logger.warning("%s: taking over the refill claim of %s from %s (void for "
                                   "%.1f s)", self, lane.label, owner, (now - until) / 1000)
                size = max(target - stock, need - stock, self.tier.min_block)
                size = min(size, self.tier._budget(lane.bits) - stock)
                if size < 1:
                    continue
                state.claim_owner = self.tier.owner
                state.claim_until = now + int(self.tier.claim_timeout * 1000)
                claimed.append(_Refill(lane, size, claimed_at=now))
            self.tier.store.write(conn, states.values())
            return claimed

        try:
            claimed: list[_Refill] = self.tier._transaction(lanes, work)
        except DatabaseUnavailable as error:
            for lane in lanes:
                self.failed(lane, error, final=False)
            return []
        for lane, busy_for in busy:
            # Another process holds a live claim: look again soon (it usually stores and
            # releases within a round trip), at the latest once the claim is void.
            self.tier._refiller.defer(lane, max(min(busy_for, _BUSY_LOOK), self.tier.backoff))
        for refill in claimed:
            with refill.lane.lock:
                refill.lane.claims += 1
                refill.lane.claimed_at = refill.claimed_at
        return claimed

    def _tell_marks(self, lanes: list[Lane]) -> None:
        """A fresh process over a restored upstream server: the marks are the floor it heals
        above (it knows none of its own yet). Told once per lane per process."""
        if not lanes:
            return
        prefixes = {self._mark_prefix(lane): lane for lane in lanes}
        rows = self.tier.own.run(lambda conn: self.tier.store.marks_starting(conn, prefixes))
        highs: dict[int, int] = {}
        for row in rows:
            for prefix, lane in prefixes.items():
                if row.name.startswith(prefix) and row.last_id is not None:
                    highs[id(lane)] = max(highs.get(id(lane), 0), int(row.last_id))
        for lane in lanes:
            high = highs.get(id(lane), 0)
            if high:
                ensure_above_in(self.tier.upstream, lane.sequence, high, lane.bits)
            lane.told = True

    def _bring(self, claimed: list[_Refill]) -> list[Lane]:
        """Ask upstream for the claimed ids (many sequences per round trip where it serves
        many) and store them; the lanes whose refill completed."""
        going = list(claimed)
        done: list[Lane] = []
        while going and not self.tier._closed.is_set():
            asks: list[Request] = [
                (r.lane.sequence, min(r.left, self.tier.max_block), r.lane.bits) for r in going
            ]
            try:
                found = blocks_from(self.tier.upstream, asks)
            except TicketsError as error:
                found = [error] * len(going)
            arrived: list[tuple[_Refill, range]] = []
            still: list[_Refill] = []
            for refill, (_, ask, _), outcome in zip(going, asks, found, strict=True):
                lane = refill.lane
                if isinstance(outcome, range):
                    if len(outcome) == 0:
                        self.failed(lane, TicketsError(
                            f"{self.tier.upstream!r} returned an empty block"), final=False)
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
                                   "s)", self, lane.label, self.tier.claim_timeout)
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
                    f"{self.tier.upstream!r} returned {block!r}, which starts where a range in "
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
            states = self.tier.store.lock(conn, {refill.lane.key for refill, _ in arrived})
            if len(states) < len({refill.lane.key for refill, _ in arrived}):
                raise NoState
            names = {self._mark_name(refill.lane, block) for refill, block in arrived}
            marks = self.tier.store.marks(conn, names, lock=True)
            new_marks: dict[str, tuple[int, str]] = {}
            add: list[Queued] = []
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
                head, rest = headable(block)
                if not state.head and head:
                    state.set_head(head, 1)
                    block_rest = rest
                else:
                    block_rest = block
                if block_rest:
                    add.append(Queued(lane.key, 1, block_rest))
                n = len(block)
                state.stock += n
                state.refills += 1
                state.refilled += n
                state.refilled_at = state.now
                state.exhausted = 0
                mine = state.claim_owner == self.tier.owner
                if mine:
                    state.claim_until = state.now + int(self.tier.claim_timeout * 1000)
                outcomes.append((refill, "stored" if mine else "lost"))
            self.tier.store.add(conn, add)
            self.tier.store.write(conn, states.values())
            self.tier.store.write_marks(conn, new_marks, marks)

        lanes = [refill.lane for refill, _ in arrived]
        # The marks' rows made first, on their own: a transaction that locks a row not there
        # yet locks a gap (InnoDB), and two stores inserting into it deadlock.
        self._seed_marks({self._mark_name(refill.lane, block) for refill, block in arrived})
        for attempt in range(1, _STORE_ATTEMPTS + 1):
            try:
                self.tier._transaction(lanes, work)
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
                time.sleep(self.tier.backoff * attempt)
        stored = {id(refill) for refill, _ in outcomes}
        for refill, block in arrived:
            if id(refill) in stored:
                with refill.lane.lock:
                    refill.lane.refills += 1
                    refill.lane.refilled += len(block)
                    refill.lane.stored += 1
                    refill.lane.arrived.notify_all()
                refill.got += len(block)
        for refill, block, high in rewound:
            healed = self._upstream_rewound(refill.lane, block, high)
            outcomes.append((refill, "rewound" if healed else "refused"))
        return outcomes

    def _seed_marks(self, names: set[str]) -> None:
        try:
            self.tier._run(lambda conn: self.tier.store.seed_marks(conn, names),
                           transaction=False)
        except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
            logger.debug("%s: making mark rows failed (the store makes them): %s", self, error)

    def _release(self, lanes: list[Lane]) -> None:
        """Release the refill claims of ``lanes``, trying again until it works or the claims
        run out by themselves: a writer holding a state row past ``timeout`` (the release
        waits for its row lock, and is cut) must not leave the sequences unrefilled by every
        process until ``claim_timeout``."""
        state = self.tier.store.state
        keys = sorted({lane.key for lane in lanes})
        release = (
            sa.update(state)
            .where(
                state.c.sequence_name == sa.bindparam("k_name"),
                state.c.bits == sa.bindparam("k_bits"),
                state.c.claim_owner == self.tier.owner,
            )
            .values(claim_owner="", claim_until=0)
        )
        # In key order, as every writer of several rows locks them: two writers locking in
        # different orders would wait for each other.
        rows = [{"k_name": name, "k_bits": bits} for name, bits in keys]
        deadline = time.monotonic() + self.tier.claim_timeout
        pause = min(self.tier.backoff, _RELEASE_PAUSE)
        while True:
            try:
                self.tier._run(lambda conn: conn.execute(release, rows))
                return
            except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
                if isinstance(error, MissingTables) or time.monotonic() + pause >= deadline:
                    logger.warning("%s: releasing the refill claims of %s failed (they run out "
                                   "by themselves within %g s): %s", self,
                                   ", ".join(lane.label for lane in lanes[:3]),
                                   self.tier.claim_timeout, error)
                    return
                logger.debug("%s: releasing refill claims failed, again: %s", self, error)
            time.sleep(pause)
            pause = min(2 * pause, _RELEASE_PAUSE)

    def _mark_exhausted(self, lane: Lane) -> None:
        state = self.tier.store.state
        try:
            self.tier._run(lambda conn: conn.execute(
                sa.update(state).where(
                    state.c.sequence_name == lane.name, state.c.bits == lane.bits
                ).values(exhausted=1)
            ))
        except (sa_exc.DBAPIError, DatabaseUnavailable, MissingTables) as error:
            logger.warning("%s: recording that %s is exhausted failed: %s",
                           self, lane.label, error)

    def failed(self, lane: Lane, error: BaseException, *, final: bool) -> None:
        with lane.lock:
            lane.error = error
            lane.failures += 1
            failures = lane.failures
            lane.arrived.notify_all()
        (logger.error if final else logger.warning)(
            "%s: refill of %s from upstream failed (%d in a row): %s",
            self, lane.label, failures, error,
        )
        if not final:
            pause = min(self.tier.max_backoff, self.tier.backoff * 2 ** (failures - 1))
            self.tier._refiller.defer(lane, pause, runway=0.0)

    def _mark_prefix(self, lane: Lane) -> str:
        return f"upstream:{self.tier.names.state}:{lane.name}/{lane.bits}:"

    def _mark_name(self, lane: Lane, block: range) -> str:
        """The key of an upstream lane's high-water mark in the stamp table."""
        return f"{self._mark_prefix(lane)}{block.step}:{block.start % block.step}"

    def _upstream_rewound(self, lane: Lane, block: range, high: int) -> bool:
        """Upstream offered ``block``, at or below ``high``: it went back in time. The block is
        burned; upstream is told to move above ``high`` (heal: returns ``True``, ask again),
        or the lane's refills fail with :class:`RewindError` (refuse: ``False``)."""
        with lane.lock:
            lane.burned += len(block)
            lane.rewinds += 1
        table = TicketTable(lane.sequence, lane.bits, lane.name)
        _rewind.counted(table)
        seen = (f"{self.tier.upstream!r} offered ids {block.start}..{block[-1]}, at or below "
                f"{high}, the highest this datacenter tier stored from it")
        if self.tier.on_rewind == "refuse" or not isinstance(self.tier.upstream, KeepsAbove):
            self.failed(lane, _rewind.refusal(repr(self.tier.upstream), None, table, seen, [high]),
                         final=False)
            return False
        try:
            self.tier.upstream.ensure_above(lane.sequence, high, bits=lane.bits)
        except TicketsError as error:
            self.failed(lane, error, final=False)
            return False
        logger.warning("%s: %s went back in time upstream: %s; told it to move above %d: no id "
                       "is issued twice", self, table.label, seen, high)
        return True

