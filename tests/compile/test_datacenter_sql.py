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
    assert len(compiled) == 3
    assert all("IF NOT EXISTS" in c for c in compiled)
    assert "tickets_dc__stock" in compiled[0] and "tickets_dc__state" in compiled[1]
    assert "tickets_stamps" in compiled[2]  # the tier's identity and marks
    if name in ("mysql", "mariadb"):
        assert all("ENGINE=InnoDB" in c for c in compiled)
    drops = drop_datacenter_table_statements(dialect=name)
    dropped = [str(s.compile(dialect=dialect)) for s in drops]
    assert "tickets_dc__state" in dropped[0] and "tickets_dc__stock" in dropped[1]


def test_a_prefix_names_both_tables() -> None:
    stock, state = datacenter_tables(table_prefix="eu1_tickets")
    assert (stock.name, state.name) == ("eu1_tickets__stock", "eu1_tickets__state")
    assert [c.name for c in stock.primary_key] == ["sequence_name", "bits", "kind", "first_id"]
