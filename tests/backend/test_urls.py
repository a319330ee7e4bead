"""URLs a user may reasonably give a ticket server: asyncio drivers' URLs, and SQLite's named
in-memory databases (shared cache)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketServer, configure
from sqlalchemy_tickets.sources.default import embedded_source

ASYNC_DRIVERS = {
    "mysql": ["aiomysql", "asyncmy"],
    "postgresql": ["psycopg_async", "asyncpg"],
    "sqlite": ["aiosqlite"],
}
SYNC_DRIVERS = {"mysql": "pymysql", "postgresql": "psycopg", "sqlite": "pysqlite"}


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(TicketId("notes"), primary_key=True)


@pytest.fixture
def restore_default() -> Iterator[None]:
    yield
    configure(None)


def test_async_driver_urls_use_the_sync_driver_of_their_family(
    make_database: Callable[[str], str], backend: str, restore_default: None, tmp_path: Path
) -> None:
    base = make_url(make_database(backend))
    for driver in ASYNC_DRIVERS[backend]:
        url = base.set(drivername=f"{base.get_backend_name()}+{driver}")
        server = TicketServer(url.render_as_string(hide_password=False))
        try:
            assert server.url.get_driver_name() == SYNC_DRIVERS[backend]
            first = server.next_id("async_urls")
            assert list(server.next_block("async_urls", 3)) == [first + 1, first + 2, first + 3]
        finally:
            server.close()
        # Through configure(url): every flush gets its ids (before: 2 s, then unavailable).
        configure(url.render_as_string(hide_password=False))
        engine = sa.create_engine(f"sqlite:///{tmp_path / (driver + '.db')}")
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            notes = [Note() for _ in range(5)]
            session.add_all(notes)
            session.commit()
            assert len({n.id for n in notes}) == 5
        engine.dispose()


SHARED = "sqlite:///file:{name}?mode=memory&cache=shared&uri=true"


def test_a_shared_in_memory_sqlite_ticket_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    server = TicketServer(SHARED.format(name="edges_shared"))
    try:
        assert [server.next_id("mem") for _ in range(3)] == [1, 2, 3]
        assert list(server.next_block("mem", 2)) == [4, 5]
    finally:
        server.close()
    assert list(tmp_path.iterdir()) == []  # in memory: no file appeared


def test_the_embedded_default_on_a_shared_in_memory_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    engine = sa.create_engine(SHARED.format(name="edges_app"), poolclass=sa.pool.StaticPool)
    keep = engine.connect()  # a shared in-memory database lives while a connection does
    Base.metadata.create_all(engine)
    try:
        for _ in range(2):
            with Session(engine) as session:
                session.add_all([Note() for _ in range(10)])
                session.commit()
        with Session(engine) as session:
            ids = sorted(session.scalars(sa.select(Note.id)))
        assert ids == list(range(1, 21))
        assert embedded_source(engine).source.url.query.get("mode") == "memory"  # type: ignore[attr-defined]
    finally:
        embedded_source(engine).close()
        embedded_source(engine).source.close()  # type: ignore[attr-defined]
        keep.close()
        engine.dispose()
    assert list(tmp_path.iterdir()) == []
