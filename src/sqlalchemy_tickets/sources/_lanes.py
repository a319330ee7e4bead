"""What caches and tiers keep per (sequence, bits) — a *lane* — and share about them: the map
from every spelling callers use to one lane, and what a failed refill does.

A refill that failed is tried again after a back-off (``_backoff.py``); the lane keeps the error,
so a caller waiting for ids can say why none came. Errors no retry cures soon go to callers at
once: :class:`ExhaustedError` (the sequence has no ids left), and :class:`RewindError` (a
database went back in time and nothing tells how far: refused until an operator's ``sync``,
after which the refills, still tried at the longest back-off, work again), said once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .._backoff import Backoff
from .._naming import check_bits, normalize_sequence
from ..errors import ExhaustedError, RewindError

logger = logging.getLogger("sqlalchemy_tickets")


@dataclass(eq=False)
class Lane:
    """One (sequence, bits) of a cache or a tier. Its fields are guarded by ``lock``;
    ``changed`` wakes the callers waiting on it (ids came, a refill failed, closed)."""

    sequence: str | None
    bits: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: BaseException | None = None
    failures: int = 0
    #: A refused rewind was logged for this lane and no refill has worked since: the refusals
    #: of the retries (each may have burned another block, and says so) are the same rewind.
    refused: bool = False
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def label(self) -> str:
        return f"{self.sequence or 'Tickets'}/{self.bits}"


L = TypeVar("L", bound=Lane)


class LaneMap(Generic[L]):
    """The lanes of one cache or tier, each reached by every spelling of its sequence callers
    used ("Photos" and "photos" are one lane): a name is validated once, on first use.

    Args:
        make: makes the lane of a (normalized name, bits).
        spelled: told ``(lane, key)`` the first time a spelling reaches a lane (a cache points
            its hot path at the lane under that key).
    """

    def __init__(
        self,
        make: Callable[[str | None, int], L],
        spelled: Callable[[L, str | None], None] | None = None,
    ) -> None:
        self._make = make
        self._spelled = spelled
        self._lanes: dict[tuple[str | None, int], L] = {}
        self._lock = threading.Lock()

    def get(self, sequence: str | None, bits: int) -> L:
        """The lane of ``sequence`` at ``bits`` (made on first use; :class:`TicketsError` for
        a bad name or width)."""
        lane = self._lanes.get((sequence, bits))
        if lane is not None:
            return lane
        check_bits(bits)
        name = normalize_sequence(sequence)
        with self._lock:
            lane = self._lanes.get((name, bits))
            if lane is None:
                lane = self._lanes[name, bits] = self._make(name, bits)
                if self._spelled is not None:
                    self._spelled(lane, name)
            if (sequence, bits) not in self._lanes:
                self._lanes[sequence, bits] = lane
                if self._spelled is not None:
                    self._spelled(lane, sequence)
        return lane

    def distinct(self) -> list[L]:
        """Each lane once."""
        with self._lock:
            return list({id(lane): lane for lane in self._lanes.values()}.values())

    def clear(self) -> None:
        with self._lock:
            self._lanes.clear()


def reaches_callers(error: BaseException | None) -> bool:
    """Whether a refill's ``error`` goes to waiting callers at once rather than after their
    timeout: no retry cures it soon."""
    return isinstance(error, (ExhaustedError, RewindError))


class FailurePolicy(Generic[L]):
    """What a failed refill of a lane does: the lane keeps the error (waiting callers are
    woken), the refill runs again after the back-off (``defer``), and the failure is logged
    — at ERROR when final, else at WARNING; a refused rewind, which only an operator cures,
    at WARNING once (then at INFO while it lasts).

    Args:
        name: how messages name the cache or tier.
        backoff: the pauses.
        defer: runs the lane's refill again in so many seconds.
    """

    def __init__(
        self, name: Callable[[], str], backoff: Backoff, defer: Callable[[L, float], None]
    ) -> None:
        self._name = name
        self.backoff = backoff
        self._defer = defer

    def failed(
        self, lane: L, error: BaseException, *, final: bool,
        also: Callable[[], None] | None = None,
    ) -> None:
        """Record ``error`` on ``lane`` (``also`` runs under its lock too); ``final``: the
        refill is not tried again."""
        refusal = error if isinstance(error, RewindError) else None
        with lane.lock:
            # A refused rewind is said once: it waits for an operator, not for a retry, and a
            # layer below (the tier or cache this lane refills from) may have said it already.
            said = refusal is not None and (lane.refused or refusal.logged)
            lane.refused = lane.refused or refusal is not None
            lane.error = error
            lane.failures += 1
            failures = lane.failures
            if also is not None:
                also()
            lane.changed.notify_all()
        if not final:
            self._defer(lane, self.backoff.pause(failures))
        if final:
            level = logging.ERROR
        elif said:
            level = logging.INFO
        else:
            level = logging.WARNING
            if refusal is not None:
                refusal.logged = True
        logger.log(level, "%s: refill of %s failed (%d in a row): %s",
                   self._name(), lane.label, failures, error)

    def recovered(self, lane: L) -> None:
        """The lane's refill worked: its failures are over (lock held)."""
        if lane.failures:
            logger.info("%s: refills of %s work again", self._name(), lane.label)
        lane.failures = 0
        lane.error = None
        lane.refused = False
