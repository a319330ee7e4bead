"""HubSpot-style caching of ticket ids: blocks taken ahead of need, refilled in the background.

Each (sequence, bits) has a *lane*. A lane holds the ids it was given as blocks (``range``s): a
queue of blocks taken ahead, the rest of the block being handed out, and a *chunk* of that
block ready for ``next_id`` as a ``range`` iterator. ``next_id`` calls the chunk's ``__next__``
and nothing else — one atomic step under the GIL, so the hot path takes no lock, and a chunk
costs the same memory whatever its length. When a chunk runs out, the slow path carves the next
one under the lane's lock; that is where the rate is measured, and where a background refill
starts when the ids in hand fall under the low-water mark. A chunk ends at that mark, so the
check comes exactly when it is due, and a quiet lane is as fast as a busy one.

Sizing (``_sizing.py``) follows VTickets: ``supply`` seconds of ids at an exponentially
weighted request rate, within ``min_block``..``max_block`` and the waste budget — the most ids
a crash may burn. A refill brings one such block when the lane falls to half of it, so under a
steady rate a lane rides out an outage of its source for about ``supply / 2`` seconds (less where
``max_block``, the budget or what the lane has issued so far caps the block).
Refills of every lane run on one small pool of threads (``_refill.py``), the lanes with the
shortest runway first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import _process
from .._backoff import Backoff
from .._deprecation import warn_renamed
from .._naming import check_bits, normalize_sequence
from ..errors import ExhaustedError, TicketsError, TicketServerUnavailable
from . import _open
from ._cache_lane import CacheLane as _Lane
from ._lanes import FailurePolicy, LaneMap, reaches_callers
from ._options import check_budget, check_sizing, check_workers
from ._refill import Refiller
from ._sizing import RATE_INTERVAL, Sizing, budget_of, next_rate, runway
from .base import (
    Request,
    TakesMany,
    TicketSource,
    above,
    blocks_from,
    check_count,
    check_ids,
    coalesce,
    ensure_above_in,
    give_back_all,
    give_back_to,
    prepare_in,
)

logger = logging.getLogger("sqlalchemy_tickets")

#: Most ids in one chunk: what ``close`` or a ``next_block`` takes out of a chunk in one atomic
#: step is materialized, so it stays modest.
MAX_CHUNK = 16_384

#: Most lanes refilled in one round trip, where the source serves many at once.
REFILL_BATCH = 64

class CachedSource:
    """A cache in front of any ticket source (a server, servers, a tier, or another cache).

    Args:
        source: where blocks come from (called in background threads, and by :meth:`prepare`).
        min_block: smallest block asked for (a lane's first block).
        max_block: largest block asked for.
        supply: seconds of ids, at the recent rate, that one block should last; a lane refills
            when it holds half of that, so it rides out an outage of ``source`` of about
            ``supply / 2`` seconds at a steady rate (less where ``max_block``, the budget or
            what the lane has issued so far caps the block).
        window: seconds over which the rate estimate forgets a spike (HubSpot: 15 minutes).
        waste_budget: the most ids a lane holds at once — what a crash (SIGKILL, out of memory)
            can burn, since a clean exit gives them back: an ``int`` (ids), or a ``float`` in
            (0, 1) (a share of what is left of the sequence's id space). Everything counts: the
            chunk, the rest of the block, the blocks taken ahead, the refill in flight, and what
            a large ``next_block`` asked for (it gets fewer rather than pass it).
        timeout: seconds a caller may wait when the cache is empty before
            :class:`TicketServerUnavailable` is raised (and that :meth:`close` waits for a
            block still on its way).
        backoff: first pause after a failed refill, doubling up to ``max_backoff``.
        clock: monotonic clock (a parameter so tests can drive the rate estimate); every
            deadline of the cache (waits for ids, :meth:`wait_idle`, :meth:`close`) is read on it.
        max_workers: refill threads, for all lanes together (refills of one lane never overlap).
        waste_ratio: deprecated, no effect (a crash's burn is bounded by ``waste_budget``; a
            clean exit gives every id held back).
    """

    def __init__(
        self,
        source: TicketSource,
        *,
        min_block: int = 16,
        max_block: int = 100_000,
        supply: float = 30.0,
        window: float = 900.0,
        waste_budget: int | float = 0.001,
        timeout: float = 2.0,
        backoff: float = 0.1,
        max_backoff: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 4,
        waste_ratio: float | None = None,
    ) -> None:
        if not isinstance(source, TicketSource):
            raise TicketsError(f"{source!r} is not a ticket source (needs next_id, next_block)")
        check_sizing(min_block=min_block, max_block=max_block, supply=supply, window=window,
                     timeout=timeout)
        check_budget(waste_budget, at_least=2, what="the id space left")
        check_workers(max_workers, "max_workers")
        if waste_ratio is not None:
            warn_renamed("CachedSource(waste_ratio=...)", "waste_budget= (it no longer has "
                         "any effect: a clean exit gives every id held back)")
        self.source = source
        self.min_block = min_block
        self.max_block = max_block
        self.supply = float(supply)
        self.window = float(window)
        self.waste_budget = waste_budget
        self.timeout = float(timeout)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.sizing = Sizing(self.supply, self.window, min_block, max_block)
        self._failures: FailurePolicy[_Lane] = FailurePolicy(
            lambda: repr(self), Backoff(self.backoff, self.max_backoff),
            lambda lane, pause: self._refiller.defer(lane, pause, runway=0.0),
        )
        self._clock = clock
        self._max_workers = max_workers
        # Without the GIL a chunk's ``__next__`` is not one atomic step: every call locks.
        self._lock_free = _process.gil_enabled()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._reset_state()
        _open.register(self)
        _process.track(self)

    def _reset_state(self) -> None:
        self._lanes: LaneMap[_Lane] = LaneMap(
            lambda name, bits: _Lane(name, bits, rate_time=self._clock()), self._spelled
        )
        # The hot path: each lane's chunk's ``__next__``, keyed as callers spell the sequence.
        self._next64: dict[str | None, Callable[[], int]] = {}
        self._next: dict[tuple[str | None, int], Callable[[], int]] = {}
        batch = REFILL_BATCH if isinstance(self.source, TakesMany) else 1
        self._refiller: Refiller[_Lane] = Refiller(
            self._refill, name="tickets-refill", workers=self._max_workers, batch=batch,
            clock=self._clock,
        )

    def __repr__(self) -> str:
        return f"CachedSource({self.source!r})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: a closed cache issues nothing."""
        return self._closed.is_set()

    # -- the source protocol ------------------------------------------------------------------

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """One id, from memory unless the cache is empty."""
        try:
            # Keyed by the name alone for 64 bits: hashing a (name, bits) tuple per call would
            # cost more than the rest of this method.
            if bits == 64:
                return self._next64[sequence]()
            return self._next[sequence, bits]()
        except (KeyError, StopIteration):
            return self._next_id_slow(sequence, bits)

    async def next_id_async(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """:meth:`next_id` for asyncio code: from memory, or awaited in a worker thread when the
        cache is empty, so the event loop never waits on a round trip."""
        try:
            return self._next[sequence, bits]()
        except (KeyError, StopIteration):
            import asyncio  # here: most processes never need the event loop machinery

            return await asyncio.to_thread(self._next_id_slow, sequence, bits)

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """Up to ``count`` consecutive ids (fewer if the block in hand has fewer; never none).

        The ids ready for :meth:`next_id` go first, so that one thread mixing both calls on one
        lane gets increasing ids (over a source whose blocks increase: one server, or a cache
        over one).
        """
        check_count(count, bits)  # a count beyond the id space: ExhaustedError, nothing asked
        lane = self._lane(sequence, bits)
        with lane.lock:
            # The refill in flight counts: asking for its ids again would leave them held.
            shortfall = count - lane.in_hand - lane.pending
            if shortfall > 0:
                # A large flush or executemany: size the next refill for what it still needs,
                # rather than wait on refills sized for single ids. Refills stay one at a time,
                # so the lane's ids keep their order.
                lane.wanted = max(lane.wanted, shortfall)
            while True:
                taken = lane.take_chunk(count)
                if taken and not lane.ready and len(taken) < count and lane.rest and (
                    lane.rest.step == taken.step and lane.rest.start == taken[-1] + taken.step
                ):
                    # The chunk ran out: carry on into the rest of its block.
                    more = lane.rest[: count - len(taken)]
                    lane.rest = lane.rest[len(more) :]
                    lane.carved += len(more)
                    taken = range(taken.start, more[-1] + more.step, more.step)
                elif not taken and (lane.rest or lane.ahead):
                    if not lane.rest:
                        lane.rest = lane.ahead.popleft()
                    taken = lane.rest[:count]
                    lane.rest = lane.rest[count:]
                    lane.carved += len(taken)
                if taken:
                    lane.last_issued = max(lane.last_issued, taken[-1])
                    self._observe(lane)
                    return taken
                self._wait_for_ids(lane)

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """:meth:`next_block` for each ``(sequence, count, bits)``, from memory (a cache above
        refilling many lanes at once)."""
        out: list[range | TicketsError] = []
        for sequence, count, bits in requests:
            try:
                out.append(self.next_block(sequence, count, bits=bits))
            except TicketsError as error:
                out.append(error)
        return out

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None:
        """Get ``sequences`` ready before their first ids are asked for: the source prepares
        them (tables made if missing, first contact), then every lane that holds nothing takes
        its first block — as few round trips as the source allows (one per batch of sequences
        where it serves many at once, such as a :class:`TicketServer` or a
        :class:`DatacenterTier`), instead of one blocking wait per sequence.

        Raises the first :class:`TicketsError` a sequence met (the others keep their blocks).
        """
        check_bits(bits)
        names = list(dict.fromkeys(normalize_sequence(s) for s in sequences))
        if self._closed.is_set():
            raise TicketsError(f"{self!r} is closed")
        prepare_in(self.source, names, bits)
        lanes = [self._lane(name, bits) for name in names]
        wanted: list[tuple[_Lane, int]] = []
        for lane in lanes:
            with lane.lock:
                if lane.in_hand or lane.refilling:
                    continue
                size = min(self.min_block, self._budget(lane))
                lane.refilling, lane.pending = True, size
                lane.asked_at = self._clock()
                lane.block_size = size
            wanted.append((lane, size))
        first: TicketsError | None = None
        for start in range(0, len(wanted), REFILL_BATCH * 16):
            batch = wanted[start : start + REFILL_BATCH * 16]
            failed = self._take_blocks(batch, time.perf_counter())
            if failed is not None and first is None:
                first = failed
        if first is not None:
            raise first

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ids this cache issued and nobody used (a cache above closing); returns
        how many were taken back.

        Open, the cache puts them back into the lane, ahead of the ids it holds that came
        later: they are issued again first, so one thread keeps getting increasing ids where
        it can. Closed, it passes them on to its own source (``0`` if that cannot take them).
        """
        check_ids(ids, bits)
        if not ids:
            return 0
        check_bits(bits)
        lane = self._lane(sequence, bits)
        with lane.lock:
            # Checked under the lane's lock, after the lane exists: a close that starts later
            # finds the lane and harvests these ids with the rest.
            if not self._closed.is_set():
                held = lane.take_all()
                # Before the first block that starts above them: older ids first.
                at = next((i for i, b in enumerate(held) if b.start > ids.start), len(held))
                held.insert(at, ids)
                merged: list[range] = []
                for block in held:
                    last = merged[-1] if merged else None
                    if last is not None and last.step == block.step and (
                        last[-1] + last.step == block.start
                    ):
                        merged[-1] = range(last.start, block[-1] + block.step, block.step)
                    else:
                        merged.append(block)
                lane.rest = merged[0]
                lane.ahead.extend(merged[1:])
                lane.taken_back += len(ids)
                lane.changed.notify_all()
                return len(ids)
        taken = give_back_to(self.source, lane.sequence, ids, lane.bits)
        with lane.lock:
            lane.given_back += taken
        return taken

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id issued from now on be above ``floor`` (ids known to be in use): the
        ids held at or below it are dropped (counted as burned), and the source is told
        too. Returns whether anything was dropped or moved."""
        check_bits(bits)
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise TicketsError(f"a floor is a number of ids >= 0, not {floor!r}")
        lane = self._lane(sequence, bits)
        with lane.lock:
            dropped = 0
            if floor > lane.floor:
                lane.floor = floor
                held = lane.take_all()
                kept = [above(block, floor) for block in held]
                dropped = sum(map(len, held)) - sum(map(len, kept))
                kept = [block for block in kept if block]
                lane.burned += dropped
                lane.rest = kept[0] if kept else range(0)
                lane.ahead.extend(kept[1:])
                lane.changed.notify_all()
        if dropped:
            logger.warning("%s dropped %d ids of %s/%d at or below %d: they are in use",
                           self, dropped, lane.sequence or "Tickets", bits, floor)
        moved = ensure_above_in(self.source, lane.sequence, floor, bits)
        return bool(dropped) or moved

    # -- management ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and estimates, in total and per sequence (keyed ``name/bits``).

        ``in_hand`` (plus ``in_flight``) is what a crash would burn now; ``runway`` the seconds
        it lasts at ``rate`` with the source down."""
        per: dict[str, dict[str, Any]] = {}
        now = self._clock()
        for lane in self._distinct_lanes():
            with lane.lock:
                in_hand = lane.in_hand
                rate = self._rate_now(lane, now)
                per[f"{lane.sequence or 'Tickets'}/{lane.bits}"] = {
                    "issued": lane.issued,
                    "round_trips": lane.round_trips,
                    "blocking_waits": lane.blocking_waits,
                    "refills": lane.refills,
                    "block_size": lane.block_size,
                    "in_hand": in_hand,
                    "in_flight": lane.pending,
                    "rate": rate,
                    "runway": runway(in_hand, rate),
                    "refill_latency": lane.latency,
                    "burned": lane.burned,
                    "given_back": lane.given_back,
                    "taken_back": lane.taken_back,
                    "failures": lane.failures,
                    "last_issued": lane.last_issued,
                }
        total: dict[str, Any] = {
            key: sum(s[key] for s in per.values())
            for key in (
                "issued", "round_trips", "blocking_waits", "refills", "in_hand", "in_flight",
                "burned", "given_back", "taken_back",
            )
        }
        # Rewinds are seen (and healed) by the source beneath: its count, for one place to look.
        beneath = getattr(self.source, "stats", None)
        found = beneath().get("rewinds", 0) if callable(beneath) else 0
        total["rewinds"] = found if isinstance(found, int) else 0
        total["rate"] = sum(s["rate"] for s in per.values())
        total["block_size"] = max((s["block_size"] for s in per.values()), default=0)
        total["threads"] = self._refiller.threads()
        total["sequences"] = per
        return total

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no refill is in flight (for tests and orderly shutdowns)."""
        clock = self._clock
        deadline = None if timeout is None else clock() + timeout
        for lane in self._distinct_lanes():
            with lane.lock:
                while lane.refilling:
                    left = None if deadline is None else deadline - clock()
                    if left is not None and left <= 0:
                        return False
                    lane.changed.wait(left)
        return True

    def close(self) -> int:
        """Stop refilling and give the ids in hand back to the source where it can take them;
        returns (and logs) how many were burned.

        Everything the cache holds goes back — the chunk, the rest of the block being handed
        out, blocks taken ahead, and a block still on its way (waited for, up to ``timeout``)
        — as few ranges as possible, the last one first (a ticket server takes back only its
        latest block), in one round trip for all lanes where the source takes many at once.
        Burned: what was held and not taken back, plus a block still on its way after the
        wait (given back when it lands; ``stats()`` then counts it).
        """
        with self._close_lock:
            if self._closed.is_set():
                return 0
            self._closed.set()
        # A block on its way belongs to the cache: let it land so it can go back too. Refills
        # waiting out a back-off are not run any more.
        self._refiller.close(self.timeout)
        lanes = self._distinct_lanes()
        items: list[tuple[str | None, range, int]] = []
        owners: list[_Lane] = []
        late = 0
        for lane in lanes:
            with lane.lock:
                held = lane.take_all()
                lane.harvested = True
                if lane.refilling and not self._refiller.scheduled(lane):
                    lane.refilling, lane.pending = False, 0  # a back-off that will not run
                lane.late = lane.pending if lane.refilling else 0
                late += lane.late
                lane.changed.notify_all()
            for run in reversed(coalesce(held)):  # the highest first
                items.append((lane.sequence, run, lane.bits))
                owners.append(lane)
        taken = give_back_all(self.source, items)
        burned = late
        per_lane: dict[int, list[int]] = {}
        for lane, (_, ids, _), n in zip(owners, items, taken, strict=True):
            with lane.lock:
                lane.burned += len(ids) - n
                lane.given_back += n
            burned += len(ids) - n
            figures = per_lane.setdefault(id(lane), [0, 0])
            figures[0] += n
            figures[1] += len(ids) - n
        given = sum(taken)
        if items or late:
            logger.info(
                "closing %r: %d ids given back, %d burned over %d lanes%s",
                self, given, burned - late, len(per_lane),
                f", {late} still on their way" if late else "",
            )
        _open.retire(self)
        return burned

    def _after_fork_in_child(self) -> None:
        # A child holding its parent's ids would issue them a second time: drop them, with
        # every lock and thread, which did not survive the fork anyway.
        self._reset_state()

    def __enter__(self) -> CachedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals: lanes ---------------------------------------------------------------------

    def _distinct_lanes(self) -> list[_Lane]:
        """Each lane once (a lane is listed under every spelling callers used)."""
        return self._lanes.distinct()

    def _lane(self, sequence: str | None, bits: int) -> _Lane:
        return self._lanes.get(sequence, bits)

    def _spelled(self, lane: _Lane, key: str | None) -> None:
        # The caller's spelling maps to the same lane: "Photos" and "photos" are one.
        lane.keys.append(key)
        self._install(lane, key)

    def _install(self, lane: _Lane, key: str | None) -> None:
        """Point the hot path of spelling ``key`` at the lane's chunk (free-threaded builds:
        nowhere, so every call takes the lane's lock)."""
        if not self._lock_free:
            return
        step = lane.chunk.__next__
        self._next[key, lane.bits] = step
        if lane.bits == 64:
            self._next64[key] = step

    def _next_id_slow(self, sequence: str | None, bits: int) -> int:
        lane = self._lane(sequence, bits)
        with lane.lock:
            while True:
                found = next(lane.chunk, None)  # another thread may have carved a chunk
                if found is not None:
                    return found
                if not lane.rest and lane.ahead:
                    lane.rest = lane.ahead.popleft()
                if lane.rest:
                    # The rate first: the chunk ends at the low-water mark it gives.
                    self._observe(lane, refill=False)
                    self._carve(lane)
                    self._observe(lane)
                    continue
                self._wait_for_ids(lane)

    def _carve(self, lane: _Lane) -> None:
        """Make the next chunk from the rest of the block (lock held): the ids down to the
        low-water mark, so the slow path comes back exactly when a refill is due; below it
        (the refill asked for), the rest of the block."""
        low = self._low_water(lane)
        size = lane.in_hand - low if lane.in_hand > low else len(lane.rest)
        chunk = lane.rest[: min(size, MAX_CHUNK)]
        lane.rest = lane.rest[len(chunk) :]
        lane.chunk = iter(chunk)
        lane.chunk_step = chunk.step
        lane.moved += len(chunk)
        lane.last_issued = max(lane.last_issued, chunk[-1])
        for key in lane.keys:
            self._install(lane, key)

    def _wait_for_ids(self, lane: _Lane) -> None:
        """The lane is empty: wait (with its lock held by the caller) for a refill."""
        if self._closed.is_set():
            raise TicketsError(f"{self!r} is closed")
        lane.blocking_waits += 1
        clock = self._clock
        deadline = clock() + self.timeout
        if lane.error is not None and not lane.refilling:
            lane.error = None
        self._start_refill(lane)
        # A refill waiting out a back-off runs now: a caller is waiting for it.
        self._refiller.hurry(lane, 0.0)
        while not (lane.rest or lane.ahead or lane.ready):
            if reaches_callers(lane.error):
                raise lane.error  # type: ignore[misc]
            left = deadline - clock()
            if left <= 0 or self._closed.is_set():
                reason = f": {lane.error}" if lane.error is not None else ""
                raise TicketServerUnavailable(
                    f"no ids for {lane.sequence or 'Tickets'}/{lane.bits} within "
                    f"{self.timeout:g} s: the cache is empty and no upstream answered{reason}"
                )
            lane.changed.wait(left)

    # -- internals: sizing --------------------------------------------------------------------

    def _observe(self, lane: _Lane, *, refill: bool = True) -> None:
        """Update the rate estimate; start a refill if the lane is under its low-water mark."""
        now = self._clock()
        elapsed = now - lane.rate_time
        if elapsed >= RATE_INTERVAL:
            issued = lane.issued
            lane.rate = next_rate(lane.rate, (issued - lane.rate_count) / elapsed, elapsed,
                                  self.window)
            lane.rate_time = now
            lane.rate_count = issued
        if refill and lane.in_hand <= self._low_water(lane):
            self._start_refill(lane)

    def _rate_now(self, lane: _Lane, now: float) -> float:
        """The rate estimate as a sample taken now would make it (lock held; nothing
        changes): the lane samples only on its slow path, which a quiet lane reaches rarely."""
        elapsed = now - lane.rate_time
        if elapsed < RATE_INTERVAL:
            return lane.rate
        measured = (lane.issued - lane.rate_count) / elapsed
        return next_rate(lane.rate, measured, elapsed, self.window)

    def _budget(self, lane: _Lane) -> int:
        """The most ids the lane may hold at once, the refill in flight included."""
        return budget_of(self.waste_budget, lane.bits, lane.last_issued)

    def _target(self, lane: _Lane) -> int:
        return self.sizing.target(lane.rate, self._budget(lane), lane.grown, lane.issued)

    def _low_water(self, lane: _Lane) -> int:
        return self.sizing.low_water(
            self._target(lane), lane.rate, lane.latency, self._budget(lane)
        )

    def _start_refill(self, lane: _Lane) -> None:
        if lane.refilling or self._closed.is_set():
            return
        now = self._clock()
        if lane.block_size:
            # The last block went in less than a quarter of ``supply``: the rate lags; double.
            lane.grown = self.sizing.grow(lane.block_size, now - lane.asked_at, lane.issued)
        target = self._target(lane)
        held = lane.in_hand
        # A block of the target's size, plus what a caller of next_block is short of; but the
        # lane never holds more than the budget, nor (beyond that caller's need) more than it
        # has issued: that caller gets fewer and asks again.
        cap = min(self._budget(lane), max(self.min_block, lane.issued) + lane.wanted)
        # Below the mark (it is above the target when four refill latencies of ids are more
        # than a block: a distant source), as much more as it takes to reach it, in blocks of
        # at most max_block: a lane still short asks again when this one lands.
        low = self.sizing.low_water(target, lane.rate, lane.latency, self._budget(lane))
        size = min(lane.wanted + min(self.max_block, target + max(0, low - held)), cap - held)
        if size < 1:
            return  # the lane already holds all it may
        lane.block_size = target
        lane.asked_at = now
        lane.wanted = 0
        lane.refilling = True
        lane.pending = size
        self._refiller.wake(lane, runway=runway(held, lane.rate))

    # -- internals: refilling (in the refill threads) -----------------------------------------

    def _refill(self, lanes: list[_Lane]) -> None:
        """Take a block for each lane from the source: in one round trip where it serves many
        (lanes that failed last time go alone, so that one stalled sequence does not hold the
        others back)."""
        wanted: list[tuple[_Lane, int]] = []
        for lane in lanes:
            with lane.lock:
                if lane.refilling and not lane.harvested:
                    wanted.append((lane, lane.pending))
        together = [w for w in wanted if w[0].failures == 0]
        alone = [w for w in wanted if w[0].failures]
        started = time.perf_counter()
        if together:
            self._take_blocks(together, started)
        for one in alone:
            self._take_blocks([one], time.perf_counter())

    def _take_blocks(
        self, wanted: list[tuple[_Lane, int]], started: float
    ) -> TicketsError | None:
        """Ask the source for each lane's block; land what came, schedule what failed.
        Returns the first error met (for :meth:`prepare`)."""
        if not wanted:
            return None
        requests: list[Request] = [(lane.sequence, size, lane.bits) for lane, size in wanted]
        try:
            found = blocks_from(self.source, requests)
        except TicketsError as error:
            found = [error] * len(wanted)
        except BaseException as error:  # a bug upstream must not leave the lanes stuck
            for lane, _ in wanted:
                self._failed(lane, error, final=True)
            raise
        took = time.perf_counter() - started
        first: TicketsError | None = None
        for (lane, size), outcome in zip(wanted, found, strict=True):
            if isinstance(outcome, range):
                self._arrived(lane, outcome, took)
                continue
            first = first or outcome
            if isinstance(outcome, ExhaustedError):
                remaining = outcome.remaining
                if remaining and remaining < size:
                    with lane.lock:
                        lane.pending = remaining  # the sequence's last ids, exactly
                    self._refiller.wake(lane, runway=0.0)
                    continue
                self._failed(lane, outcome, final=True)
            else:
                self._failed(lane, outcome, final=False)
        return first

    def _arrived(self, lane: _Lane, block: range, took: float) -> None:
        with lane.lock:
            lane.round_trips += 1
            landed_late = lane.harvested
            if landed_late:
                # close() has been and gone: the block goes back, nobody gets it here.
                lane.late = 0
                lane.refilling = False
                lane.pending = 0
                lane.changed.notify_all()
            else:
                self._landed(lane, block, took)
        if landed_late:
            taken = give_back_to(self.source, lane.sequence, block, lane.bits)
            with lane.lock:
                lane.given_back += taken
                lane.burned += len(block) - taken
            logger.info("a block of %d ids of %s/%d landed after close: %d given back",
                        len(block), lane.sequence, lane.bits, taken)

    def _landed(self, lane: _Lane, block: range, took: float) -> None:
        """A refill brought ``block`` (lane lock held)."""
        kept = above(block, lane.floor)
        lane.burned += len(block) - len(kept)
        if kept:
            lane.ahead.append(kept)
        lane.refills += 1
        lane.latency = took if not lane.latency else 0.8 * lane.latency + 0.2 * took
        self._failures.recovered(lane)
        lane.refilling = False
        lane.pending = 0
        logger.debug(
            "refilled %s/%d with %d ids in %.1f ms (rate %.0f/s)",
            lane.sequence, lane.bits, len(block), took * 1000, lane.rate,
        )
        lane.changed.notify_all()
        # A short block (a tier above gave fewer) or a jump in rate: ask again.
        if lane.in_hand < self._low_water(lane):
            self._start_refill(lane)

    def _failed(self, lane: _Lane, error: BaseException, *, final: bool) -> None:
        def stop() -> None:
            if final or self._closed.is_set():
                lane.refilling = False
                lane.pending = 0

        self._failures.failed(lane, error, final=final, also=stop)


def _depth(cache: CachedSource) -> int:
    """How many caches lie under ``cache`` (its source, that one's source...)."""
    depth, below, seen = 0, cache.source, {id(cache)}
    while isinstance(below, CachedSource) and id(below) not in seen:
        seen.add(id(below))
        depth += 1
        below = below.source
    return depth


def open_caches() -> tuple[list[CachedSource], dict[str, dict[str, int]]]:
    """The open caches and the counters of closed ones (per ``name/bits``), read together."""
    caches, retired = _open.open_caches()
    return [c for c in caches if isinstance(c, CachedSource)], retired


@_process.at_exit
def _close_all() -> None:
    # Outer tiers first: what they give back lands in the caches under them, which then give
    # it back with their own ids.
    for cache in sorted(open_caches()[0], key=_depth, reverse=True):
        cache.close()
