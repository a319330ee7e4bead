"""The checks of the options that caches and tiers share: sizing, budgets, threads. Each says
what it expected, as a :class:`TicketsError` (a ``ValueError``), before anything is made."""

from __future__ import annotations

from .._naming import check_seconds
from ..errors import TicketsError
from .base import check_count


def check_sizing(*, min_block: int, max_block: int, **seconds: float) -> None:
    """``min_block``..``max_block`` a range of counts, and each of ``seconds`` (``supply``,
    ``window``, ``timeout``, back-offs...) a positive number of seconds."""
    check_count(min_block)
    check_count(max_block)
    if min_block > max_block:
        raise TicketsError(f"min_block ({min_block}) must not exceed max_block ({max_block})")
    for name, value in seconds.items():
        check_seconds(name, value)


def check_budget(waste_budget: object, *, at_least: int, what: str) -> None:
    """A waste budget: an ``int`` of at least ``at_least`` ids, or a ``float`` in (0, 1), a
    share of the id space (``what`` says of which part)."""
    if isinstance(waste_budget, bool) or not (
        (isinstance(waste_budget, int) and waste_budget >= at_least)
        or (isinstance(waste_budget, float) and 0 < waste_budget < 1)
    ):
        raise TicketsError(
            f"waste_budget must be an int >= {at_least} (ids) or a float in (0, 1) (a share "
            f"of {what}), not {waste_budget!r}"
        )


def check_workers(workers: object, name: str = "workers") -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise TicketsError(f"{name} must be a positive integer, not {workers!r}")
    return workers
