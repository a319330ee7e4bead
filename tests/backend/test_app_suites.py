"""The library inside applications' own test suites: an engine per test, in-memory SQLite,
databases dropped before the process exits, ticket tables reset between tests.

Nothing is configured in these tests: the embedded default is what an application that only
wrote ``TicketId("photos")`` gets, and it must behave like part of the application's engine.
Connections are counted on the server (``pg_stat_activity`` / the MariaDB process list),
threads by name, exits in real subprocesses whose stderr is read.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

from sqlalchemy_tickets import TicketId, TicketsError, configure, drop_ticket_tables
from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets.sources.default import embedded_source
from support.proxy import TcpProxy

SRC = str(Path(__file__).resolve().parents[2] / "src")


class Base(DeclarativeBase):
    pass


class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("photos"), primary_key=True)


class Album(Base):
    __tablename__ = "albums"
    id: Mapped[int] = mapped_column(TicketId("albums"), primary_key=True)


class Tag(Base):
    __tablename__ = "tags"
    id: Mapped[int] = mapped_column(TicketId("tags", bits=32), primary_key=True)


MODELS = (Photo, Album, Tag)


def _flush_one_of_each(engine: sa.Engine) -> list[int]:
    with Session(engine) as session:
        rows = [model() for model in MODELS]
        session.add_all(rows)
        session.commit()
        return [row.id for row in rows]


def _library_threads() -> list[threading.Thread]:
    names = ("tickets-", "sqlalchemy-tickets-close")
    return [t for t in threading.enumerate() if t.name.startswith(names)]


def _join_library_threads(timeout: float = 10.0) -> list[threading.Thread]:
    """Wait for the library's refill and closing threads to end; those still alive."""
    deadline = time.monotonic() + timeout
    for thread in _library_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    return _library_threads()


class _Connects:
    """Counts the connections any pool of the process makes while it is entered."""

    def __init__(self) -> None:
        self.count = 0

    def _made(self, *_: object) -> None:
        self.count += 1

    def __enter__(self) -> _Connects:
        sa.event.listen(sa.pool.Pool, "connect", self._made)
        return self

    def __exit__(self, *_: object) -> None:
        sa.event.remove(sa.pool.Pool, "connect", self._made)


# -- an engine per test ------------------------------------------------------------------------


def _connections_to(admin: sa.Engine, backend: str, database: str) -> int:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"
        if backend == "postgresql"
        else "SELECT count(*) FROM information_schema.processlist "
        "WHERE db = :db AND id <> CONNECTION_ID()"
    )
    with admin.connect() as conn:
        return int(conn.execute(sa.text(query), {"db": database}).scalar_one())


def _settled_count(admin: sa.Engine, backend: str, database: str, at_most: int) -> int:
    """The connection count once it is ``at_most`` or after 10 s: a server takes a moment to
    see a closed socket's session end, and the assertion is on the count, not the moment."""
    deadline = time.monotonic() + 10.0
    while True:
        count = _connections_to(admin, backend, database)
        if count <= at_most or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


ENGINES = 12


@pytest.mark.backend("postgresql", "mysql")
@pytest.mark.parametrize("ending", ["dispose", "collect"])
def test_an_engine_per_test_leaves_no_connection_or_thread(
    backend: str, database_url: str, ending: str
) -> None:
    url = make_url(database_url)
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        ids: list[list[int]] = []
        for _ in range(ENGINES):
            engine = sa.create_engine(url)
            Base.metadata.create_all(engine)
            ids.append(_flush_one_of_each(engine))
            if ending == "dispose":
                embedded_source(engine).wait_idle(10.0)  # no refill under way
                with _Connects() as connects:
                    engine.dispose()
                # Its ids went back on the library's connections already open, before they
                # closed with the engine.
                assert connects.count == 0
            else:
                engine.pool.dispose()  # the application's own connections: its business
            del engine
            gc.collect()
            assert not _join_library_threads(), "a refill or closing thread outlived its engine"
        # Each engine's ids went back when it ended: the next engine went on from there.
        assert ids == [[n] * len(MODELS) for n in range(1, ENGINES + 1)]
        assert _settled_count(admin, backend, url.database or "", 0) == 0
    finally:
        admin.dispose()


def test_a_forked_child_resetting_its_pool_keeps_the_embedded_default(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    Base.metadata.create_all(engine)
    before = _flush_one_of_each(engine)
    cache = embedded_source(engine)
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        engine.dispose(close=False)  # SQLAlchemy's advice for a pool inherited through fork
        kept = embedded_source(engine) is cache
        results.put((kept, _flush_one_of_each(engine)))

    process = context.Process(target=child)
    process.start()
    kept, in_child = results.get(timeout=60)
    process.join(60)
    assert process.exitcode == 0
    assert kept, "dispose(close=False) in a forked child closed the embedded default"
    assert not cache.closed
    in_parent = _flush_one_of_each(engine)
    for issued in zip(before, in_child, in_parent, strict=True):  # per sequence
        assert len(set(issued)) == 3

    engine.dispose()  # in the process that made it: closed, and made again on next use
    assert cache.closed
    assert embedded_source(engine) is not cache
    engine.dispose()


# -- in-memory SQLite ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options"),
    [
        # FastAPI's documented test set-up.
        ("sqlite://", {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}),
        (
            "sqlite:///:memory:",
            {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}},
        ),
        (
            "sqlite:///file:appmem?mode=memory&cache=shared&uri=true",
            {"poolclass": sa.pool.NullPool},
        ),
    ],
    ids=["static-pool", "memory-static", "shared-cache-uri"],
)
def test_in_memory_sqlite_with_several_sequences_and_threads(
    url: str, options: dict[str, object]
) -> None:
    engine = sa.create_engine(url, **options)  # type: ignore[arg-type]
    keep = engine.connect() if "cache=shared" in url else None  # keeps the shared db alive
    try:
        Base.metadata.create_all(engine)
        app_lock = threading.Lock()  # one in-memory connection: the app's sessions take turns
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def work() -> None:
            start.wait()
            try:
                for _ in range(25):
                    with app_lock:
                        _flush_one_of_each(engine)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors[0]
        with Session(engine) as session:
            for model in MODELS:
                ids = session.scalars(sa.select(model.id)).all()
                assert len(ids) == len(set(ids)) == 100
    finally:
        if keep is not None:
            keep.close()
        engine.dispose()
    assert not _join_library_threads()


