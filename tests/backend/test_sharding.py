"""``TicketId`` under SQLAlchemy's ``ShardedSession``: three shard databases, a shard chooser that
shards by ``instance.id % 3``, so the ids must be on the objects before the chooser runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import CachedSource, TicketId, TicketsError, TicketServer, configure
from sqlalchemy_tickets.sources.base import TicketSource

SHARDS = 3
SHARD_BACKENDS = ["sqlite", "postgresql"]


def _model(source: TicketSource | None) -> tuple[type[DeclarativeBase], Any]:
    """A fresh declarative base and a ``Photo`` model whose id column names ``source``."""

    class Base(DeclarativeBase):
        pass

    class Photo(Base):
        __tablename__ = "photos"
        id: Mapped[int] = mapped_column(TicketId("photos", source=source), primary_key=True)
        title: Mapped[str] = mapped_column(sa.String(50))

    return Base, Photo


@pytest.fixture(params=SHARD_BACKENDS, ids=SHARD_BACKENDS)
def shard_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def shards(
    shard_backend: str, make_database: Callable[[str], str]
) -> Iterator[dict[str, sa.Engine]]:
    engines = {str(n): sa.create_engine(make_database(shard_backend)) for n in range(SHARDS)}
    yield engines
    for engine in engines.values():
        engine.dispose()


@pytest.fixture
def server(shard_backend: str, make_database: Callable[[str], str]) -> Iterator[TicketServer]:
    """A ticket server in a database of its own, apart from every shard."""
    ticket_server = TicketServer(make_database(shard_backend))
    yield ticket_server
    ticket_server.dispose()


@pytest.fixture(autouse=True)
def _nothing_configured() -> Iterator[None]:
    configure(None)
    yield
    configure(None)


class Chooser:
    """SQLAlchemy's example chooser (``instance.id % 3``), checking that the id is already set."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, mapper: Any, instance: Any, clause: Any = None, **kw: Any) -> str:
        assert instance is not None, "shard chooser asked without an instance"
        assert isinstance(instance.id, int), "id not assigned before the shard chooser ran"
        self.seen.append(instance.id)
        return str(instance.id % SHARDS)


def _session(shards: dict[str, sa.Engine], chooser: Any) -> ShardedSession:
    return ShardedSession(
        shards=shards,
        shard_chooser=chooser,
        identity_chooser=lambda mapper, primary_key, **kw: [str(primary_key[0] % SHARDS)],
        execute_chooser=lambda context: list(shards),
        expire_on_commit=False,
    )


def _stored(shards: dict[str, sa.Engine]) -> dict[str, list[int]]:
    found = {}
    for name, engine in shards.items():
        with engine.connect() as conn:
            found[name] = sorted(conn.scalars(sa.text("SELECT id FROM photos")))
    return found


def _tables(shards: dict[str, sa.Engine]) -> dict[str, set[str]]:
    """Each shard's tables; for SQLite, with any file beside it (where the embedded default
    would keep its ticket tables)."""
    found = {}
    for name, engine in shards.items():
        tables = set(sa.inspect(engine).get_table_names())
        if engine.url.get_backend_name() == "sqlite":
            path = Path(str(engine.url.database))
            tables |= {f.name for f in path.parent.glob(path.name + "?*")}
        found[name] = tables
    return found


@pytest.mark.parametrize("how", ["configure", "column"])
def test_configured_source_shards_by_id(
    how: str, shards: dict[str, sa.Engine], server: TicketServer
) -> None:
    source: TicketSource
    if how == "configure":
        source = CachedSource(server)
        configure(source)
        base, photo = _model(None)
    else:
        source = server
        base, photo = _model(server)
    for engine in shards.values():
        base.metadata.create_all(engine)
    chooser = Chooser()
    try:
        with _session(shards, chooser) as session:
            photos = [photo(title=f"IMG_{n}") for n in range(30)]
            session.add_all(photos)
            session.commit()
            session.add_all([photo(title=f"more_{n}") for n in range(6)])  # a second flush
            session.commit()
        stored = _stored(shards)
        ids = [i for found in stored.values() for i in found]
        assert len(ids) == 36 and len(set(ids)) == 36  # unique across shards
        assert sorted(chooser.seen) == sorted(ids)
        for name, found in stored.items():
            assert found and all(i % SHARDS == int(name) for i in found)  # on the right shard
            assert _tables(shards)[name] == {"photos"}  # no ticket table on any shard
        with _session(shards, Chooser()) as session:
            assert session.get(photo, photos[0].id).title == "IMG_0"
    finally:
        if isinstance(source, CachedSource):
            source.close()


@pytest.mark.parametrize("answers_none", [False, True], ids=["example_chooser", "none_chooser"])
def test_nothing_configured_refuses_before_writing(
    answers_none: bool, shards: dict[str, sa.Engine], server: TicketServer
) -> None:
    base, photo = _model(None)
    for engine in shards.values():
        base.metadata.create_all(engine)
    chooser = Chooser()

    def lenient(mapper: Any, instance: Any, clause: Any = None, **kw: Any) -> str:
        # A chooser that answers without an instance would put the ticket tables on shard 0.
        return "0" if instance is None else chooser(mapper, instance, clause)

    with _session(shards, lenient if answers_none else chooser) as session:
        session.add_all([photo(title=f"IMG_{n}") for n in range(5)])
        with pytest.raises(TicketsError, match=r"ShardedSession.*configure"):
            session.flush()
        assert chooser.seen == []
        assert _stored(shards) == {name: [] for name in shards}
        assert _tables(shards) == {name: {"photos"} for name in shards}
        # Nothing was written and the session is still usable: configure a source, go on.
        source = CachedSource(server)
        configure(source)
        try:
            session.commit()
        finally:
            source.close()
    stored = _stored(shards)
    assert sum(len(found) for found in stored.values()) == 5
    assert all(i % SHARDS == int(name) for name, found in stored.items() for i in found)
