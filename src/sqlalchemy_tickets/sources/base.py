"""What a source of ticket ids is: anything with ``next_id`` and ``next_block``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._naming import check_bits, max_id
from ..errors import ExhaustedError, TicketsError


@runtime_checkable
class TicketSource(Protocol):
    """A source of ticket ids.

    ``next_block(sequence, count)`` returns a ``range`` of at most ``count`` ids (never empty) in
    one round trip at most; ``range.step`` is the stride. A ticket server returns exactly
    ``count``; caches and tiers may return fewer, and callers that need more ask again.
    """

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int: ...

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range: ...


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
