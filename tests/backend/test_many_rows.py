"""The statements a datacenter tier writes many sequences with (``TicketBackend.keys_in``,
``update_rows``, ``delete_rows``): on PostgreSQL, the keys and values go as arrays (sent as
array text); everywhere, exactly the rows named change, whatever their names hold."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets.dialects._registry import backend_for

#: Names an array's text must carry whole: quotes, backslashes, braces, commas, spaces, NULL.
NAMES = ['plain', 'a"quote', "back\\slash", "{brace}", "com,ma", "two words", "NULL", "é", ""]


@pytest.fixture
def rows(
    make_database: Callable[[str], str], backend: str
) -> Iterator[tuple[sa.Connection, sa.Table]]:
    engine = sa.create_engine(make_database(backend))
    table = sa.Table(
        "many_rows", sa.MetaData(),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("bits", sa.SmallInteger, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("rate", sa.Double, nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(table), [
            {"name": name, "bits": bits, "n": 0, "rate": 0.0, "owner": ""}
            for name in NAMES for bits in (32, 64)])
    try:
        with engine.begin() as conn:
            yield conn, table
    finally:
        engine.dispose()


def _all(conn: sa.Connection, table: sa.Table) -> dict[tuple[str, int], tuple[int, float, str]]:
    return {(r.name, r.bits): (r.n, r.rate, r.owner) for r in conn.execute(sa.select(table))}


def test_keys_in_selects_exactly_the_keys_named(
    rows: tuple[sa.Connection, sa.Table], backend: str
) -> None:
    conn, table = rows
    wanted = [(name, 64) for name in NAMES] + [("plain", 32), ("absent", 64)]
    found = {(r.name, r.bits) for r in conn.execute(sa.select(table.c.name, table.c.bits).where(
        backend_for(backend).keys_in([table.c.name, table.c.bits], wanted)))}
    assert found == {*((name, 64) for name in NAMES), ("plain", 32)}


def test_update_rows_sets_each_row_named_and_no_other(
    rows: tuple[sa.Connection, sa.Table], backend: str
) -> None:
    conn, table = rows
    changes = [{"name": name, "bits": 64, "n": 2**62 + i, "rate": 0.1 * i + 1e-9,
                "owner": f'vm:{i}:"{name}"'} for i, name in enumerate(NAMES)]
    backend_for(backend).update_rows(conn, table, ("name", "bits"), changes)
    after = _all(conn, table)
    for i, name in enumerate(NAMES):
        n, rate, owner = after[(name, 64)]
        assert (n, owner) == (2**62 + i, f'vm:{i}:"{name}"')
        assert rate == pytest.approx(0.1 * i + 1e-9, rel=1e-12)
        assert after[(name, 32)] == (0, 0.0, "")


def test_delete_rows_deletes_each_row_named_and_no_other(
    rows: tuple[sa.Connection, sa.Table], backend: str
) -> None:
    conn, table = rows
    gone = [(name, 32) for name in NAMES[::2]] + [("absent", 32)]
    backend_for(backend).delete_rows(conn, table, ("name", "bits"), gone)
    assert set(_all(conn, table)) == {
        (name, bits) for name in NAMES for bits in (32, 64)} - set(gone)
