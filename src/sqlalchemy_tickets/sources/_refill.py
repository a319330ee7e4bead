"""The background refills of many lanes on a few threads: one scheduler for every cache and tier.

A source with thousands of sequences (HubSpot: ~3,750 tables) cannot afford a thread per
sequence, nor a refill that waits on a hung upstream holding back the others. A
:class:`Refiller` keeps a schedule of *lanes* (whatever the owner refills: a cache's lane, a
tier's sequence) and runs the owner's job on them from a small pool of daemon threads:

* a lane is **woken** when it runs low; it is run once it is *due* (at once, or after a pause:
  a back-off after a failure, another process's refill claim) — never by two threads at once,
  and a wake that arrives while it runs makes it run again afterwards;
* among the lanes due, the one with the **shortest runway** (seconds of ids left at its rate)
  goes first, so a busy sequence about to run dry is not queued behind quiet ones;
* the job may take several due lanes at once (``batch``): a source that serves many sequences
  in one round trip refills them together;
* a job that fails or waits is the owner's to reschedule (:meth:`defer`), never a sleep in a
  worker: a stalled upstream holds at most the workers running it, and the others go on.

Threads are daemons and start only when there is work for them, up to ``workers``: the
interpreter joins non-daemon threads *before* it runs exit hooks, so a refill retrying a server
that is down would hold the exit back and the hook that gives ids back would never run. The
owner waits for what it needs (:meth:`wait_idle`, :meth:`close`). A thread with nothing to do
for :data:`IDLE_EXIT` seconds ends (the next wake starts another): a source dropped without
``close()``, as in a test suite making one per test, is not kept alive by its threads for ever.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

logger = logging.getLogger("sqlalchemy_tickets")

L = TypeVar("L", bound=Hashable)

#: Seconds a worker waits with nothing scheduled before it ends.
IDLE_EXIT = 30.0


@dataclass(eq=False)
class _Entry:
    """Where one lane is in the schedule (guarded by the refiller's lock)."""

    due: float = math.inf  # monotonic time it may run from (inf: not scheduled)
    not_before: float = 0.0  # nothing earlier than this (a back-off, another's claim)
    runway: float = math.inf  # seconds of ids left: the shorter, the sooner among due lanes
    running: bool = False
    again: bool = False  # woken while running: run once more afterwards
    version: int = 0  # heap entries of an older version are stale


@dataclass(eq=False)
class _State(Generic[L]):
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: dict[L, _Entry] = field(default_factory=dict)
    #: Lanes scheduled for later: (due, order, version, lane).
    later: list[tuple[float, int, int, L]] = field(default_factory=list)
    #: Lanes due now: (runway, order, version, lane).
    now: list[tuple[float, int, int, L]] = field(default_factory=list)
    threads: int = 0
    waiting: int = 0  # threads waiting for work
    running: int = 0  # jobs running
    closed: bool = False
    #: Workers wait on ``work`` for a lane to come due; owners on ``idle`` for jobs to end.
    work: threading.Condition = field(init=False)
    idle: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.work = threading.Condition(self.lock)
        self.idle = threading.Condition(self.lock)


class Refiller(Generic[L]):
    """Runs ``job(lanes)`` in background threads for the lanes that are due.

    Args:
        job: called with 1 to ``batch`` lanes (the most urgent first); exceptions are logged
            and the lanes reported idle (the job reschedules what it must itself).
        name: prefix of the threads' names.
        workers: most threads (each runs one job at a time).
        batch: most lanes handed to one job.
        clock: monotonic clock of every pause and deadline (tests drive it).
    """

    def __init__(
        self,
        job: Callable[[list[L]], object],
        *,
        name: str,
        workers: int = 4,
        batch: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._job = job
        self._name = name
        self._workers = max(1, workers)
        self._batch = max(1, batch)
        self._clock = clock
        self._order = itertools.count()
        self._state: _State[L] = _State()

    # -- scheduling ---------------------------------------------------------------------------

    def wake(self, lane: L, *, runway: float = math.inf) -> None:
        """Run ``lane`` as soon as its back-off allows (``runway``: its seconds of ids left)."""
        self._schedule(lane, runway=runway)

    def defer(self, lane: L, seconds: float, *, runway: float = math.inf) -> None:
        """Run ``lane`` again in ``seconds``, not earlier (a back-off, a claim held elsewhere);
        wakes before then wait for it too, but :meth:`hurry` may bring it forward."""
        self._schedule(lane, runway=runway, not_before=self._clock() + max(0.0, seconds))

    def hurry(self, lane: L, within: float, *, runway: float = 0.0) -> None:
        """Run ``lane`` within ``within`` seconds, even if a back-off said later (a caller is
        waiting for its ids)."""
        self._schedule(lane, runway=runway, hurry=self._clock() + max(0.0, within))

    def _schedule(
        self,
        lane: L,
        *,
        runway: float,
        not_before: float | None = None,
        hurry: float | None = None,
    ) -> None:
        state = self._state
        with state.lock:
            if state.closed:
                return
            entry = state.entries.get(lane)
            if entry is None:
                entry = state.entries[lane] = _Entry()
            if not_before is not None:
                entry.not_before = not_before
            if hurry is not None:
                entry.not_before = min(entry.not_before, hurry)
            entry.runway = min(entry.runway, runway) if entry.due < math.inf else runway
            if entry.running:
                entry.again = True
                return
            self._push(state, lane, entry)

    def _push(self, state: _State[L], lane: L, entry: _Entry) -> None:
        """(Re)place ``lane`` in the schedule (lock held)."""
        now = self._clock()
        entry.version += 1
        entry.due = max(now, entry.not_before)
        if entry.due <= now:
            heapq.heappush(state.now, (entry.runway, next(self._order), entry.version, lane))
        else:
            heapq.heappush(state.later, (entry.due, next(self._order), entry.version, lane))
        if state.waiting:
            state.work.notify()
        elif state.threads < self._workers:
            state.threads += 1
            threading.Thread(
                target=self._work, name=f"{self._name}_{state.threads}", daemon=True
            ).start()

    def scheduled(self, lane: L) -> bool:
        """Whether ``lane`` is due, waiting for its time, or running."""
        with self._state.lock:
            entry = self._state.entries.get(lane)
            return entry is not None and (entry.running or entry.due < math.inf)

    # -- the workers --------------------------------------------------------------------------

    def _take(self, state: _State[L]) -> list[L] | None:
        """The next lanes to run, waiting for them (lock held); ``None``: closed, or nothing
        scheduled for :data:`IDLE_EXIT` seconds (on the real clock: tests drive ``clock``)."""
        idle_until = time.monotonic() + IDLE_EXIT
        while True:
            if state.closed:
                return None
            now = self._clock()
            while state.later and state.later[0][0] <= now:
                _, order, version, lane = heapq.heappop(state.later)
                entry = state.entries.get(lane)
                if entry is not None and entry.version == version:
                    heapq.heappush(state.now, (entry.runway, order, version, lane))
            picked: list[L] = []
            while state.now and len(picked) < self._batch:
                _, _, version, lane = heapq.heappop(state.now)
                entry = state.entries.get(lane)
                if entry is None or entry.version != version or entry.running:
                    continue
                entry.running = True
                entry.due = math.inf
                entry.runway = math.inf
                picked.append(lane)
            if picked:
                return picked
            # Nothing due: wait for a wake, or for the first lane scheduled later.
            if state.later:
                wait = max(0.0, min(state.later[0][0] - self._clock(), 60.0))
                idle_until = time.monotonic() + IDLE_EXIT
            else:
                wait = idle_until - time.monotonic()
                if wait <= 0:
                    return None
            state.waiting += 1
            try:
                state.work.wait(wait)
            finally:
                state.waiting -= 1

    def _work(self) -> None:
        state = self._state
        while True:
            with state.lock:
                lanes = self._take(state)
                if lanes is None:
                    state.threads -= 1
                    return
                state.running += 1
            try:
                self._job(lanes)
            except BaseException:  # the job logs its own failures; the thread serves on
                logger.exception("%s: a refill job failed", self._name)
            finally:
                with state.lock:
                    state.running -= 1
                    for lane in lanes:
                        entry = state.entries.get(lane)
                        if entry is None:
                            continue
                        entry.running = False
                        if entry.again and not state.closed:
                            entry.again = False
                            self._push(state, lane, entry)
                        else:
                            del state.entries[lane]
                    state.idle.notify_all()

    # -- owners' waits ------------------------------------------------------------------------

    def wait_idle(
        self, timeout: float | None = None, lanes: Sequence[L] | None = None
    ) -> bool:
        """Wait until nothing is scheduled or running (of ``lanes``, if given); whether it
        got there within ``timeout`` seconds (``None``: no limit)."""
        state = self._state
        clock = self._clock
        deadline = None if timeout is None else clock() + timeout
        with state.lock:
            while True:
                if lanes is None:
                    busy = bool(state.entries)
                else:
                    busy = any(lane in state.entries for lane in lanes)
                if not busy or state.closed:
                    return not busy
                left = None if deadline is None else deadline - clock()
                if left is not None and left <= 0:
                    return False
                state.idle.wait(left)

    def close(self, timeout: float = 0.0) -> bool:
        """Run nothing more; wait up to ``timeout`` seconds for the jobs running to end.
        Whether they all ended (a job hung on upstream is left behind: threads are daemons)."""
        state = self._state
        clock = self._clock
        deadline = clock() + timeout
        with state.lock:
            state.closed = True
            state.now.clear()
            state.later.clear()
            for lane in [lane for lane, e in state.entries.items() if not e.running]:
                del state.entries[lane]
            state.work.notify_all()
            state.idle.notify_all()
            while state.running:
                left = deadline - clock()
                if left <= 0:
                    return False
                state.idle.wait(left)
        return True

    @property
    def closed(self) -> bool:
        return self._state.closed

    def threads(self) -> int:
        """Threads started and not ended."""
        with self._state.lock:
            return self._state.threads

    def __repr__(self) -> str:
        return f"Refiller({self._name!r}, workers={self._workers}, batch={self._batch})"

