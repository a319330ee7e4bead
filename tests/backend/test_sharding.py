"""``TicketId`` under SQLAlchemy's ``ShardedSession``: three shard databases, a shard chooser that
shards by ``instance.id % 3``, so the ids must be on the objects before the chooser runs.
(``tests/examples/test_sharding_example.py`` runs the example that also moves rows between
shards through a directory.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import (
    CachedSource,
    SnowflakeId,
    TicketId,
    TicketsError,
    TicketServer,
    TicketServers,
    configure,
)
from sqlalchemy_tickets.sources.base import TicketSource

SHARDS = 3
SHARD_BACKENDS = ["sqlite", "postgresql", "mysql"]


def _model(source: TicketSource | None) -> tuple[type[DeclarativeBase], Any]:
    """A fresh declarative base and a ``Photo`` model whose id column names ``source``."""

    class Base(DeclarativeBase):
        pass

    class Photo(Base):
        __tablename__ = "photos"
        id: Mapped[int] = mapped_column(TicketId("photos", source=source), primary_key=True)
        title: Mapped[str] = mapped_column(sa.String(50))

    return Base, Photo


pytestmark = pytest.mark.backend(*SHARD_BACKENDS)


@pytest.fixture
def shard_backend(backend: str) -> str:
    return backend


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
    ticket_server.close()


@pytest.fixture(autouse=True)
def _nothing_configured() -> Iterator[None]:
    configure(None)
    yield
    configure(None)


class Chooser:
    """SQLAlchemy's example chooser (``instance.id % 3``), checking that the id is already set."""

    def __init__(self, shards: int = SHARDS) -> None:
        self.seen: list[int] = []
        self.shards = shards

    def __call__(self, mapper: Any, instance: Any, clause: Any = None, **kw: Any) -> str:
        assert instance is not None, "shard chooser asked without an instance"
        assert isinstance(instance.id, int), "id not assigned before the shard chooser ran"
        self.seen.append(instance.id)
        return str(instance.id % self.shards)


def _session(shards: dict[str, sa.Engine], chooser: Any) -> ShardedSession:
    return ShardedSession(
        shards=shards,
        shard_chooser=chooser,
        identity_chooser=lambda mapper, primary_key, **kw: [str(primary_key[0] % len(shards))],
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


@pytest.mark.parametrize("n_shards", [2, 3])
def test_pair_of_servers_feeds_shards_by_stride(
    n_shards: int, shard_backend: str, make_database: Callable[[str], str]
) -> None:
    """A pair of ticket servers (odd, even) behind ``id % N``: with N = 3 every shard gets ids
    of both servers; with N = 2 (a factor shared with the stride) each shard gets the ids of
    one server only, so losing that server would stop every new row on its shard."""
    engines = {str(n): sa.create_engine(make_database(shard_backend)) for n in range(n_shards)}
    pair = TicketServers([make_database(shard_backend), make_database(shard_backend)])
    base, photo = _model(pair)
    try:
        for engine in engines.values():
            base.metadata.create_all(engine)
        chooser = Chooser(n_shards)
        for flush in range(8):  # uncached, each flush takes its block from the next server
            with _session(engines, chooser) as session:
                session.add_all([photo(title=f"{flush}-{n}") for n in range(6)])
                session.commit()
        stored = _stored(engines)
        ids = [i for found in stored.values() for i in found]
        assert len(ids) == 48 and len(set(ids)) == 48 and sorted(chooser.seen) == sorted(ids)
        parities = {name: {i % 2 for i in found} for name, found in stored.items()}
        if n_shards == 3:
            assert parities == {name: {0, 1} for name in engines}
        else:
            assert parities == {"0": {0}, "1": {1}}  # shard 0: even server only
    finally:
        pair.close()
        for engine in engines.values():
            engine.dispose()


@pytest.mark.parametrize("configured", [False, True], ids=["lease_beside_data", "worker_id"])
def test_snowflake_under_sharded_session(
    configured: bool, shards: dict[str, sa.Engine]
) -> None:
    """A ``SnowflakeId`` leasing its worker id beside the data has no one database to lease
    from under a ``ShardedSession``: refused before anything is written. With a worker id,
    the ids are on the objects before the chooser runs."""

    class Base(DeclarativeBase):
        pass

    class Event(Base):
        __tablename__ = "photos"
        id: Mapped[int] = mapped_column(
            SnowflakeId(worker_id=7 if configured else None), primary_key=True
        )
        title: Mapped[str] = mapped_column(sa.String(50))

    for engine in shards.values():
        Base.metadata.create_all(engine)
    chooser = Chooser()
    with _session(shards, chooser) as session:
        session.add_all([Event(title=f"e{n}") for n in range(9)])
        if not configured:
            with pytest.raises(TicketsError, match=r"ShardedSession.*worker_id=N"):
                session.flush()
            assert chooser.seen == []
            assert _tables(shards) == {name: {"photos"} for name in shards}
        else:
            session.commit()
    stored = _stored(shards)
    if configured:
        ids = [i for found in stored.values() for i in found]
        assert len(set(ids)) == 9 and sorted(chooser.seen) == sorted(ids)
        assert all(i % SHARDS == int(name) for name, found in stored.items() for i in found)
    else:
        assert stored == {name: [] for name in shards}
