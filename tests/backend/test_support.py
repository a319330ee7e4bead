"""The test infrastructure itself, exercised against real servers.

The fault-injection proxy, the private servers and the throwaway databases are what every
backend test relies on to be meaningful; if the proxy silently forwarded while "refusing",
or ``make_database`` handed two tests the same database, failures elsewhere would be
invisible. Each test here asserts an observable effect on a real server, so each can fail.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from support.proxy import TcpProxy
from support.servers import ServerProcess, free_port, start_private_postgresql

TESTS_DIR = Path(__file__).resolve().parents[1]


def _mysql_connect(url: str, **kwargs: Any) -> pymysql.connections.Connection:
    """Open a raw PyMySQL connection to a SQLAlchemy URL (drivers' own errors are the point)."""
    u = make_url(url)
    return pymysql.connect(
        host=u.host,
        port=u.port or 3306,
        user=u.username,
        password=u.password or "",
        database=u.database or None,
        autocommit=True,
        connect_timeout=5,
        **kwargs,
    )


def _pg_connect(url: str, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
    u = make_url(url)
    return psycopg.connect(
        host=u.host,
        port=u.port or 5432,
        user=u.username,
        password=u.password,
        dbname=u.database,
        autocommit=True,
        connect_timeout=5,
        **kwargs,
    )


def _target(url: str) -> tuple[str, int]:
    u = make_url(url)
    assert u.host is not None and u.port is not None
    return u.host, u.port


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``condition`` until true or the deadline passes (events happen on other threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _assert_refused(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


# --------------------------------------------------------------------------------------------
# Proxy
# --------------------------------------------------------------------------------------------


def test_proxy_forwards_postgresql_query(postgresql_url: str) -> None:
    with TcpProxy(*_target(postgresql_url)) as proxy:
        engine = create_engine(proxy.url(postgresql_url))
        try:
            with engine.connect() as conn:
                row = conn.execute(text("SELECT current_database(), inet_server_port()")).one()
        finally:
            engine.dispose()
        assert row[0] == make_url(postgresql_url).database
        assert row[1] == make_url(postgresql_url).port  # answered by the real server
        assert make_url(proxy.url(postgresql_url)).port == proxy.port != row[1]
        assert proxy.connections_accepted == 1


def test_proxy_forwards_mariadb_query(mysql_url: str) -> None:
    with TcpProxy(*_target(mysql_url)) as proxy:
        engine = create_engine(proxy.url(mysql_url))
        try:
            with engine.connect() as conn:
                row = conn.execute(text("SELECT DATABASE(), @@port")).one()
        finally:
            engine.dispose()
        assert row[0] == make_url(mysql_url).database
        assert row[1] == make_url(mysql_url).port
        assert proxy.port != row[1]
        assert proxy.connections_accepted == 1


def test_proxy_url_keeps_credentials_and_database() -> None:
    with TcpProxy("127.0.0.1", 1) as proxy:
        url = make_url(proxy.url("postgresql+psycopg://u:p%40ss@db.example:5432/tickets"))
    assert (url.drivername, url.username, url.password, url.database) == (
        "postgresql+psycopg",
        "u",
        "p@ss",
        "tickets",
    )
    assert (url.host, url.port) == ("127.0.0.1", proxy.port)


def test_refuse_closes_connections_and_forward_relistens_on_same_port(mysql_url: str) -> None:
    with TcpProxy(*_target(mysql_url)) as proxy:
        port = proxy.port
        conn = _mysql_connect(proxy.url(mysql_url), read_timeout=5)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")

        proxy.refuse()
        # The existing connection was closed by the "server"...
        started = time.monotonic()
        with pytest.raises(pymysql.err.OperationalError):
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
        assert time.monotonic() - started < 4  # closed, not timed out
        conn.close()
        # ...and new connects are refused at the TCP level, through the driver too.
        _assert_refused(port)
        with pytest.raises(pymysql.err.OperationalError) as excinfo:
            _mysql_connect(proxy.url(mysql_url))
        assert excinfo.value.args[0] == 2003  # CR_CONN_HOST_ERROR
        assert os.strerror(errno.ECONNREFUSED) in str(excinfo.value)

        proxy.forward()
        assert proxy.port == port
        conn = _mysql_connect(proxy.url(mysql_url), read_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 42")
                assert cur.fetchone() == (42,)
        finally:
            conn.close()


def test_refuse_and_forward_with_postgresql(postgresql_url: str) -> None:
    with TcpProxy(*_target(postgresql_url)) as proxy:
        proxy.refuse()
        with pytest.raises(psycopg.OperationalError, match="[Cc]onnection refused"):
            _pg_connect(proxy.url(postgresql_url))
        proxy.forward()
        with _pg_connect(proxy.url(postgresql_url)) as conn:
            assert conn.execute("SELECT 7").fetchone() == (7,)


def test_hang_makes_pymysql_read_time_out(mysql_url: str) -> None:
    with TcpProxy(*_target(mysql_url)) as proxy:
        conn = _mysql_connect(proxy.url(mysql_url), read_timeout=1)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            proxy.hang()
            started = time.monotonic()
            with pytest.raises(pymysql.err.OperationalError, match="timed out"):
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
            elapsed = time.monotonic() - started
        finally:
            conn.close()
        assert 0.9 <= elapsed < 10

        # New connections are still accepted at the TCP level, but no greeting comes through.
        accepted = proxy.connections_accepted
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            assert _wait_for(lambda: proxy.connections_accepted == accepted + 1)
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(1)
        assert proxy.mode == "hang"


def test_hang_then_forward_delivers_held_bytes(postgresql_url: str) -> None:
    """A query sent while hung stays pending, then completes intact once forwarding resumes."""
    with TcpProxy(*_target(postgresql_url)) as proxy:
        with _pg_connect(proxy.url(postgresql_url)) as conn:
            proxy.hang()
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(lambda: conn.execute("SELECT 'resumed'").fetchone())
                with pytest.raises(FuturesTimeout):
                    pending.result(timeout=0.5)  # a bound: still no answer while hung
                with _pg_connect(postgresql_url) as direct:
                    direct.execute("SELECT 1")  # the real server is fine meanwhile
                proxy.forward()
                assert pending.result(timeout=5) == ("resumed",)


def test_swallow_reply_after_drops_reply_of_executed_statement(mysql_url: str) -> None:
    direct = _mysql_connect(mysql_url, read_timeout=5)
    try:
        with direct.cursor() as cur:
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        with TcpProxy(*_target(mysql_url)) as proxy:
            conn = _mysql_connect(proxy.url(mysql_url), read_timeout=5)
            with conn.cursor() as cur:
                cur.execute("INSERT INTO t VALUES (1)")  # not armed yet: reply arrives
            proxy.swallow_reply_after(b"VALUES (2)")
            with pytest.raises(pymysql.err.OperationalError):
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t VALUES (2)")
            conn.close()
            assert proxy.faults_fired == 1
            # One-shot: the next connection works normally.
            conn = _mysql_connect(proxy.url(mysql_url), read_timeout=5)
            with conn.cursor() as cur:
                cur.execute("INSERT INTO t VALUES (3)")
            conn.close()
            assert proxy.faults_fired == 1
        # The statement whose reply was lost did run on the server.
        with direct.cursor() as cur:
            cur.execute("SELECT id FROM t ORDER BY id")
            assert cur.fetchall() == ((1,), (2,), (3,))
    finally:
        direct.close()


def test_proxy_close_releases_port_and_threads(mysql_url: str) -> None:
    before = {t.ident for t in threading.enumerate()}
    proxy = TcpProxy(*_target(mysql_url)).start()
    conn = _mysql_connect(proxy.url(mysql_url), read_timeout=5)
    port = proxy.port
    proxy.hang()  # pumps blocked on the hang condition must be woken by close() too
    proxy.close()
    conn.close()
    _assert_refused(port)
    assert _wait_for(lambda: {t.ident for t in threading.enumerate()} <= before)


# --------------------------------------------------------------------------------------------
# Throwaway databases
# --------------------------------------------------------------------------------------------


def _database_exists(admin_url: str, name: str) -> bool:
    engine = create_engine(admin_url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                sql = "SELECT count(*) FROM pg_database WHERE datname = :n"
            else:
                sql = "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :n"
            return bool(conn.execute(text(sql), {"n": name}).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def dropped_at_teardown(
    backend_admin_url: Callable[[str], str],
) -> Iterator[list[tuple[str, str]]]:
    """Collect (backend, database); after the test, assert they no longer exist.

    Requested before ``make_database`` in the test signature, so it is set up before and
    torn down after it: its check runs once ``make_database`` has dropped everything.
    """
    names: list[tuple[str, str]] = []
    yield names
    for backend_name, name in names:
        assert not _database_exists(backend_admin_url(backend_name), name), name


def test_make_database_gives_distinct_real_databases(
    dropped_at_teardown: list[tuple[str, str]],
    backend: str,
    make_database: Callable[[str], str],
    backend_admin_url: Callable[[str], str],
) -> None:
    first, second = make_database(backend), make_database(backend)
    assert first != second
    names = [make_url(u).database or "" for u in (first, second)]
    for name in names:
        assert os.path.basename(name).startswith("tickets_t_")
    if backend != "sqlite":
        for name in names:
            assert _database_exists(backend_admin_url(backend), name)
            dropped_at_teardown.append((backend, name))

    engine_a, engine_b = create_engine(first), create_engine(second)
    try:
        with engine_a.begin() as conn:
            conn.execute(text("CREATE TABLE marker (v INTEGER)"))
            conn.execute(text("INSERT INTO marker VALUES (1)"))
        with engine_b.begin() as conn:
            conn.execute(text("CREATE TABLE marker (v INTEGER)"))  # would clash if shared
            assert conn.execute(text("SELECT count(*) FROM marker")).scalar_one() == 0
        with engine_a.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM marker")).scalar_one() == 1
    finally:
        engine_a.dispose()
        engine_b.dispose()


def test_database_url_fixture_runs_per_backend(backend: str, database_url: str) -> None:
    expected = {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mysql"}[backend]
    engine = create_engine(database_url)
    try:
        assert engine.dialect.name == expected
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_make_database_drop_survives_open_mysql_transaction(
    dropped_at_teardown: list[tuple[str, str]], make_database: Callable[[str], str]
) -> None:
    """A test that leaves a transaction holding a metadata lock must not wedge teardown."""
    url = make_database("mysql")
    dropped_at_teardown.append(("mysql", make_url(url).database or ""))
    conn = _mysql_connect(url, read_timeout=30)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT) ENGINE=InnoDB")
        cur.execute("BEGIN")
        cur.execute("SELECT * FROM t")  # holds an MDL lock on t until commit
    # deliberately left open: the fixture has to kill it to drop the database


# --------------------------------------------------------------------------------------------
# Private servers
# --------------------------------------------------------------------------------------------


def test_private_mariadb_uses_extra_args(
    private_mariadb_factory: Callable[..., ServerProcess],
) -> None:
    server = private_mariadb_factory(
        extra_args=["--auto-increment-increment=2", "--auto-increment-offset=2"]
    )
    assert server.is_running()
    assert server.url == f"mysql+pymysql://root@127.0.0.1:{server.port}/"
    conn = _mysql_connect(server.url, read_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@auto_increment_increment, @@auto_increment_offset, @@port")
            assert cur.fetchone() == (2, 2, server.port)
            cur.execute("CREATE DATABASE d")
            cur.execute("CREATE TABLE d.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
            cur.execute("INSERT INTO d.t (v) VALUES (1), (2), (3)")
            cur.execute("SELECT id FROM d.t ORDER BY id")
            assert cur.fetchall() == ((2,), (4,), (6,))
    finally:
        conn.close()


def test_private_mariadb_kill_makes_it_unreachable_and_restart_keeps_data(
    private_mariadb_factory: Callable[..., ServerProcess],
) -> None:
    server = private_mariadb_factory()
    conn = _mysql_connect(server.url, read_timeout=5)
    with conn.cursor() as cur:
        cur.execute("CREATE DATABASE d")
        cur.execute("CREATE TABLE d.t (id INT AUTO_INCREMENT PRIMARY KEY)")
        cur.execute("INSERT INTO d.t VALUES (), ()")  # autocommit: committed before kill

    server.kill()
    assert not server.is_running()
    with pytest.raises(pymysql.err.OperationalError):
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
    conn.close()
    _assert_refused(server.port)

    server.restart()
    conn = _mysql_connect(server.url, read_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO d.t VALUES ()")
            cur.execute("SELECT id FROM d.t ORDER BY id")
            # Committed rows survived SIGKILL; the counter did not go backwards.
            assert cur.fetchall() == ((1,), (2,), (3,))
    finally:
        conn.close()


@pytest.fixture
def private_postgresql() -> Iterator[ServerProcess]:
    workdir = Path(tempfile.mkdtemp(prefix="tickets-pg-test-"))
    workdir.chmod(0o755)  # reachable by the postgres OS user
    try:
        server = start_private_postgresql(workdir)
    except Exception:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def test_private_postgresql_kill_takes_down_backends(private_postgresql: ServerProcess) -> None:
    server = private_postgresql
    assert server.url == f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"
    conn = _pg_connect(server.url)
    backend_pid = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert backend_pid is not None
    conn.execute("CREATE TABLE t (id int)")
    conn.execute("INSERT INTO t VALUES (1)")

    server.kill()
    assert not server.is_running()
    # The backend serving the open connection died with the postmaster (process group).
    assert _wait_for(lambda: not _pid_alive(backend_pid[0]))
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()
    _assert_refused(server.port)

    server.restart()
    with _pg_connect(server.url) as conn2:
        assert conn2.execute("SELECT id FROM t").fetchall() == [(1,)]


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process.

    Killed backends are reparented to PID 1 and may stay zombies until it reaps them, which
    in a container can take seconds; a zombie no longer runs or holds sockets.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: fall back to a signal probe (counts zombies as alive)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------------------------
# Unavailable backends: skip on a developer machine, fail under CI
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected", "exit_code"),
    [
        ({}, "1 skipped", 0),
        ({"TICKETS_TEST_REQUIRE_ALL": "1"}, "1 error", 1),
        ({"CI": "true"}, "1 error", 1),
    ],
    ids=["developer-skips", "require-all-fails", "ci-fails"],
)
def test_unavailable_backend_skips_or_fails(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    expected: str,
    exit_code: int,
) -> None:
    """Run a tiny suite whose MySQL server is down and whose private fallback cannot start.

    Under CI the fixture's ``pytest.fail`` surfaces as a setup *error*: not green either way.
    """
    shutil.copy(TESTS_DIR / "conftest.py", tmp_path / "conftest.py")
    shutil.copytree(TESTS_DIR / "support", tmp_path / "support")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_it.py").write_text(
        textwrap.dedent(
            """
            def test_needs_mysql(mysql_url):
                assert False, "must not run without a server"
            """
        )
    )
    closed_port = free_port()  # nothing listens there
    for name in ("CI", "TICKETS_TEST_REQUIRE_ALL", "TICKETS_TEST_MYSQL_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TICKETS_MARIADBD", str(tmp_path / "no-such-mariadbd"))
    monkeypatch.setenv("TICKETS_MARIADB_INSTALL_DB", str(tmp_path / "no-such-install-db"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            f"--mysql-url=mysql+pymysql://root@127.0.0.1:{closed_port}/",
            "test_it.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == exit_code, output
    assert expected in output, output
    assert "mysql backend unavailable" in output, output
    assert "must not run" not in output, output
