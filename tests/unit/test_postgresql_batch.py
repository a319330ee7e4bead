"""The literals PostgreSQL's batched updates write into their SQL (``_filled``): the library's
integers and short strings only; anything else goes alone, its parameters bound by the driver."""

from __future__ import annotations

from sqlalchemy_tickets.dialects.postgresql import _filled

SQL = "UPDATE t SET id=%(before)s::BIGINT WHERE t.stub = %(stub)s::VARCHAR AND t.id = %(last)s"


def test_integers_and_strings_are_written_in() -> None:
    assert _filled(SQL, {"before": 10, "stub": "a", "last": -3}) == (
        "UPDATE t SET id=10::BIGINT WHERE t.stub = 'a'::VARCHAR AND t.id = -3")


def test_a_quote_is_doubled() -> None:
    filled = _filled(SQL, {"before": 1, "stub": "FIRST 1 ('s')", "last": 2})
    assert filled is not None and "'FIRST 1 (''s'')'" in filled


def test_what_a_literal_could_misread_goes_alone() -> None:
    # A backslash means something else where standard_conforming_strings is off; a bool, a
    # None or a float is not what these statements take.
    for odd in ("a\\'", True, None, 1.5):
        assert _filled(SQL, {"before": 1, "stub": odd, "last": 2}) is None
