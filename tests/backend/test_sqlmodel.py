"""SQLModel models with foreign keys to ``TicketId`` keys (``docs/sqlmodel.md``): the recommended
model makes a BIGINT foreign key, which holds ids past 32 bits on PostgreSQL and MySQL/MariaDB;
SQLModel's own ``int`` foreign key is an INTEGER, which PostgreSQL lets in and then refuses such
ids ("integer out of range"), and which InnoDB refuses to make at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import registry
from sqlmodel import Field, Session, SQLModel, create_engine

from sqlalchemy_tickets import TicketId, TicketServer, configure

#: A sequence that starts past the 32-bit range, as a busy or shared one gets there.
START = 2**31 + 10


class Base(SQLModel, registry=registry()):
    """The models' own registry and metadata, not SQLModel's global ones."""


class Writer(Base, table=True):
    id: int | None = Field(default=None, primary_key=True, sa_type=TicketId("writers"))
    name: str


class Essay(Base, table=True):
    """As ``docs/sqlmodel.md`` recommends: the foreign key has the key's width."""

    id: int | None = Field(default=None, primary_key=True, sa_type=TicketId("essays"))
    writer_id: int = Field(foreign_key="writer.id", sa_type=sa.BigInteger)


class Note(Base, table=True):
    """What SQLModel makes of a plain ``int`` foreign key: an INTEGER."""

    id: int | None = Field(default=None, primary_key=True, sa_type=TicketId("notes"))
    writer_id: int = Field(foreign_key="writer.id")


def _table(model: type[SQLModel]) -> sa.Table:
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, sa.Table)
    return table


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """The recommended models' tables, drawing their keys from a sequence past 32 bits."""
    server = TicketServer(database_url)
    server.create_tables(["writers", "essays", "notes"], start=START)
    engine = create_engine(database_url)
    Base.metadata.create_all(engine, tables=[_table(Writer), _table(Essay)])
    configure(server)
    try:
        yield engine
    finally:
        configure(None)
        Base.metadata.drop_all(engine)
        engine.dispose()
        server.close()


def _column_type(engine: sa.Engine, table: str, column: str) -> sa.types.TypeEngine[object]:
    columns = {c["name"]: c["type"] for c in sa.inspect(engine).get_columns(table)}
    return columns[column]


@pytest.mark.backend("postgresql", "mysql")
def test_the_recommended_foreign_key_is_a_bigint_that_holds_ids_past_32_bits(
    engine: sa.Engine,
) -> None:
    assert isinstance(_column_type(engine, "essay", "writer_id"), sa.BigInteger)
    with Session(engine) as session:
        writer = Writer(name="Montaigne")
        session.add(writer)
        session.flush()
        assert writer.id is not None and writer.id > 2**31
        session.add(Essay(writer_id=writer.id))
        session.commit()
        assert session.scalars(sa.select(Essay.writer_id)).one() == writer.id  # type: ignore[arg-type]


@pytest.mark.backend("postgresql")
def test_a_plain_int_foreign_key_refuses_ids_past_32_bits_on_postgresql(
    engine: sa.Engine,
) -> None:
    Base.metadata.create_all(engine, tables=[_table(Note)])
    assert not isinstance(_column_type(engine, "note", "writer_id"), sa.BigInteger)
    with Session(engine) as session:
        writer = Writer(name="Montaigne")
        session.add(writer)
        session.commit()
        session.add(Note(writer_id=writer.id))
        with pytest.raises(sa_exc.DBAPIError, match="out of range"):
            session.commit()


@pytest.mark.backend("mysql")
def test_a_plain_int_foreign_key_is_refused_by_innodb(engine: sa.Engine) -> None:
    with pytest.raises(sa_exc.OperationalError, match="Foreign key constraint"):
        Base.metadata.create_all(engine, tables=[_table(Note)])
