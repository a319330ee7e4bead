"""How a flush and a Core executemany draw their ids: one block per (source, sequence, bits).

The ids come from an in-memory source (``tests/support/memory_source.py``), so these run in
milliseconds on an in-memory SQLite database and count exactly which blocks were asked for;
the backend tests cover the same paths against real ticket servers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId
from support.memory_source import MemorySource

SOURCE = MemorySource()
OTHER = MemorySource(start=1000)


class Base(DeclarativeBase):
    pass


class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("media", source=SOURCE), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(20))


class Video(Base):
    # Another model drawing from the same sequence: the same block serves both.
    __tablename__ = "videos"
    id: Mapped[int] = mapped_column(TicketId("media", source=SOURCE), primary_key=True)


class Tag(Base):
    __tablename__ = "tags"
    id: Mapped[int] = mapped_column(TicketId("tags", bits=32, source=SOURCE), primary_key=True)
    photo_id: Mapped[int] = mapped_column(sa.ForeignKey("photos.id"))  # refers; never minted


class Elsewhere(Base):
    # The same sequence name on another source: a group of its own.
    __tablename__ = "elsewhere"
    id: Mapped[int] = mapped_column(TicketId("media", source=OTHER), primary_key=True)


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)


@pytest.fixture
def engine() -> Iterator[sa.Engine]:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    for source in (SOURCE, OTHER):
        source.calls.clear()
    try:
        yield engine
    finally:
        engine.dispose()


def test_one_block_per_source_sequence_and_bits(engine: sa.Engine) -> None:
    with Session(engine) as session:
        photos = [Photo(title=f"p{i}") for i in range(3)]
        videos = [Video() for _ in range(2)]
        others = [Elsewhere() for _ in range(4)]
        session.add_all([*photos, *others, *videos])
        session.flush()
        tags = [Tag(photo_id=photos[0].id) for _ in range(5)]
        session.add_all([*tags, Note()])
        session.flush()
        session.commit()
        assert [(c.sequence, c.count, c.bits) for c in SOURCE.calls] == [
            ("media", 5, 64),  # photos and videos together
            ("tags", 5, 32),  # second flush
        ]
        assert [(c.sequence, c.count, c.bits) for c in OTHER.calls] == [("media", 4, 64)]
        # Every object got an id from its group's one block, and no id twice.
        media = sorted(o.id for o in [*photos, *videos])
        assert media == list(SOURCE.calls[0].ids)
        assert sorted(o.id for o in others) == list(OTHER.calls[0].ids)
        assert sorted(t.id for t in tags) == list(SOURCE.calls[1].ids)
        assert {t.photo_id for t in tags} == {photos[0].id}  # the foreign key kept its value


def test_ids_set_by_hand_are_kept_and_not_drawn(engine: sa.Engine) -> None:
    with Session(engine) as session:
        chosen = [Photo(id=10_000 + i, title="mine") for i in range(2)]
        drawn = [Photo(title="drawn") for _ in range(3)]
        session.add_all([chosen[0], *drawn, chosen[1]])
        session.commit()
        assert [c.id for c in chosen] == [10_000, 10_001]
        assert [(c.sequence, c.count) for c in SOURCE.calls] == [("media", 3)]
        assert sorted(p.id for p in drawn) == list(SOURCE.calls[0].ids)
        stored = session.scalars(sa.select(Photo.id).order_by(Photo.id)).all()
        assert stored == sorted([*SOURCE.calls[0].ids, 10_000, 10_001])


def test_a_flush_without_new_ids_asks_for_nothing(engine: sa.Engine) -> None:
    with Session(engine) as session:
        session.add_all([Note(), Note(), Photo(id=5, title="mine")])
        session.commit()
    assert SOURCE.calls == []


def test_short_blocks_are_asked_again_until_every_object_has_an_id(engine: sa.Engine) -> None:
    short = MemorySource(max_block=2)
    table = sa.Table(
        "short", sa.MetaData(), sa.Column("id", TicketId("s", source=short), primary_key=True)
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{} for _ in range(5)])
        stored = conn.scalars(sa.select(table.c.id).order_by(table.c.id)).all()
    assert [c.count for c in short.calls] == [5, 3, 1]  # what was still missing each time
    assert stored == short.issued() == [1, 2, 3, 4, 5]


def test_core_executemany_draws_one_block_and_a_single_row_one_id(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(Photo), [{"title": f"t{i}"} for i in range(4)])
        conn.execute(sa.insert(Photo), {"title": "one"})
        conn.execute(sa.insert(Photo), [{"title": "x", "id": 77}, {"title": "y", "id": 78}])
        stored = conn.scalars(sa.select(Photo.id).order_by(Photo.id)).all()
    assert [(c.sequence, c.count, c.bits) for c in SOURCE.calls] == [
        ("media", 4, 64),
        ("media", 1, 64),
    ]
    assert stored == sorted([*SOURCE.issued(), 77, 78])
