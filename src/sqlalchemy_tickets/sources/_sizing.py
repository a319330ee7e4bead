"""How much a cache or a tier holds: one place for the rate estimate, the target and the bounds.

VTickets sizes each table's cache from its recent insert rate, an exponentially weighted average
that takes fast action on a spike without overreacting to it. Both the process cache
(:class:`~sqlalchemy_tickets.CachedSource`, on the process's monotonic clock) and the
datacenter tier (:class:`~sqlalchemy_tickets.DatacenterTier`, on the database's clock, shared by
every process) size from the same estimate:

* the **rate** rises at once to a higher measurement and forgets it over ``window`` seconds;
* the **target** holds ``supply`` seconds of ids at that rate, within ``min_block`` and
  ``max_block`` and the waste budget, and never more than the lane has issued so far: what a
  lane holds is what a crash burns (a clean exit gives it back), so a process that crashes
  burns at most about as many ids as it used — a crash-looping worker over a 32-bit sequence
  does not burn a block of minutes per crash — while a lane in use for a while holds its
  ``supply`` seconds and rides out an outage of about ``supply / 2`` seconds;
* the **low-water mark** is half the target, and never less than four refill latencies of ids,
  so a refill asked for there lands long before the ids run out: a double buffer;
* a block that ran out in less than a quarter of ``supply`` seconds means the rate lags behind
  (a young lane, a burst between two samples): the next one is twice as large (Meituan Leaf's
  rule), up to what the lane has issued so far, so a lane reaches its size in a few refills
  rather than waiting for the estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._naming import max_id

#: Seconds over which a cache measures its rate at the shortest: a few ids a microsecond apart
#: are noise, not a rate.
RATE_INTERVAL = 0.1


def next_rate(rate: float, measured: float, elapsed: float, window: float) -> float:
    """The exponentially weighted rate after a measurement over ``elapsed`` seconds: at once
    up to ``measured`` when it is higher, else forgetting the old rate over ``window``."""
    if measured >= rate:
        return measured
    return rate + (measured - rate) * (1 - math.exp(-elapsed / window))


def runway(held: int, rate: float) -> float:
    """Seconds ``held`` ids last at ``rate`` ids per second (``inf`` without a rate)."""
    return held / rate if rate > 0 else math.inf


def budget_of(waste_budget: int | float, bits: int, last_issued: int) -> int:
    """The most ids a lane may hold at once: an ``int`` as it is, a ``float`` as that share of
    what is left of the sequence's id space (at least 2)."""
    if isinstance(waste_budget, float):
        return max(2, int((max_id(bits) - last_issued) * waste_budget))
    return waste_budget


@dataclass(frozen=True)
class Sizing:
    """The sizing rules of one cache or tier (its options, checked by its constructor)."""

    supply: float
    window: float
    min_block: int
    max_block: int

    def target(
        self, rate: float, budget: int, grown: int = 0, issued: int | None = None
    ) -> int:
        """Ids to hold: ``supply`` seconds at ``rate`` (or ``grown``, a doubled block, if
        larger), within ``min_block``..``max_block``, the ``budget`` and what the lane has
        ``issued`` (at least ``min_block``)."""
        wanted = max(math.ceil(rate * self.supply), grown)
        if issued is not None:
            wanted = min(wanted, issued)
        return max(1, min(budget, self.max_block, max(self.min_block, wanted)))

    def low_water(self, target: int, rate: float, latency: float, budget: int) -> int:
        """Refill under this many ids held: half the target, and at least four refill
        latencies of ids at ``rate``; never above half the budget (a refill must fit)."""
        wanted = max(target // 2, math.ceil(rate * latency * 4), 1)
        return max(1, min(wanted, budget // 2))

    def grow(self, block: int, lasted: float, issued: int) -> int:
        """The doubled size after a block of ``block`` ids lasted ``lasted`` seconds (0: the
        rate keeps up), never more than the ``issued`` ids so far (nor less than
        ``min_block``): doubling does not outrun what the lane has used."""
        if lasted >= self.supply / 4:
            return 0
        return min(2 * block, max(self.min_block, issued))


#: The most ids a datacenter tier holds in stock by default (and never more than 0.1 % of the
#: id space).
DEFAULT_STOCK_BUDGET = 10_000_000


@dataclass(frozen=True)
class StockSizing:
    """How much a datacenter tier keeps in stock: :class:`Sizing`'s target at the rate every
    process takes together (not capped by ``max_block``, the most asked of upstream in one
    call: a refill makes several), within ``min_block`` and the waste budget; refilled under
    ``low_water`` (a share) of it.

    ``waste_budget``: an ``int`` (ids), a ``float`` in (0, 1) (a share of the sequence's whole
    id space), or ``None`` (10 million, and at most 0.1 % of the space); never under
    ``min_block``."""

    supply: float
    window: float
    min_block: int
    waste_budget: int | float | None
    low_water: float

    def budget(self, bits: int) -> int:
        budget = self.waste_budget
        if budget is None:
            return max(self.min_block, min(DEFAULT_STOCK_BUDGET, max_id(bits) // 1000))
        if isinstance(budget, float):
            return max(self.min_block, budget_of(budget, bits, 0))
        return budget

    def target(self, rate: float, bits: int) -> int:
        """The stock aimed at: ``supply`` seconds at the shared ``rate``, within the bounds."""
        sizing = Sizing(self.supply, self.window, self.min_block, max_id(bits))
        return sizing.target(rate, self.budget(bits))

    def low(self, rate: float, bits: int) -> int:
        """Refill under this many ids in stock."""
        return max(1, int(self.target(rate, bits) * self.low_water))
