"""The datacenter tier's DDL, per dialect, without a server."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from sqlalchemy_tickets.sources.datacenter import (
    datacenter_table_statements,
    datacenter_tables,
    drop_datacenter_table_statements,
)


@pytest.mark.parametrize("url", ["postgresql://", "mysql://", "mariadb://", "sqlite://"])
def test_table_statements_compile_for_every_dialect(url: str) -> None:
    dialect = make_url(url).get_dialect()()
    name = make_url(url).get_backend_name()
    compiled = [str(s.compile(dialect=dialect)) for s in datacenter_table_statements(dialect=name)]
    assert len(compiled) == 4
    tables, register = compiled[:3], compiled[3]
    assert all("IF NOT EXISTS" in c for c in tables)
    assert "tickets_dc__stock" in tables[0] and "tickets_dc__state" in tables[1]
    assert "tickets_stamps" in tables[2]  # the tier's identity and marks
    # The tier registered there: it keeps the stamp table while its tables exist.
    assert "INTO tickets_stamps (name) VALUES" in register
    if name in ("mysql", "mariadb"):
        assert all("ENGINE=InnoDB" in c for c in tables)
    drops = drop_datacenter_table_statements(dialect=name)
    dropped = [str(s.compile(dialect=dialect)) for s in drops]
    assert "tickets_dc__state" in dropped[0] and "tickets_dc__stock" in dropped[1]
    # Its identity and upstream marks forgotten, the stamp table dropped where none is left.
    assert dropped[2].startswith("DELETE FROM tickets_stamps WHERE tickets_stamps.name = ")
    assert dropped[3].startswith("DELETE FROM tickets_stamps WHERE (tickets_stamps.name LIKE")
    assert len(dropped) == (4 if name == "sqlite" else 5 if name == "postgresql" else 8)


def test_a_prefix_names_both_tables() -> None:
    stock, state = datacenter_tables(table_prefix="eu1_tickets")
    assert (stock.name, state.name) == ("eu1_tickets__stock", "eu1_tickets__state")
    assert [c.name for c in stock.primary_key] == ["sequence_name", "bits", "kind", "first_id"]
