"""What a source of ticket ids is: anything with ``next_id`` and ``next_block`` (and, for
sources that can take unused ids back, ``give_back``)."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from .. import _process
from .._naming import check_bits, max_id
from ..errors import DatabaseUnavailable, ExhaustedError, TicketsError

logger = logging.getLogger("sqlalchemy_tickets")


@runtime_checkable
class TicketSource(Protocol):
    """A source of ticket ids.

    ``next_block(sequence, count)`` returns a ``range`` of at most ``count`` ids (never empty) in
    one round trip at most; ``range.step`` is the stride. A ticket server returns exactly
    ``count``; caches and tiers may return fewer, and callers that need more ask again.
    """

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int: ...

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range: ...


@runtime_checkable
class GivesBack(Protocol):
    """A source that can take back ids it issued and nobody used.

    ``give_back(sequence, ids, bits=bits)`` returns how many of ``ids`` (a ``range`` it issued)
    it took back: those may be issued again, the others are burned. A source takes a range back
    only where that can never cause a duplicate, and says ``0`` otherwise (a ticket server whose
    row moved on since, Flickr's tables shared with ``REPLACE INTO`` clients).
    """

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int: ...


@runtime_checkable
class KeepsAbove(Protocol):
    """A source that can be told ids already in use, so that it never issues them.

    ``ensure_above(sequence, floor, bits=bits)`` makes every id issued from now on be above
    ``floor``: ids it holds at or below are dropped, and a ticket table behind it (restored
    from a backup, or new beside a table of existing rows) is moved above it. Returns whether
    anything had to move or be dropped.
    """

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool: ...


#: One request of a batch: ``(sequence, count, bits)``.
Request = tuple[str | None, int, int]


@runtime_checkable
class TakesMany(Protocol):
    """A source that serves blocks of many sequences in one round trip.

    ``next_blocks(requests)`` returns, for each ``(sequence, count, bits)`` in order, what
    ``next_block(sequence, count, bits=bits)`` would have: a ``range``, or the
    :class:`~sqlalchemy_tickets.TicketsError` that sequence met (one sequence failing does
    not fail the others). Caches refilling many sequences at once, and ``prepare``, use it.
    """

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]: ...


@runtime_checkable
class Prepares(Protocol):
    """A source that can get many sequences ready at once (``prepare(sequences, bits=...)``):
    their tables made if missing, first contact made, in as few round trips as it can."""

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None: ...


@runtime_checkable
class GivesBackMany(Protocol):
    """A source that takes many ranges back in one round trip: ``give_back_many(items)``
    with ``(sequence, ids, bits)`` items returns how many of each it took back."""

    def give_back_many(self, items: Sequence[tuple[str | None, range, int]]) -> list[int]: ...


def blocks_from(source: TicketSource, requests: Sequence[Request]) -> list[range | TicketsError]:
    """``next_blocks`` of ``source``, or one ``next_block`` per request where it has none."""
    if not requests:
        return []
    if isinstance(source, TakesMany):
        found = source.next_blocks(requests)
        if len(found) != len(requests):
            raise TicketsError(
                f"{source!r}.next_blocks returned {len(found)} results for {len(requests)} "
                "requests; it must return one per request"
            )
        return found
    out: list[range | TicketsError] = []
    for sequence, count, bits in requests:
        try:
            out.append(source.next_block(sequence, count, bits=bits))
        except TicketsError as error:
            out.append(error)
    return out


def prepare_in(source: object, sequences: Sequence[str | None], bits: int) -> None:
    """Have ``source`` get ``sequences`` ready if it can (see :class:`Prepares`)."""
    if sequences and isinstance(source, Prepares):
        source.prepare(sequences, bits=bits)


def ensure_above_in(source: object, sequence: str | None, floor: int, bits: int = 64) -> bool:
    """Tell ``source`` that ids up to ``floor`` are in use, if it can take it (see
    :class:`KeepsAbove`); whether anything moved."""
    if not isinstance(source, KeepsAbove):
        return False
    return bool(source.ensure_above(sequence, floor, bits=bits))


def above(block: range, floor: int) -> range:
    """The ids of ``block`` above ``floor``."""
    if not block or block.start > floor:
        return block
    if block[-1] <= floor:
        return block[len(block):]
    return block[(floor - block.start) // block.step + 1 :]


def check_ids(ids: object, bits: int) -> range:
    """Ids given back must be a ``range`` of increasing ids that a ``bits``-wide sequence can
    hold (an empty one is allowed: nothing to give back)."""
    if not isinstance(ids, range):
        raise TicketsError(f"ids given back must be a range, not {type(ids).__name__}")
    if ids and (ids.step < 1 or ids.start < 1 or ids[-1] > max_id(check_bits(bits))):
        raise TicketsError(
            f"{ids!r} cannot have been issued by a {bits}-bit sequence: give back a range of "
            "increasing ids (step >= 1) between 1 and the sequence's limit"
        )
    return ids


# Sources found unreachable while the process exits: the rest of their ids are not offered,
# so a database that is gone costs the exit one timeout, not one per lane.
_gone_at_exit: weakref.WeakSet[Any] = weakref.WeakSet()
_gone_lock = threading.Lock()


def give_back_to(source: object, sequence: str | None, ids: range, bits: int = 64) -> int:
    """Give ``ids`` back to ``source`` if it can take them; how many it took (``0`` when it
    cannot take ids back, refuses them, or fails: those ids are burned, never reissued here).

    While the process exits, a failure is a DEBUG line: a test suite's databases are often gone
    by then, and ids burned at exit cost nothing.
    """
    if not ids or not isinstance(source, GivesBack):
        return 0
    exiting = _process.exiting()
    if exiting:
        with _gone_lock:
            if source in _gone_at_exit:
                return 0
    try:
        taken = source.give_back(sequence, ids, bits=bits)
    except TicketsError as error:
        if exiting:
            if isinstance(error, DatabaseUnavailable):
                with _gone_lock:
                    _gone_at_exit.add(source)
            logger.debug("at exit, %r could not take back %d ids of %s/%d: %s",
                         source, len(ids), sequence or "Tickets", bits, error)
        else:
            logger.warning("%r could not take back %d ids of %s/%d: %s",
                           source, len(ids), sequence or "Tickets", bits, error)
        return 0
    if isinstance(taken, bool) or not isinstance(taken, int) or not 0 <= taken <= len(ids):
        raise TicketsError(
            f"{source!r}.give_back returned {taken!r} for {len(ids)} ids; it must return how "
            "many it took back (0 to len(ids))"
        )
    return taken


def give_back_all(source: object, items: Sequence[tuple[str | None, range, int]]) -> list[int]:
    """Give every ``(sequence, ids, bits)`` of ``items`` back to ``source``, in one round trip
    where it takes many (:class:`GivesBackMany`), else one by one (:func:`give_back_to`);
    how many of each it took. A failure takes nothing back (those ids are burned)."""
    items = [item for item in items if item[1]]
    if not items or not isinstance(source, GivesBack):
        return [0] * len(items)
    if not isinstance(source, GivesBackMany) or len(items) == 1:
        return [give_back_to(source, seq, ids, bits) for seq, ids, bits in items]
    exiting = _process.exiting()
    if exiting:
        with _gone_lock:
            if source in _gone_at_exit:
                return [0] * len(items)
    try:
        taken = source.give_back_many(items)
    except TicketsError as error:
        if exiting and isinstance(error, DatabaseUnavailable):
            with _gone_lock:
                _gone_at_exit.add(source)
        (logger.debug if exiting else logger.warning)(
            "%r could not take back %d ranges (%d ids): %s", source, len(items),
            sum(len(ids) for _, ids, _ in items), error,
        )
        return [0] * len(items)
    if len(taken) != len(items) or any(
        isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(ids)
        for n, (_, ids, _) in zip(taken, items, strict=True)
    ):
        raise TicketsError(
            f"{source!r}.give_back_many returned {taken!r}; it must return, for each range, "
            "how many ids it took back (0 to its length)"
        )
    return list(taken)


def coalesce(blocks: Iterable[range]) -> list[range]:
    """The ids of ``blocks`` as few ranges as possible: runs that follow on with the same step
    are merged. In increasing order of their first id (within each step and residue), so that
    a caller giving them back from the last one can satisfy a source that takes back only its
    latest block."""
    ordered = sorted(
        (b for b in blocks if b), key=lambda b: (b.step, b.start % b.step, b.start)
    )
    runs: list[range] = []
    for block in ordered:
        last = runs[-1] if runs else None
        if last is not None and last.step == block.step and last[-1] + last.step == block.start:
            runs[-1] = range(last.start, block[-1] + block.step, block.step)
        else:
            runs.append(block)
    runs.sort(key=lambda r: r[-1])
    return runs


def as_runs(ids: Iterable[int], step: int) -> list[range]:
    """Ids in increasing order as the ranges of ``step`` they form."""
    runs: list[range] = []
    first = last = None
    for i in ids:
        if last is not None and i == last + step:
            last = i
            continue
        if first is not None and last is not None:
            runs.append(range(first, last + step, step))
        first = last = i
    if first is not None and last is not None:
        runs.append(range(first, last + step, step))
    return runs


def check_count(count: object, bits: int | None = None) -> int:
    """A block size must be a positive integer; with ``bits``, one that a sequence of that width
    could ever issue (:class:`ExhaustedError` otherwise, so that no SQL sees a count that would
    overflow the database's integers)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TicketsError(f"count must be a positive integer, not {count!r}")
    if bits is not None and count > max_id(check_bits(bits)):
        raise ExhaustedError(
            f"{count} ids do not fit in a {bits}-bit sequence (at most {max_id(bits)} ids "
            "in all); ask for fewer, or use a 64-bit sequence",
            remaining=None,
        )
    return count


def take(source: TicketSource, sequence: str | None, count: int, bits: int) -> list[int]:
    """Exactly ``count`` ids from ``source``, asking again while it returns short blocks."""
    ids: list[int] = []
    while len(ids) < count:
        block = source.next_block(sequence, count - len(ids), bits=bits)
        if len(block) == 0:
            raise TicketsError(f"{source!r} returned an empty block for {sequence!r}")
        ids.extend(block[: count - len(ids)])
    return ids
