"""SnowflakeId, UUID7, PrefixedId and ObjectId as primary keys on every backend: ORM flush,
Core executemany and ORM bulk insert, order in the database, prefix checks on bind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.columns import UUID7, ObjectId, PrefixedId, SnowflakeId
from sqlalchemy_tickets.generators import WorkerLease


class Base(DeclarativeBase):
    pass


class Flake(Base):
    __tablename__ = "flakes"
    id: Mapped[int] = mapped_column(SnowflakeId(worker_id=17), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer)


class Uuid7Row(Base):
    __tablename__ = "uuid7_rows"
    id: Mapped[uuid.UUID] = mapped_column(UUID7(), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer)


class Post(Base):
    __tablename__ = "posts"
    id: Mapped[str] = mapped_column(PrefixedId("post"), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer)


class Tagged(Base):
    __tablename__ = "tagged"
    id: Mapped[str] = mapped_column(PrefixedId("tag", format="typeid"), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer)


class Doc(Base):
    __tablename__ = "docs"
    id: Mapped[str] = mapped_column(ObjectId(), primary_key=True)
    n: Mapped[int] = mapped_column(sa.Integer)


MODELS: list[type[Any]] = [Flake, Uuid7Row, Post, Tagged, Doc]
ORDERED: list[type[Any]] = [Flake, Uuid7Row, Post, Tagged]  # ObjectId orders by second only
IDS = [m.__name__ for m in MODELS]


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def _ids(engine: sa.Engine, model: type[Any]) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(model.id).order_by(model.id)).scalars())


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_orm_flush_assigns_ids_before_the_insert(engine: sa.Engine, model: type[Any]) -> None:
    statements: list[tuple[str, Any]] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.startswith(f"INSERT INTO {model.__tablename__}"):
            statements.append((statement, parameters))

    with Session(engine, expire_on_commit=False) as session:
        objs = [model(n=i) for i in range(25)]
        session.add_all(objs)
        session.flush()
        assert all(o.id is not None for o in objs)
        session.commit()
    sa.event.remove(engine, "before_cursor_execute", record)
    assert len(statements) == 1  # one executemany; ids were on the objects already
    made = [o.id for o in objs]
    assert len(set(made)) == 25
    stored = _ids(engine, model)
    assert sorted(stored) == sorted(made)
    if model in ORDERED:
        assert made == sorted(made)
        assert stored == made  # the database orders them as they were made


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_core_executemany_and_single_insert(engine: sa.Engine, model: type[Any]) -> None:
    table = model.__table__
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"n": i} for i in range(300)])
        conn.execute(table.insert().values(n=1000))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.n).order_by(table.c.n)).all()
    assert len(rows) == 301 and len({r.id for r in rows}) == 301
    if model in ORDERED:
        assert [r.id for r in rows] == sorted(r.id for r in rows)


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_orm_bulk_insert(engine: sa.Engine, model: type[Any]) -> None:
    with Session(engine) as session:
        session.execute(sa.insert(model), [{"n": i} for i in range(200)])
        session.commit()
    ids = _ids(engine, model)
    assert len(ids) == 200 and len(set(ids)) == 200


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_an_explicit_id_is_kept(engine: sa.Engine, model: type[Any]) -> None:
    value = model.__table__.c.id.type.new_id()
    with Session(engine, expire_on_commit=False) as session:
        session.add(model(id=value, n=1))
        session.commit()
    with engine.begin() as conn:
        conn.execute(model.__table__.insert(), [{"id": model.__table__.c.id.type.new_id(), "n": 2}])
    with Session(engine) as session:
        found = session.get(model, value)
        assert found is not None and found.id == value and type(found.id) is type(value)


def test_uuid7_comes_back_as_uuid(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        row = Uuid7Row(n=1)
        session.add(row)
        session.commit()
    with Session(engine) as session:
        value = session.scalars(sa.select(Uuid7Row.id)).one()
    assert type(value) is uuid.UUID and value == row.id and value.version == 7


def _count(engine: sa.Engine, model: type[Any]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(model)).scalar_one())


def test_a_value_of_another_prefix_is_refused_and_nothing_is_written(engine: sa.Engine) -> None:
    stranger = PrefixedId("user").new_id()
    with pytest.raises(sa_exc.StatementError) as caught:
        with engine.begin() as conn:
            good = Post.__table__.c.id.type.new_id()
            conn.execute(Post.__table__.insert(), [{"id": good, "n": 1}, {"id": stranger, "n": 2}])
    assert isinstance(caught.value.orig, TicketsError)
    assert isinstance(caught.value.orig, ValueError)
    assert "is a 'user' id, not a 'post' id" in str(caught.value.orig)
    # A flush checks hand-set ids itself, before any SQL: a plain TicketsError (ValueError).
    with pytest.raises(TicketsError) as refused:
        with Session(engine) as session:
            session.add_all([Post(n=3), Post(id=stranger, n=4)])
            session.commit()
    assert "is a 'user' id, not a 'post' id" in str(refused.value)
    assert _count(engine, Post) == 0
    # comparing with an id of another kind is refused the same way
    with pytest.raises(sa_exc.StatementError):
        with engine.connect() as conn:
            conn.execute(sa.select(Post).where(Post.id == stranger))
    # LIKE patterns are not ids and pass
    with engine.connect() as conn:
        assert conn.execute(sa.select(Post).where(Post.id.like("post_%"))).all() == []


def test_lease_from_the_application_database(engine: sa.Engine) -> None:
    """``SnowflakeId()`` with neither worker_id nor worker_lease leases from the database
    the rows go to (SQLite: the sibling ``-tickets`` file)."""

    class LeasedBase(DeclarativeBase):
        pass

    class Leased(LeasedBase):
        __tablename__ = "leased"
        id: Mapped[int] = mapped_column(
            SnowflakeId(lease_namespace=f"t{uuid.uuid4().hex[:8]}"), primary_key=True
        )

    LeasedBase.metadata.create_all(engine)
    column = Leased.__table__.c.id.type
    with Session(engine, expire_on_commit=False) as session:
        rows = [Leased() for _ in range(10)]
        session.add_all(rows)
        session.commit()
    generator = column.generator
    assert generator is not None and generator.worker_id is not None
    assert {column.parse(r.id).worker for r in rows} == {generator.worker_id}
    assert isinstance(column.new_id(), int)  # now that a lease database is known
    lease = generator.lease
    assert isinstance(lease, WorkerLease)
    held = [row for row in lease.rows() if row.worker_id == generator.worker_id]
    assert held and held[0].expires_in_ms > 0 and held[0].issued_until_ms >= 0
    generator.close()
    lease.close()
