"""HubSpot-style caching of ticket ids: blocks taken ahead of need, refilled in the background.

Each (sequence, bits) has a *lane*. A lane holds the ids it was given as blocks (``range``s): a
queue of blocks taken ahead, the rest of the block being handed out, and a short ``deque`` of
ready ids. ``next_id`` pops from that deque and nothing else — ``deque.popleft`` is atomic, so the
hot path takes no lock and makes no call beyond it. Every few ids (a *chunk*) the slow path
refills the deque under the lane's lock; that is where the rate is measured, and where a
background refill starts when the ids in hand fall under the low-water mark.

Sizing follows VTickets: an exponentially weighted request rate (rising at once on a spike,
decaying over ``window`` seconds after it) times ``supply`` seconds gives the block size, bounded
by ``min_block``/``max_block`` and by the waste budget — the most ids a restart may burn. The
low-water mark is half a block, and never less than four refill latencies of ids: so a refill
is asked for while half a block is still in hand (a double buffer), and arrives long before the
lane runs dry.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from .. import _process
from .. import metrics as _metrics
from .._naming import check_bits, max_id, normalize_sequence
from ..errors import ExhaustedError, TicketsError, TicketServerUnavailable
from .base import (
    TicketSource,
    above,
    as_runs,
    check_count,
    check_ids,
    coalesce,
    ensure_above_in,
    give_back_to,
)

logger = logging.getLogger("sqlalchemy_tickets")

#: Shortest interval, in seconds, over which the request rate is measured.
RATE_INTERVAL = 0.1

#: Most ids moved to a lane's ready deque at once: bounds the work under the lock and the
#: staleness of the rate estimate.
MAX_CHUNK = 4096


class _RefillThreads:
    """Up to ``workers`` daemon threads running refills, started as needed.

    Daemon threads, unlike a ``ThreadPoolExecutor``'s: the interpreter joins non-daemon threads
    *before* it runs exit hooks, so a refill retrying a server that is down would hold the exit
    back for ever, and the hook that closes caches (and gives their ids back) would never run.
    :meth:`CachedSource.close` waits for a refill in flight itself, up to its timeout.
    """

    def __init__(self, workers: int) -> None:
        self._workers = max(1, workers)
        self._jobs: SimpleQueue[tuple[Callable[..., object], tuple[object, ...]] | None] = (
            SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._shut = False

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError("refill threads shut down")
            self._jobs.put((fn, args))
            if self._idle == 0 and self._threads < self._workers:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"tickets-refill_{self._threads}", daemon=True
                ).start()
            else:
                self._idle -= 1  # an idle thread takes this job

    def shutdown(self) -> None:
        """No more jobs; threads end once the jobs queued so far are done."""
        with self._lock:
            self._shut = True
            for _ in range(self._threads):
                self._jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except BaseException:  # logged by the refill itself; the thread serves on
                logger.debug("refill job failed", exc_info=True)
            with self._lock:
                self._idle += 1


@dataclass(eq=False)
class _Lane:
    """The cache of one (sequence, bits). Everything but ``ready`` is guarded by ``lock``."""

    sequence: str | None
    bits: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: deque[int] = field(default_factory=deque)
    rest: range = range(0)
    ahead: deque[range] = field(default_factory=deque)
    ready_step: int = 1  # the stride of the ids in ``ready`` (one slice of one block)
    refilling: bool = False
    pending: int = 0  # ids asked for by the refill in flight: held as soon as it is asked
    wanted: int = 0  # ids a caller of next_block is short of: the next refill includes them
    error: BaseException | None = None
    failures: int = 0
    # Counters.
    moved: int = 0  # ids moved into ``ready``
    carved: int = 0  # ids handed out through next_block
    round_trips: int = 0
    blocking_waits: int = 0
    refills: int = 0
    burned: int = 0
    given_back: int = 0  # ids given back to the source (on close)
    taken_back: int = 0  # ids a cache above gave back to this one, to be issued again
    # Ids at or below it are in use (ensure_above): blocks still on their way are cut above it.
    floor: int = 0
    # Set when close() has taken what the lane held: a block landing afterwards goes straight
    # back to the source, never into the lane (a caller could otherwise still be handed it).
    harvested: bool = False
    late: int = 0  # ids of the refill that was still on its way when close() harvested
    # Estimates.
    rate: float = 0.0  # ids per second, EWMA
    latency: float = 0.0  # seconds per refill, EWMA
    block_size: int = 0
    rate_time: float = 0.0
    rate_count: int = 0
    last_issued: int = 0
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def issued(self) -> int:
        return self.moved - len(self.ready) + self.carved

    @property
    def in_hand(self) -> int:
        return len(self.ready) + len(self.rest) + sum(len(b) for b in self.ahead)

    def take_all(self) -> list[range]:
        """Everything the lane holds, as ranges in the order it would hand them out; the lane
        is left empty (lock held). Ready ids are popped one by one, as ``next_id`` pops them
        without the lock: each goes either to a caller or here, never to both."""
        drained: list[int] = []
        pop = self.ready.popleft
        while True:
            try:
                drained.append(pop())
            except IndexError:
                break
        self.moved -= len(drained)  # back in hand, unissued: ``issued`` stays true
        held = [*as_runs(drained, self.ready_step), self.rest, *self.ahead]
        self.rest = range(0)
        self.ahead.clear()
        return [block for block in held if block]


class CachedSource:
    """A cache in front of any ticket source (a server, servers, or another cache).

    Args:
        source: where blocks come from (``next_block`` is called in background threads).
        min_block: smallest block asked for.
        max_block: largest block asked for.
        supply: seconds of ids, at the recent rate, that one block should last.
        window: seconds over which the rate estimate forgets a spike (HubSpot: 15 minutes).
        waste_budget: the most ids held at once, i.e. the most a restart can burn: an ``int``
            (ids), or a ``float`` in (0, 1) (a share of what is left of the sequence's id space).
            Everything counts: the ids ready, the blocks taken ahead, the refill in flight,
            and what a large ``next_block`` asked for (it gets fewer rather than pass it).
        waste_ratio: the most ids held ahead of need, as a share of the ids this cache has
            issued so far (never less than ``min_block``, nor than four refill latencies of
            ids at the current rate up to twice this share, so that refills still land before
            the lane runs dry). A
            process that exits soon after a burst burns about this share of what it used, not
            ``max_block``: a burst sizes blocks for minutes of ids only once the cache has
            issued enough for those to be a small share.
        timeout: seconds a caller may wait when the cache is empty before
            :class:`TicketServerUnavailable` is raised (and that :meth:`close` waits for a
            block still on its way).
        backoff: first pause after a failed refill, doubling up to ``max_backoff``.
        clock: monotonic clock (a parameter so tests can drive the rate estimate); every
            deadline of the cache (waits for ids, :meth:`wait_idle`, :meth:`close`) is read on it.
        max_workers: refill threads (refills of one lane never overlap).
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
        waste_ratio: float = 0.05,
        timeout: float = 2.0,
        backoff: float = 0.1,
        max_backoff: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 4,
    ) -> None:
        if not isinstance(source, TicketSource):
            raise TicketsError(f"{source!r} is not a ticket source (needs next_id, next_block)")
        check_count(min_block)
        check_count(max_block)
        if min_block > max_block:
            raise TicketsError(f"min_block ({min_block}) must not exceed max_block ({max_block})")
        if not supply > 0 or not window > 0 or not timeout > 0:
            raise TicketsError("supply, window and timeout must be positive numbers of seconds")
        if isinstance(waste_budget, bool) or not (
            (isinstance(waste_budget, int) and waste_budget >= 2)
            or (isinstance(waste_budget, float) and 0 < waste_budget < 1)
        ):
            raise TicketsError(
                f"waste_budget must be an int >= 2 (ids) or a float in (0, 1) (a share of the "
                f"id space left), not {waste_budget!r}"
            )
        if isinstance(waste_ratio, bool) or not isinstance(waste_ratio, (int, float)) or not (
            0 < waste_ratio
        ):
            raise TicketsError(
                f"waste_ratio must be a positive share of the ids issued (e.g. 0.05), "
                f"not {waste_ratio!r}"
            )
        self.source = source
        self.waste_ratio = float(waste_ratio)
        self.min_block = min_block
        self.max_block = max_block
        self.supply = float(supply)
        self.window = float(window)
        self.waste_budget = waste_budget
        self.timeout = float(timeout)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self._clock = clock
        self._lanes: dict[tuple[str | None, int], _Lane] = {}
        # The hot path: each lane's ``ready.popleft``, bound once, keyed as callers spell it.
        self._pop: dict[tuple[str | None, int], Callable[[], int]] = {}
        self._pop64: dict[str | None, Callable[[], int]] = {}
        self._lanes_lock = threading.Lock()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._max_workers = max_workers
        self._executor = _RefillThreads(max_workers)
        with _open_caches_lock:
            _open_caches.add(self)
        _metrics.enable_if_installed()

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
                return self._pop64[sequence]()
            return self._pop[sequence, bits]()
        except (KeyError, IndexError):
            return self._next_id_slow(sequence, bits)

    async def next_id_async(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """:meth:`next_id` for asyncio code: from memory, or awaited in a worker thread when the
        cache is empty, so the event loop never waits on a round trip."""
        try:
            return self._pop[sequence, bits]()
        except (KeyError, IndexError):
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
                taken = self._take_ready(lane, count)
                if taken is None and (lane.rest or lane.ahead):
                    if not lane.rest:
                        lane.rest = lane.ahead.popleft()
                    taken = lane.rest[:count]
                    lane.rest = lane.rest[count:]
                    lane.carved += len(taken)
                if taken is not None:
                    lane.last_issued = max(lane.last_issued, taken[-1])
                    self._observe(lane)
                    return taken
                self._wait_for_ids(lane)

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

    def _take_ready(self, lane: _Lane, count: int) -> range | None:
        """Up to ``count`` ids from the front of the ready deque, and on into the rest of the
        block when they follow on (lane lock held); ``None`` when nothing is ready."""
        ready = lane.ready
        try:
            first = ready.popleft()
        except IndexError:
            return None
        step = lane.ready_step
        last = first
        n = 1
        gap = False
        while n < count:
            try:
                got = ready.popleft()
            except IndexError:
                break
            if got != last + step:
                # A next_id in another thread took the id in between. Putting ``got`` back
                # could hand that thread an id below the one it just had: it is burned
                # instead (only when next_block and next_id race on one lane).
                lane.moved -= 1
                lane.burned += 1
                gap = True
                break
            last = got
            n += 1
        if n < count and not gap and not ready and lane.rest and lane.rest.step == step and (
            lane.rest.start == last + step
        ):
            more = lane.rest[: count - n]
            lane.rest = lane.rest[len(more) :]
            lane.carved += len(more)
            last = more[-1]
        return range(first, last + step, step)

    # -- management ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and estimates, in total and per sequence (keyed ``name/bits``)."""
        per: dict[str, dict[str, Any]] = {}
        for lane in self._distinct_lanes():
            with lane.lock:
                per[f"{lane.sequence or 'Tickets'}/{lane.bits}"] = {
                    "issued": lane.issued,
                    "round_trips": lane.round_trips,
                    "blocking_waits": lane.blocking_waits,
                    "refills": lane.refills,
                    "block_size": lane.block_size,
                    "in_hand": lane.in_hand,
                    "in_flight": lane.pending,
                    "rate": lane.rate,
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

        Everything the cache holds goes back — ready ids, the rest of the block being handed
        out, blocks taken ahead, and a block still on its way (waited for, up to ``timeout``)
        — as few ranges as possible, the last one first (a ticket server takes back only its
        latest block). Burned: what was held and not taken back, plus a block still on its way
        after the wait (given back when it lands; ``stats()`` then counts it).
        """
        with self._close_lock:
            if self._closed.is_set():
                return 0
            self._closed.set()
        # A block still on its way belongs to the cache: let it land so it can go back too.
        self.wait_idle(self.timeout)
        burned = 0
        for lane in self._distinct_lanes():
            with lane.lock:
                held = lane.take_all()
                lane.harvested = True
                lane.late = lane.pending if lane.refilling else 0
                late = lane.late
                lane.changed.notify_all()
            taken = 0
            for run in reversed(coalesce(held)):  # the highest first
                taken += give_back_to(self.source, lane.sequence, run, lane.bits)
            lost = sum(len(b) for b in held) - taken
            with lane.lock:
                lane.burned += lost
                lane.given_back += taken
            burned += lost + late
            if lost or late or taken:
                logger.info(
                    "closing cache of %s/%d: %d ids given back, %d burned%s",
                    lane.sequence, lane.bits, taken, lost,
                    f", {late} still on their way" if late else "",
                )
        self._executor.shutdown()
        _retire(self)
        return burned

    def _reset_after_fork(self) -> None:
        self._lanes = {}
        self._pop = {}
        self._pop64 = {}
        self._lanes_lock = threading.Lock()
        self._executor = _RefillThreads(self._max_workers)

    def __enter__(self) -> CachedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _distinct_lanes(self) -> list[_Lane]:
        """Each lane once (a lane is listed under every spelling callers used)."""
        with self._lanes_lock:
            return list({id(lane): lane for lane in self._lanes.values()}.values())

    def _lane(self, sequence: str | None, bits: int) -> _Lane:
        lane = self._lanes.get((sequence, bits))
        if lane is None:
            check_bits(bits)
            name = normalize_sequence(sequence)
            with self._lanes_lock:
                lane = self._lanes.get((name, bits))
                if lane is None:
                    lane = _Lane(name, bits, rate_time=self._clock())
                    self._lanes[name, bits] = lane
                # The caller's spelling maps to the same lane: "Photos" and "photos" are one.
                self._lanes[sequence, bits] = lane
                self._pop[sequence, bits] = lane.ready.popleft
                if bits == 64:
                    self._pop64[sequence] = lane.ready.popleft
        return lane

    def _next_id_slow(self, sequence: str | None, bits: int) -> int:
        lane = self._lane(sequence, bits)
        with lane.lock:
            while True:
                try:
                    return lane.ready.popleft()
                except IndexError:
                    pass
                if not lane.rest and lane.ahead:
                    lane.rest = lane.ahead.popleft()
                if lane.rest:
                    chunk = lane.rest[: self._chunk(lane)]
                    lane.rest = lane.rest[len(chunk) :]
                    lane.ready_step = chunk.step
                    lane.ready.extend(chunk)
                    lane.moved += len(chunk)
                    lane.last_issued = max(lane.last_issued, chunk[-1])
                    self._observe(lane)
                    continue
                self._wait_for_ids(lane)

    def _chunk(self, lane: _Lane) -> int:
        """Ids to move to the ready deque at once: small enough that the low-water check, made
        once per chunk, sees the lane cross its mark in time."""
        return max(1, min(MAX_CHUNK, self._low_water(lane) // 4))

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
        while not (lane.rest or lane.ahead):
            if isinstance(lane.error, ExhaustedError):
                raise lane.error
            left = deadline - clock()
            if left <= 0 or self._closed.is_set():
                reason = f": {lane.error}" if lane.error is not None else ""
                raise TicketServerUnavailable(
                    f"no ids for {lane.sequence or 'Tickets'}/{lane.bits} within "
                    f"{self.timeout:g} s: the cache is empty and no upstream answered{reason}"
                )
            lane.changed.wait(left)

    def _observe(self, lane: _Lane) -> None:
        """Update the rate estimate; start a refill if the lane is under its low-water mark."""
        now = self._clock()
        elapsed = now - lane.rate_time
        # Shorter intervals measure noise: a few ids a microsecond apart are not a rate.
        if elapsed >= RATE_INTERVAL:
            issued = lane.issued
            rate = (issued - lane.rate_count) / elapsed
            if rate > lane.rate:
                lane.rate = rate  # grow at once on a spike...
            else:  # ...and forget it slowly.
                lane.rate += (rate - lane.rate) * (1 - math.exp(-elapsed / self.window))
            lane.rate_time = now
            lane.rate_count = issued
        if lane.in_hand < self._low_water(lane):
            self._start_refill(lane)

    def _low_water(self, lane: _Lane) -> int:
        size = lane.block_size or self.min_block
        wanted = max(size // 2, math.ceil(lane.rate * lane.latency * 4), 1)
        return min(wanted, max(1, self._hold_limit(lane) // 2))

    def _budget(self, lane: _Lane) -> int:
        """The most ids the lane may hold at once, the refill in flight included."""
        budget = self.waste_budget
        if isinstance(budget, float):
            return max(2, int((max_id(lane.bits) - lane.last_issued) * budget))
        return budget

    def _hold_limit(self, lane: _Lane) -> int:
        """The most ids the lane may take ahead of need: a share of what it has issued (so a
        short-lived process burns a share of what it used), enough to cover a refill's
        latency at the current rate (so a refill lands before the lane runs dry), within
        the waste budget."""
        # The latency term follows the measured rate, which a single large flush (or a slow,
        # loaded server) can drive far up; capping it at twice the share keeps what an exit
        # burns a bounded share of what was used, whatever the rate estimate says.
        share = lane.issued * self.waste_ratio
        earned = max(
            self.min_block,
            math.ceil(share),
            min(math.ceil(lane.rate * lane.latency * 4), math.ceil(2 * share)),
        )
        return max(1, min(earned, self._budget(lane)))

    def _size(self, lane: _Lane) -> int:
        """Ids ahead of need the next block should bring (with the lane's lock held)."""
        size = min(self.max_block, max(self.min_block, math.ceil(lane.rate * self.supply)))
        # Refills start under the low-water mark (at most half the hold limit), so a block
        # of half the limit keeps what is held within it.
        return max(1, min(size, self._hold_limit(lane) // 2))

    def _start_refill(self, lane: _Lane) -> None:
        if lane.refilling or self._closed.is_set():
            return
        lane.block_size = self._size(lane)
        held = lane.in_hand
        ahead = min(lane.block_size, max(0, self._hold_limit(lane) - held))
        # What a caller of next_block is short of comes on top, but nothing passes the waste
        # budget: that caller gets fewer and asks again.
        size = min(lane.wanted + ahead, self._budget(lane) - held)
        if size < 1:
            return  # the lane already holds its whole budget
        lane.wanted = 0
        lane.refilling = True
        lane.pending = size
        try:
            self._executor.submit(self._refill, lane, size)
        except RuntimeError:  # the refill threads were shut down by close()
            lane.refilling = False
            lane.pending = 0

    def _refill(self, lane: _Lane, size: int) -> None:
        """Take one block from upstream (in a refill thread), retrying with back-off."""
        try:
            self._take_block(lane, size)
        finally:
            with lane.lock:
                if self._closed.is_set() and lane.refilling:
                    lane.refilling = False
                    lane.pending = 0
                    lane.changed.notify_all()

    def _take_block(self, lane: _Lane, size: int) -> None:
        pause = self.backoff
        while not self._closed.is_set():
            started = self._clock()
            try:
                block = self.source.next_block(lane.sequence, size, bits=lane.bits)
            except ExhaustedError as error:
                remaining = getattr(error, "remaining", None)
                if remaining and remaining < size:
                    size = remaining  # the sequence's last ids, exactly
                    with lane.lock:
                        lane.pending = size
                    continue
                self._failed(lane, error, final=True)
                return
            except TicketsError as error:
                self._failed(lane, error, final=False)
                if self._closed.wait(pause):
                    return
                pause = min(self.max_backoff, pause * 2)
                continue
            except BaseException as error:  # a bug upstream must not leave the lane stuck
                self._failed(lane, error, final=True)
                raise
            took = self._clock() - started
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
            return

    def _landed(self, lane: _Lane, block: range, took: float) -> None:
        """A refill brought ``block`` (lane lock held)."""
        kept = above(block, lane.floor)
        lane.burned += len(block) - len(kept)
        if kept:
            lane.ahead.append(kept)
        lane.refills += 1
        lane.latency = took if not lane.latency else 0.8 * lane.latency + 0.2 * took
        if lane.failures:
            logger.info("refills of %s/%d work again", lane.sequence, lane.bits)
        lane.failures = 0
        lane.error = None
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
        with lane.lock:
            lane.error = error
            lane.failures += 1
            if final:
                lane.refilling = False
                lane.pending = 0
            lane.changed.notify_all()
        log = logger.error if final else logger.warning
        log("refill of %s/%d failed (%d in a row): %s", lane.sequence, lane.bits,
            lane.failures, error)


# Caches still open at interpreter exit give up their ids and say how many.
_open_caches: weakref.WeakSet[CachedSource] = weakref.WeakSet()
# Guards _open_caches and _retired: metrics read them from a collector's thread.
_open_caches_lock = threading.Lock()
# Counters of closed caches, per "name/bits", so that counters read by metrics never go back.
_RETIRED_KEYS = (
    "issued", "burned", "given_back", "round_trips", "blocking_waits", "refills"
)
_retired: dict[str, dict[str, int]] = {}


def _retire(cache: CachedSource) -> None:
    """Fold a closed cache's counters into ``_retired`` and forget the cache, in one step."""
    final = cache.stats()["sequences"]
    with _open_caches_lock:
        for key, figures in final.items():
            kept = _retired.setdefault(key, dict.fromkeys(_RETIRED_KEYS, 0) | {"last_issued": 0})
            for name in _RETIRED_KEYS:
                kept[name] += figures[name]
            kept["last_issued"] = max(kept["last_issued"], figures["last_issued"])
        _open_caches.discard(cache)


def open_caches() -> tuple[list[CachedSource], dict[str, dict[str, int]]]:
    """The open caches and the counters of closed ones (per ``name/bits``), read together."""
    with _open_caches_lock:
        return list(_open_caches), {key: dict(kept) for key, kept in _retired.items()}


def _forget_in_child() -> None:
    """After fork, a child holding its parent's ids would issue them a second time: drop them,
    with every lock and thread, which did not survive the fork anyway."""
    global _open_caches_lock
    _open_caches_lock = threading.Lock()
    _retired.clear()  # the child's counters start from zero, as its caches do
    for cache in list(_open_caches):
        cache._reset_after_fork()


_process.after_fork_in_child(_forget_in_child)


def _depth(cache: CachedSource) -> int:
    """How many caches lie under ``cache`` (its source, that one's source...)."""
    depth, below, seen = 0, cache.source, {id(cache)}
    while isinstance(below, CachedSource) and id(below) not in seen:
        seen.add(id(below))
        depth += 1
        below = below.source
    return depth


@_process.at_exit
def _close_all() -> None:
    # Outer tiers first: what they give back lands in the caches under them, which then give
    # it back with their own ids.
    for cache in sorted(open_caches()[0], key=_depth, reverse=True):
        cache.close()
