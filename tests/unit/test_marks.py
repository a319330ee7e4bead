"""High-water marks (``sources/_marks.py``): what a ticket server issued of each table, by which a
block at or below it is recognised as a rewind."""

from __future__ import annotations

import threading

from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets.sources._marks import Mark, Marks, above_not_in


def test_a_mark_is_made_while_its_lock_is_held() -> None:
    """Callers change marks under ``Marks.lock``; the first change of a table makes its mark
    under that lock (a floor told before the first block): it must not wait for itself."""
    marks = Marks()
    table = ticket_table("photos")
    done = threading.Event()

    def first_floor() -> None:
        with marks.lock:
            marks.of(table).raise_floor(42)
        done.set()

    thread = threading.Thread(target=first_floor, daemon=True)
    thread.start()
    assert done.wait(10), "making a mark under Marks.lock waited for itself"
    assert marks.high(table) == 42


def test_a_mark_follows_blocks_given_back_and_floors() -> None:
    mark = Mark()
    mark.issued(range(1, 11))
    mark.issued(range(11, 21))
    assert mark.high == 20
    mark.returned(range(15, 21))
    assert mark.high == 14
    mark.raise_floor(100)
    mark.returned(range(11, 15))
    assert mark.high == 100  # a floor stays, whatever is given back


def test_only_the_end_of_a_block_is_cut() -> None:
    assert above_not_in(range(1, 11), range(6, 11)) == range(1, 6)
    assert above_not_in(range(1, 11, 2), range(2, 11, 2)) == range(1, 11, 2)  # another lane
    assert above_not_in(range(1, 11), range(20, 30)) == range(1, 11)