# -- exit ------------------------------------------------------------------------------------


def _run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


_EXIT_PRELUDE = """
    import logging, sys
    import sqlalchemy as sa
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
    from sqlalchemy_tickets import TicketId

    # What pytest leaves behind: a handler whose stream is closed before the process exits,
    # beside a plain stderr handler at WARNING.
    logging.basicConfig(level=logging.WARNING)
    closed = logging.StreamHandler(open("/dev/null", "w"))
    logging.getLogger().addHandler(closed)

    class Base(DeclarativeBase):
        pass

    models = []
    for name in ("photos", "albums", "tags", "users"):
        models.append(type(name.title(), (Base,), {
            "__tablename__": name,
            "id": mapped_column(TicketId(name), primary_key=True),
        }))
"""


@pytest.mark.backend("postgresql", "mysql")
def test_exit_after_the_database_was_dropped_is_quiet(
    backend: str, make_database: Callable[[str], str], backend_admin_url: Callable[[str], str]
) -> None:
    url = make_database(backend)
    admin_url = backend_admin_url(backend)
    script = _EXIT_PRELUDE + """
    url, admin_url = sys.argv[1], sys.argv[2]
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([model() for model in models for _ in range(3)])
        session.commit()
    name = sa.engine.make_url(url).database
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if admin.dialect.name == "postgresql":
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        else:
            for (pid,) in conn.execute(sa.text(
                "SELECT id FROM information_schema.processlist WHERE db = :db"), {"db": name}):
                conn.exec_driver_sql(f"KILL {int(pid)}")
            conn.exec_driver_sql(f"DROP DATABASE `{name}`")
    admin.dispose()
    closed.stream.close()
    print("done")
    """
    result = _run_script(script, url, admin_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""


def test_exit_of_in_memory_sqlite_used_from_threads_is_quiet() -> None:
    script = _EXIT_PRELUDE + """
    import threading
    from sqlalchemy.pool import StaticPool
    engine = sa.create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    def work():
        with Session(engine) as session:
            session.add_all([model() for model in models])
            session.commit()
    for _ in range(3):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    closed.stream.close()
    print("done")
    """
    result = _run_script(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""


def test_exit_with_a_hung_ticket_server_costs_one_timeout(
    make_database: Callable[[str], str],
) -> None:
    """Eight sequences hold ids when the server hangs: the exit gives up on the server after
    its first timeout instead of waiting once per sequence."""
    url = make_database("postgresql")
    target = make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        script = """
        import sys, time
        from sqlalchemy_tickets import CachedSource, TicketServer
        cache = CachedSource(TicketServer(sys.argv[1], timeout=1.0), timeout=1.0)
        for i in range(8):
            cache.next_id(f"seq{i}")
        print("ready", flush=True)
        sys.stdin.readline()
        """
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), proxy.url(url)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env,
        )
        try:
            assert process.stdout is not None and process.stdin is not None
            assert process.stdout.readline().strip() == "ready"
            proxy.hang()
            began = time.monotonic()
            process.stdin.write("\n")
            process.stdin.flush()
            _, stderr = process.communicate(timeout=60)
            took = time.monotonic() - began
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            proxy.forward()
    assert process.returncode == 0, stderr
    # One timeout for the first give-back (plus interpreter teardown), not eight.
    assert took < 5.0, f"exit took {took:.1f} s with a hung server"


# -- resetting ticket tables between tests ----------------------------------------------------


@pytest.fixture
def app_engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    yield engine
    engine.dispose()


def test_drop_ticket_tables_starts_the_sequences_again(app_engine: sa.Engine) -> None:
    for _ in range(3):
        Base.metadata.create_all(app_engine)
        assert _flush_one_of_each(app_engine) == [1, 1, 1]
        Base.metadata.drop_all(app_engine)
        embedded_source(app_engine).wait_idle(10.0)  # no refill under way
        with _Connects() as connects:
            dropped = drop_ticket_tables(Base.metadata, app_engine)
        assert connects.count == 0  # through the embedded default's connections
        assert sorted(dropped) == sorted(
            ticket_table(t.sequence, t.bits).name
            for t in (model.__table__.c.id.type for model in MODELS)
        )
    # Without it, drop_all() alone leaves the ticket tables: ids go on.
    Base.metadata.create_all(app_engine)
    assert _flush_one_of_each(app_engine) == [1, 1, 1]
    Base.metadata.drop_all(app_engine)
    Base.metadata.create_all(app_engine)
    assert min(_flush_one_of_each(app_engine)) > 1


def test_drop_ticket_tables_refuses_a_configured_source(app_engine: sa.Engine) -> None:
    Base.metadata.create_all(app_engine)
    first = _flush_one_of_each(app_engine)
    configure(sa.engine.make_url("sqlite://"))
    try:
        with pytest.raises(TicketsError, match="embedded default"):
            drop_ticket_tables(Base.metadata, app_engine)
    finally:
        configure(None)
    # Nothing was dropped: the embedded default goes on from where it was.
    assert all(now > then for now, then in zip(_flush_one_of_each(app_engine), first, strict=True))
