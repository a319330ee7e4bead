"""A datacenter tier's ledger: how ranges move between a sequence's head (the range being handed
out, in its state row) and its stock (the ranges queued behind it). Pure bookkeeping on a locked
:class:`~sqlalchemy_tickets.sources._tier_store.State` and the ranges read with it — no SQL, no
threads: the caller reads the rows, asks here what changes, and writes the rows back.

The order ids go out in: ranges given back (kind 0) before ranges never issued (kind 1), each
kind upwards. A range whose ids pass what a head may hold (the last ids of the 64-bit space:
``_tier_store.headable``) stays queued and goes out from there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._tier_store import Queued, State, headable
from .base import above

#: Kinds of ranges in stock, in the order they go out.
GIVEN_BACK, NEVER_ISSUED = 0, 1


@dataclass
class Moves:
    """The stock rows a change removes and adds (the state row is changed in place)."""

    gone: list[Queued] = field(default_factory=list)
    added: list[Queued] = field(default_factory=list)

    def __iadd__(self, other: Moves) -> Moves:
        self.gone += other.gone
        self.added += other.added
        return self


def promote(state: State, first: Queued | None) -> Moves:
    """The head is empty: make ``first`` (the range that goes out next from the stock table)
    the head, as much of it as a head may hold; the rest stays queued. Nothing happens
    without a range, or where the head holds ids."""
    moves = Moves()
    if first is None or state.head:
        return moves
    moves.gone.append(first)
    head, rest = headable(first.ids)
    state.set_head(head, first.kind)
    if rest:
        moves.added.append(Queued(first.key, first.kind, rest))
    return moves


def next_head(state: State, first: Queued, count: int) -> tuple[range, Moves]:
    """The head is empty and ``first`` goes out next: :func:`promote` it; where no id of it
    may be a head (the last ids of the 64-bit space), up to ``count`` of them go out from the
    stock at once. Returns those (empty when the head was made) and the rows to change."""
    moves = promote(state, first)
    if state.head or not moves.added:
        return range(0), moves
    rest = moves.added.pop().ids
    block, rest = rest[:count], rest[count:]
    if rest:
        moves.added.append(Queued(first.key, first.kind, rest))
    state.stock -= len(block)
    state.issued += len(block)
    return block, moves


def take_from_head(state: State, count: int) -> range:
    """Up to ``count`` ids from the head (counted as issued, out of the stock)."""
    block = state.head[:count]
    state.set_head(state.head[len(block):], state.head_kind)
    state.stock -= len(block)
    state.issued += len(block)
    return block


def put(state: State, ids: range, kind: int) -> Moves:
    """``ids`` into the stock (counted in ``state.stock``): the head where it is empty (ids
    never issued: only where nothing is queued either, since ranges given back may wait
    there and go out first; the next take promotes the first), or where it holds ids never
    issued and ``ids`` were given back (those go out first: the head goes back to the
    queue); queued otherwise."""
    moves = Moves()
    if not ids:
        return moves
    queued = state.stock - len(state.head)
    state.stock += len(ids)
    if (not state.head and (kind == GIVEN_BACK or not queued)) or (
        kind == GIVEN_BACK and state.head_kind == NEVER_ISSUED
    ):
        if state.head:
            moves.added.append(Queued(state.key, state.head_kind, state.head))
        head, rest = headable(ids)
        state.set_head(head, kind)
        ids = rest
    if ids:
        moves.added.append(Queued(state.key, kind, ids))
    return moves


def cut_below(state: State, queued: Iterable[Queued], floor: int) -> tuple[int, Moves]:
    """Drop every id at or below ``floor`` from the head and from ``queued`` (the ranges
    starting at or below it); how many went, and the rows to change."""
    dropped = 0
    head = above(state.head, floor)
    if len(head) != len(state.head):
        dropped += len(state.head) - len(head)
        state.set_head(head, state.head_kind)
    moves = Moves()
    for q in queued:
        kept = above(q.ids, floor)
        dropped += len(q.ids) - len(kept)
        moves.gone.append(q)
        if kept:
            moves.added.append(Queued(q.key, q.kind, kept))
    state.stock -= dropped
    return dropped, moves


def share_an_id(a: range, b: range) -> bool:
    """Whether two increasing ranges have an id in common (strides are small: a ticket server
    pair's N). Ranges of an odd/even pair interleave: rows spanning the same interval may
    still share no id."""
    if not a or not b:
        return False
    low, high = max(a.start, b.start), min(a[-1], b[-1])
    if low > high:
        return False
    first = a.start + -(-(low - a.start) // a.step) * a.step  # a's first id >= low
    period = a.step * b.step // math.gcd(a.step, b.step)
    return any(x in b for x in range(first, min(high, first + period - 1) + 1, a.step))
