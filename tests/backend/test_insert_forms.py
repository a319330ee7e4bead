"""Every insert form SQLAlchemy documents gives each row its own id (CONTRACT §1), and the ORM's
objects hold their ids before any SQL of the flush runs: nothing is read through the caller's
connection or transaction before that (the first flush of a table reads the table's largest key,
on the library's own connection).

Forms: an ORM flush, Core single insert, executemany, multi-VALUES (``insert().values([...])``),
``insert().from_select`` (a clear ``TicketsError``, nothing written), ORM bulk
(``session.execute(insert(Model), rows)``, ``insert(Model).values([...])``,
``bulk_insert_mappings``), and each backend's upsert (``sqlalchemy.dialects.<backend>.insert``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketsError


class Base(DeclarativeBase):
    pass


class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("photos"), primary_key=True)
    slug: Mapped[str] = mapped_column(sa.String(40), unique=True)
    title: Mapped[str] = mapped_column(sa.String(40), default="")


photos = Photo.__table__


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def _slugs(n: int) -> list[str]:
    return [f"s{secrets.token_hex(4)}" for _ in range(n)]


def _ids(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(photos.c.id).order_by(photos.c.id)).scalars())


def _unique_and_all_there(engine: sa.Engine, expected: int) -> None:
    ids = _ids(engine)
    assert len(ids) == expected and len(set(ids)) == expected and all(i > 0 for i in ids)


class _Statements:
    """Every statement the application's engine sends, with what a probe saw when it went."""

    def __init__(self, engine: sa.Engine, probe: Callable[[], Any]) -> None:
        self.seen: list[tuple[str, Any]] = []
        self._probe = probe
        event.listen(engine, "before_cursor_execute", self._before)
        self._engine = engine

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append((statement, self._probe()))

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._before)


def test_objects_hold_their_ids_before_any_sql_of_the_flush(
    engine: sa.Engine, backend: str
) -> None:
    """The first flush of the table in this process: before, its first statement was
    ``SELECT max(photos.id)`` on the caller's connection, while the objects had no ids."""
    with Session(engine) as session:
        objects = [Photo(slug=s) for s in _slugs(3)]
        watch = _Statements(engine, lambda: [o.id for o in objects])
        try:
            session.add_all(objects)
            session.flush()
            first_statement, ids_then = watch.seen[0]
            assert None not in ids_then, (first_statement, ids_then)
            assert not any("max(" in sql.lower() for sql, _ in watch.seen), watch.seen
            session.commit()
        finally:
            watch.close()
    _unique_and_all_there(engine, 3)


@pytest.mark.backend("postgresql")
def test_a_serializable_flush_reads_nothing(engine: sa.Engine) -> None:
    """Under SERIALIZABLE, concurrent inserters conflict only on what they write: the flush's
    transaction reads no table (its first and only statements are the INSERTs)."""
    serializable = engine.execution_options(isolation_level="SERIALIZABLE")
    with Session(serializable) as session:
        watch = _Statements(engine, lambda: None)
        try:
            session.add_all([Photo(slug=s) for s in _slugs(5)])
            session.commit()
        finally:
            watch.close()
    statements = [sql.split()[0].upper() for sql, _ in watch.seen]
    assert set(statements) <= {"INSERT", "BEGIN", "COMMIT"}, watch.seen


@pytest.mark.backend("sqlite")
def test_in_memory_sqlite_reads_its_floor_only_once_the_ids_are_given() -> None:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with engine.begin() as conn:  # a table that held rows before it moved to TicketId
        conn.execute(photos.insert(), [{"id": i, "slug": f"old{i}"} for i in range(1, 8)])
    try:
        with Session(engine) as session:
            objects = [Photo(slug=s) for s in _slugs(3)]
            watch = _Statements(engine, lambda: [o.id for o in objects])
            try:
                session.add_all(objects)
                session.commit()
            finally:
                watch.close()
            assert all(None not in ids for _, ids in watch.seen)
            assert all(o.id > 7 for o in objects)
    finally:
        engine.dispose()


