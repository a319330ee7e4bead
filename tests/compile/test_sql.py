"""The ticket SQL each backend runs, compiled with that backend's dialect (no server)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets._schema import drop_unused_stamps_statements
from sqlalchemy_tickets.dialects import backend_for
from sqlalchemy_tickets.dialects.base import TableSpec
from sqlalchemy_tickets.errors import TicketsError

DIALECTS = {
    "postgresql": postgresql.dialect(),
    "mysql": mysql.dialect(),
    "sqlite": sqlite.dialect(),
}


def _sql(name: str, statement: sa.sql.ClauseElement) -> str:
    return str(statement.compile(dialect=DIALECTS[name]))


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_named_table_ddl_and_seed(name: str) -> None:
    backend = backend_for(name)
    spec = TableSpec(ticket_table("Photos"), start=10, increment=3, offset=2)
    create, seed, register = (_sql(name, s) for s in backend.create_statements(spec))  # type: ignore[arg-type]
    assert "CREATE TABLE IF NOT EXISTS tickets__photos" in create
    assert "PRIMARY KEY (stub)" in create
    assert "tickets__photos" in seed
    # Registered in the stamp table, which it keeps while it exists (nothing left behind).
    assert "INTO tickets_stamps (name) VALUES" in register
    row = backend.seed_row(spec)
    assert row == {"stub": "a", "id": 11 - 3, "increment": 3, "offset": 2}


def test_reserved_words_are_quoted_on_postgresql() -> None:
    spec = TableSpec(ticket_table("Photos"))
    create = _sql("postgresql", backend_for("postgresql").create_statements(spec)[0])  # type: ignore[arg-type]
    assert '"offset" INTEGER NOT NULL' in create


def test_flickr_schema_on_mysql_is_flickrs() -> None:
    spec = TableSpec(ticket_table(None, 64), storage_engine="MyISAM")
    statements = backend_for("mysql").create_statements(spec)
    # No seed row: the first REPLACE INTO makes it; its registration in the stamp table.
    assert len(statements) == 2
    assert "INSERT IGNORE INTO tickets_stamps" in _sql("mysql", statements[1])  # type: ignore[arg-type]
    ddl = _sql("mysql", statements[0])  # type: ignore[arg-type]
    # Quoted: MySQL table names are case-sensitive on most file systems.
    assert ddl.strip().startswith("CREATE TABLE IF NOT EXISTS `Tickets64` (")
    assert "BIGINT(20) UNSIGNED NOT NULL AUTO_INCREMENT" in ddl
    assert "stub CHAR(1) NOT NULL DEFAULT ''" in ddl
    assert "CONSTRAINT stub UNIQUE (stub)" in ddl
    assert "ENGINE=MyISAM" in ddl


def test_flickr_tables_elsewhere_refuse_a_stride() -> None:
    spec = TableSpec(ticket_table(None, 64), increment=2, offset=2)
    with pytest.raises(TicketsError, match="named sequence"):
        backend_for("postgresql").create_statements(spec)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_dropping_many_tables_forgets_their_identities_in_few_statements(name: str) -> None:
    backend = backend_for(name)
    one = [_sql(name, s) for s in backend.drop_statements(TableSpec(ticket_table("photos")))]  # type: ignore[arg-type]
    # One table: its DROP and one DELETE of its name, then the stamp table dropped where no
    # row is left, where SQL can say so; nothing is created to drop a table.
    unused = [_sql(name, s) for s in drop_unused_stamps_statements(backend) or []]  # type: ignore[arg-type]
    assert one[2:] == unused and bool(unused) is (name != "sqlite")
    assert len(one) == 2 + len(unused) and "WHERE tickets_stamps.name = " in one[1]
    assert not any("CREATE" in s for s in one)
    without = backend.drop_statements(TableSpec(ticket_table("photos")), stamps=False)
    assert [_sql(name, s) for s in without] == one[:1]  # type: ignore[arg-type]
    specs = [TableSpec(ticket_table(f"seq{i}")) for i in range(1200)]
    many = [_sql(name, s) for s in backend.drop_statements(*specs)]  # type: ignore[arg-type]
    assert sum(s.strip().startswith("DROP TABLE IF EXISTS") for s in many) == 1200
    deletes = [s for s in many if s.startswith("DELETE FROM tickets_stamps")]
    assert len(deletes) == 3  # 500 names a statement: under every backend's parameter limit
    assert all(" IN (" in s for s in deletes)
    assert backend.drop_statements() == []


def test_mysql_block_is_one_update_read_from_last_insert_id() -> None:
    backend = backend_for("mysql")
    stmt = backend.statement(DIALECTS["mysql"], ticket_table("Photos"), "take_block",
                             backend.advance_statement)
    assert stmt.sql.startswith("UPDATE tickets__photos SET id=last_insert_id(")
    assert "WHERE tickets__photos.stub = " in stmt.sql
    # A restrided table (another increment or offset) is not advanced with a stale stride.
    assert "tickets__photos.`increment` = " in stmt.sql
    assert "tickets__photos.`offset` = " in stmt.sql


def test_flickr_block_on_mysql_has_no_stride_guard() -> None:
    backend = backend_for("mysql")
    stmt = backend.statement(DIALECTS["mysql"], ticket_table(None), "take_block",
                             backend.advance_statement)
    assert stmt.sql.startswith("UPDATE `Tickets64` SET id=last_insert_id(")
    assert "increment" not in stmt.sql


@pytest.mark.parametrize("name", ["postgresql", "sqlite"])
def test_returning_block_is_one_update(name: str) -> None:
    backend = backend_for(name)
    stmt = backend.statement(DIALECTS[name], ticket_table("Photos"), "take_block",
                             backend.advance_statement)
    assert stmt.sql.startswith("UPDATE tickets__photos SET id=(tickets__photos.id + ")
    assert stmt.sql.endswith(("RETURNING tickets__photos.id", "RETURNING id"))
    assert 'tickets__photos."offset" = ' in stmt.sql


def test_unknown_dialect_is_a_clear_error() -> None:
    with pytest.raises(TicketsError, match="no ticket backend for the 'oracle' dialect"):
        backend_for("oracle")
