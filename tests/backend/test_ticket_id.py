"""TicketId end to end on every backend, with nothing configured (the embedded default)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from sqlalchemy_tickets import TicketId, TicketServer
from sqlalchemy_tickets.sources.default import embedded_source


class Base(DeclarativeBase):
    pass


class Photo(Base):
    # An application table named exactly like the sequence: the ticket table must not collide.
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("Photos"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
    tags: Mapped[list[Tag]] = relationship(back_populates="photo")


class Tag(Base):
    __tablename__ = "tags"
    id: Mapped[int] = mapped_column(TicketId("tags", bits=32), primary_key=True)
    photo_id: Mapped[int] = mapped_column(sa.ForeignKey("photos.id"))
    photo: Mapped[Photo] = relationship(back_populates="tags")


class Legacy(Base):
    __tablename__ = "legacy"
    id: Mapped[int] = mapped_column(TicketId(), primary_key=True)  # Flickr's Tickets64


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    Base.metadata.create_all(engine)
    yield engine
    embedded_source(engine).close()
    embedded_source(engine).source.close()
    engine.dispose()


def test_two_flushes_in_one_transaction(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        first = [Photo(title=f"a{i}") for i in range(3)]
        session.add_all(first)
        session.flush()
        second = [Photo(title=f"b{i}") for i in range(3)]
        session.add_all(second)
        session.flush()  # the transaction already wrote: tickets must come from elsewhere
        session.commit()
    ids = [p.id for p in first + second]
    assert ids == sorted(ids) and len(set(ids)) == 6
    with Session(engine, expire_on_commit=False) as session:
        assert sorted(session.scalars(sa.select(Photo.id))) == ids


def test_ids_are_assigned_before_any_sql_of_the_flush(engine: sa.Engine) -> None:
    seen: list[object] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.startswith("INSERT INTO photos"):
            seen.append(parameters)

    with Session(engine, expire_on_commit=False) as session:
        photos = [Photo(title=f"photo {i}") for i in range(4)]  # no title looks like an id
        session.add_all(photos)
        session.flush()
        session.commit()
    sa.event.remove(engine, "before_cursor_execute", record)
    # One statement carrying every id: the ids were on the objects before it ran.
    assert len(seen) == 1
    rows = seen[0] if isinstance(seen[0], list) else [seen[0]]
    sent = [v for row in rows for v in (row.values() if isinstance(row, dict) else row)]
    assert sorted(v for v in sent if isinstance(v, int)) == sorted(p.id for p in photos)


def test_rolled_back_ids_are_never_issued_again(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        lost = [Photo(title="lost") for _ in range(5)]
        session.add_all(lost)
        session.flush()
        session.rollback()
    lost_ids = {p.id for p in lost}
    assert None not in lost_ids
    with Session(engine, expire_on_commit=False) as session:
        kept = [Photo(title="kept") for _ in range(5)]
        session.add_all(kept)
        session.commit()
        assert not lost_ids & {p.id for p in kept}
        assert min(p.id for p in kept) > max(lost_ids)


def test_an_object_keeps_its_id_across_a_failed_commit(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        session.add(Photo(id=10_000, title="taken"))
        session.commit()
    with Session(engine, expire_on_commit=False) as session:
        photo = Photo(title="retry me")
        clash = Photo(id=10_000, title="clash")
        session.add_all([photo, clash])
        with pytest.raises(sa.exc.IntegrityError):
            session.commit()
        session.rollback()
        kept = photo.id
        assert kept is not None
        session.expunge_all()
        session.add(photo)
        session.commit()
        assert photo.id == kept


def test_explicit_values_are_kept(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        session.add(Photo(id=123_456, title="mine"))
        session.commit()
    with engine.begin() as conn:
        conn.execute(sa.insert(Photo.__table__).values(id=654_321, title="core"))
        ids = set(conn.scalars(sa.select(Photo.id)))
    assert {123_456, 654_321} == ids


def test_core_and_orm_bulk_inserts_get_ids(engine: sa.Engine) -> None:
    source = embedded_source(engine)
    with engine.begin() as conn:
        before = source.stats()["round_trips"]
        conn.execute(sa.insert(Photo.__table__), [{"title": f"c{i}"} for i in range(500)])
        # One block for the whole executemany.
        assert source.stats()["round_trips"] - before <= 4
        conn.execute(sa.insert(Photo.__table__).values(title="single"))
    with Session(engine, expire_on_commit=False) as session:
        session.execute(sa.insert(Photo), [{"title": f"bulk{i}"} for i in range(50)])
        session.commit()
        ids = session.scalars(sa.select(Photo.id)).all()
    assert len(ids) == len(set(ids)) == 551


def test_relationships_and_32_bit_keys(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        photo = Photo(title="p", tags=[Tag(), Tag()])
        session.add(photo)
        session.commit()
        assert all(t.photo_id == photo.id for t in photo.tags)
        assert all(0 < t.id < 2**31 for t in photo.tags)


def test_flickr_table_by_default(engine: sa.Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        rows = [Legacy() for _ in range(3)]
        session.add_all(rows)
        session.commit()
        assert len({r.id for r in rows}) == 3
    assert sa.inspect(engine).has_table("photos")
    tickets = embedded_source(engine)
    assert tickets.source.describe(None) is not None  # type: ignore[attr-defined]


def test_sequences_are_case_insensitive_and_separate(database_url: str) -> None:
    server = TicketServer(database_url)
    try:
        a = server.next_block("Photos", 3)
        b = server.next_block("photos", 3)
        c = server.next_block("Accounts", 3)
        assert set(a).isdisjoint(b)
        assert list(c) == [1, 2, 3]
    finally:
        server.close()