def test_core_single_executemany_and_multi_values(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(photos.insert().values(slug=_slugs(1)[0]))
        conn.execute(photos.insert(), [{"slug": s} for s in _slugs(4)])
        conn.execute(photos.insert().values([{"slug": s} for s in _slugs(5)]))
        conn.execute(photos.insert().values([{"slug": s, "title": "t"} for s in _slugs(1)]))
    _unique_and_all_there(engine, 11)


def test_a_multi_values_insert_keeps_ids_given_by_hand(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(photos.insert().values([{"id": 10**9, "slug": "a"},
                                             {"id": 10**9 + 1, "slug": "b"}]))
        conn.execute(photos.insert().values([{"slug": "c"}, {"slug": "d"}]))
    ids = _ids(engine)
    assert ids[-2:] == [10**9, 10**9 + 1] and len(set(ids)) == 4


def test_insert_from_select_is_refused_with_nothing_written(engine: sa.Engine) -> None:
    """A default gives one value to a whole INSERT ... FROM SELECT: every row would get the
    same id. A clear error (SQLAlchemy's StatementError, whose ``orig`` is the library's
    ``TicketsError``) before anything is written."""
    with engine.begin() as conn:
        conn.execute(photos.insert(), [{"slug": s} for s in _slugs(3)])
    source = sa.select((photos.c.slug + "-copy").label("slug"))
    with pytest.raises(sa.exc.StatementError) as refused, engine.begin() as conn:
        conn.execute(photos.insert().from_select(["slug"], source))
    assert isinstance(refused.value.orig, TicketsError)
    assert "FROM SELECT" in str(refused.value.orig)
    _unique_and_all_there(engine, 3)


def test_orm_bulk_forms(engine: sa.Engine) -> None:
    with Session(engine) as session:
        session.execute(sa.insert(Photo), [{"slug": s} for s in _slugs(4)])
        session.execute(sa.insert(Photo).values([{"slug": s} for s in _slugs(3)]))
        session.bulk_insert_mappings(Photo, [{"slug": s} for s in _slugs(2)])  # type: ignore[arg-type]
        returned = session.scalars(
            sa.insert(Photo).returning(Photo.id), [{"slug": s} for s in _slugs(2)]
        ).all()
        assert len(returned) == 2 and None not in returned
        session.commit()
    _unique_and_all_there(engine, 11)


def _upsert(backend: str) -> Any:
    """The backend's ``insert`` with its "do nothing on a duplicate slug" clause."""
    if backend == "postgresql":
        return lambda rows: postgresql.insert(photos).values(rows).on_conflict_do_nothing(
            index_elements=["slug"])
    if backend == "sqlite":
        return lambda rows: sqlite.insert(photos).values(rows).on_conflict_do_nothing(
            index_elements=["slug"])
    return lambda rows: mysql.insert(photos).values(rows).on_duplicate_key_update(
        title=sa.literal("again"))


def test_upserts_give_new_rows_ids_and_leave_old_rows_theirs(
    engine: sa.Engine, backend: str
) -> None:
    upsert = _upsert(backend)
    first, second = _slugs(3), _slugs(2)
    with engine.begin() as conn:
        conn.execute(upsert([{"slug": s} for s in first]))
        before = dict(conn.execute(sa.select(photos.c.slug, photos.c.id)).all())
        conn.execute(upsert([{"slug": s} for s in first[:1] + second]))  # one is a duplicate
        conn.execute(upsert([{"slug": second[0]}]))
        after = dict(conn.execute(sa.select(photos.c.slug, photos.c.id)).all())
    assert {s: after[s] for s in first} == before
    assert set(after) == set(first + second)
    assert len(set(after.values())) == 5
    with Session(engine) as session:  # the same through an ORM session
        more = _slugs(2)
        session.execute(upsert([{"slug": s} for s in more + first[:1]]))
        session.commit()
    _unique_and_all_there(engine, 7)
