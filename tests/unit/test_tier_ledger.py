"""The datacenter tier's ledger (``_tier_ledger.py``): how ranges move between a sequence's head
and its stock, on a state row and ranges held in memory — no database."""

from __future__ import annotations

import pytest

from sqlalchemy_tickets.sources._tier_ledger import (
    GIVEN_BACK,
    NEVER_ISSUED,
    cut_below,
    next_head,
    promote,
    put,
    share_an_id,
    take_from_head,
)
from sqlalchemy_tickets.sources._tier_store import Queued, State

KEY = ("photos", 64)
TOP = 2**63 - 1


def _state(head: range = range(0), kind: int = NEVER_ISSUED, stock: int = 0) -> State:
    state = State(name="photos", bits=64, stock=stock, issued=0, given_back=0, refills=0,
                  refilled=0, rate=0.0, rate_at=0, rate_count=0, claim_owner="",
                  claim_until=0, refilled_at=0, exhausted=0, head_kind=kind, head_first=1,
                  head_last=0, head_step=1)
    state.set_head(head, kind)
    return state


def test_a_block_from_upstream_becomes_the_head_of_an_empty_stock() -> None:
    state = _state()
    moves = put(state, range(1, 101), NEVER_ISSUED)
    assert state.head == range(1, 101) and state.stock == 100
    assert moves.added == [] and moves.gone == []


def test_a_block_from_upstream_queues_behind_a_head() -> None:
    state = _state(range(1, 11), stock=10)
    moves = put(state, range(11, 21), NEVER_ISSUED)
    assert state.head == range(1, 11) and state.stock == 20
    assert moves.added == [Queued(KEY, NEVER_ISSUED, range(11, 21))]


def test_ids_given_back_go_out_before_a_head_never_issued() -> None:
    state = _state(range(50, 60), stock=10)
    moves = put(state, range(5, 8), GIVEN_BACK)
    assert state.head == range(5, 8) and state.head_kind == GIVEN_BACK
    assert moves.added == [Queued(KEY, NEVER_ISSUED, range(50, 60))]
    assert state.stock == 13
    # Behind a head of given-back ids, they queue.
    more = put(state, range(2, 4), GIVEN_BACK)
    assert state.head == range(5, 8) and more.added == [Queued(KEY, GIVEN_BACK, range(2, 4))]


def test_a_block_from_upstream_waits_behind_ranges_given_back() -> None:
    # The head ran out while ranges given back wait in the queue: a refill's block queues too,
    # and the next take promotes the first range (those given back go out first).
    state = _state(stock=5)  # an empty head, five ids given back queued
    moves = put(state, range(100, 200), NEVER_ISSUED)
    assert not state.head and state.stock == 105
    assert moves.added == [Queued(KEY, NEVER_ISSUED, range(100, 200))]
    given_back = Queued(KEY, GIVEN_BACK, range(7, 12))
    block, promoted = next_head(state, given_back, 3)
    assert not block and state.head == range(7, 12) and state.head_kind == GIVEN_BACK
    assert promoted.gone == [given_back]


def test_the_last_id_of_the_space_never_becomes_a_head() -> None:
    """A head's first id moves just past its last in SQL, which must fit a BIGINT: the very
    last id stays queued and goes out from the stock."""
    state = _state()
    moves = put(state, range(TOP - 4, TOP + 1), NEVER_ISSUED)
    assert state.head == range(TOP - 4, TOP) and state.stock == 5
    assert moves.added == [Queued(KEY, NEVER_ISSUED, range(TOP, TOP + 1))]
    take_from_head(state, 10)
    block, moves = next_head(state, moves.added[0], 2)
    assert list(block) == [TOP] and state.stock == 0 and state.issued == 5
    assert moves.gone[0].ids == range(TOP, TOP + 1) and moves.added == []


def test_promote_makes_the_first_queued_range_the_head() -> None:
    state = _state(stock=30)
    first = Queued(KEY, GIVEN_BACK, range(7, 37))
    moves = promote(state, first)
    assert state.head == range(7, 37) and state.head_kind == GIVEN_BACK
    assert moves.gone == [first] and moves.added == []
    assert promote(state, Queued(KEY, NEVER_ISSUED, range(100, 110))).gone == []  # a head


def test_taking_from_the_head_counts_issued_ids_out_of_the_stock() -> None:
    state = _state(range(1, 21, 2), stock=10)
    assert take_from_head(state, 3) == range(1, 7, 2)
    assert state.head == range(7, 21, 2) and state.stock == 7 and state.issued == 3
    assert take_from_head(state, 100) == range(7, 21, 2) and not state.head
    assert take_from_head(state, 1) == range(0)


def test_a_floor_cuts_the_head_and_the_queue() -> None:
    state = _state(range(1, 11), stock=30)
    queued = [Queued(KEY, NEVER_ISSUED, range(11, 21)), Queued(KEY, NEVER_ISSUED, range(21, 31))]
    dropped, moves = cut_below(state, queued, 15)
    assert dropped == 15 and state.stock == 15 and not state.head
    assert moves.gone == queued
    assert moves.added == [Queued(KEY, NEVER_ISSUED, range(16, 21)),
                           Queued(KEY, NEVER_ISSUED, range(21, 31))]


@pytest.mark.parametrize(("a", "b", "shared"), [
    (range(1, 100, 2), range(2, 100, 2), False),  # an odd/even pair interleaves
    (range(1, 100, 2), range(51, 60, 2), True),
    (range(1, 10), range(10, 20), False),
    (range(1, 10), range(9, 20), True),
    (range(0), range(1, 5), False),
])
def test_ranges_share_an_id(a: range, b: range, shared: bool) -> None:
    assert share_an_id(a, b) is shared
    assert share_an_id(b, a) is shared
