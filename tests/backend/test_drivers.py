"""Drivers: what the library's own connections (ticket servers, the embedded default) and
``apply_timeouts`` do with each driver a user may have, checked where only that driver is
installed.

A user with asyncpg alone, or asyncmy alone, gets ids at flush (the asyncio driver is then
driven synchronously); one who also has a synchronous driver of the database, whichever, gets
it used; a driver that is not installed is a ``TicketsError`` naming what to install, and the
command line exits 1 for it. ``apply_timeouts`` bounds psycopg2 and mysqlclient, and refuses the
drivers it cannot bound when it is called. The fresh venvs come from ``support/drivers.py``;
docs/connections.md's drivers table reports what these tests check.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sqlalchemy_tickets import apply_timeouts, cli, is_retryable
from support.drivers import FreshVenvs, Run, installer
from support.proxy import TcpProxy

#: The bound the hung-server tests give, and the most a bounded call may take: far above the
#: bound (libpq's connect timeout is at least 2 s), far below pytest's timeout.
BOUND = 1.0
GUARD = 30.0


@pytest.fixture(scope="session")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> FreshVenvs:
    python = installer()
    if python is None:
        pytest.fail("no interpreter with pip and uv to build fresh venvs with (make builds .venv)")
    return FreshVenvs(tmp_path_factory.mktemp("driver-venvs"), python)


def on(url: str, drivername: str) -> str:
    return make_url(url).set(drivername=drivername).render_as_string(hide_password=False)


def outcome(run: Run) -> dict[str, Any]:
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    return run.json()


# -- the library's own connections, with one driver or another installed ------------------------

#: (packages in the venv, the application's asyncio driver, the driver the library uses)
ASYNC_ALONE = [
    pytest.param(("asyncpg",), "postgresql+asyncpg", "asyncpg", id="asyncpg-alone"),
    pytest.param(("asyncpg", "psycopg2-binary"), "postgresql+asyncpg", "psycopg2",
                 id="asyncpg-and-psycopg2"),
    pytest.param(("asyncmy",), "mysql+asyncmy", "asyncmy", id="asyncmy-alone"),
    pytest.param(("asyncmy", "mysqlclient"), "mysql+asyncmy", "mysqldb",
                 id="asyncmy-and-mysqlclient"),
    pytest.param(("asyncmy", "mariadb"), "mysql+asyncmy", "mariadbconnector",
                 id="asyncmy-and-mariadb-connector"),
]


@pytest.mark.parametrize(("packages", "drivername", "used"), ASYNC_ALONE)
def test_an_asyncio_application_gets_ids_with_the_drivers_it_has(
    venvs: FreshVenvs,
    make_database: Callable[[str], str],
    packages: tuple[str, ...],
    drivername: str,
    used: str,
) -> None:
    python = venvs.python(*packages)
    for default in ("psycopg", "pymysql"):
        assert not venvs.importable(python, default), f"{default} is in the venv"
    url = on(make_database(drivername.split("+")[0]), drivername)
    result = outcome(venvs.probe(python, "flush-async", url))
    assert result == {"ids": [1, 2, 3, 4, 5, 6], "driver": used, "block": [1, 2, 3],
                      "server": used}


#: (packages in the venv, the application's synchronous driver, the driver the library uses)
SYNC_ALONE = [
    pytest.param(("asyncpg", "psycopg2-binary"), "postgresql+psycopg2", "psycopg2",
                 id="psycopg2"),
    pytest.param(("pg8000", "psycopg2-binary"), "postgresql+pg8000", "psycopg2",
                 id="pg8000-and-psycopg2"),
    pytest.param(("asyncmy", "mysqlclient"), "mysql+mysqldb", "mysqldb", id="mysqlclient"),
    pytest.param(("asyncmy", "mariadb"), "mariadb+mariadbconnector", "mariadbconnector",
                 id="mariadb-connector"),
]


@pytest.mark.parametrize(("packages", "drivername", "used"), SYNC_ALONE)
def test_a_synchronous_application_gets_ids_with_the_drivers_it_has(
    venvs: FreshVenvs,
    make_database: Callable[[str], str],
    packages: tuple[str, ...],
    drivername: str,
    used: str,
) -> None:
    python = venvs.python(*packages)
    url = on(make_database("postgresql" if "postgresql" in drivername else "mysql"), drivername)
    result = outcome(venvs.probe(python, "flush-sync", url))
    assert result == {"ids": [1, 2, 3, 4, 5, 6], "driver": used, "block": [1, 2, 3],
                      "server": used}


def test_pg8000_alone_is_refused_at_the_first_flush_naming_the_extra(
    venvs: FreshVenvs, postgresql_url: str
) -> None:
    python = venvs.python("pg8000")
    result = outcome(venvs.probe(python, "flush-sync", on(postgresql_url, "postgresql+pg8000")))
    assert result["error"] == "DriverNotInstalledError", result
    assert "pip install 'sqlalchemy-tickets[postgresql]'" in result["message"]
    assert "pg8000" in result["message"]


#: (packages in the venv, a URL's driver that is not installed there, what the message names)
NOT_INSTALLED = [
    pytest.param(("asyncpg",), "postgresql+psycopg2", "pip install psycopg2-binary",
                 id="psycopg2"),
    pytest.param(("asyncpg",), "postgresql+psycopg", "pip install 'sqlalchemy-tickets[postgresql]'",
                 id="psycopg"),
    pytest.param(("asyncmy",), "mysql+mysqldb", "pip install mysqlclient", id="mysqlclient"),
    pytest.param(("asyncmy",), "mysql+pymysql", "pip install 'sqlalchemy-tickets[mysql]'",
                 id="pymysql"),
    # No driver of PostgreSQL at all: not even the asyncio one the URL names.
    pytest.param(("asyncmy",), "postgresql+asyncpg",
                 "pip install 'sqlalchemy-tickets[postgresql]'", id="no-postgresql-driver"),
]


@pytest.mark.parametrize(("packages", "drivername", "hint"), NOT_INSTALLED)
def test_a_driver_that_is_not_installed_names_what_to_install(
    venvs: FreshVenvs, packages: tuple[str, ...], drivername: str, hint: str
) -> None:
    python = venvs.python(*packages)
    # Refused before connecting: nothing listens on port 1.
    url = f"{drivername}://user@127.0.0.1:1/db"
    result = outcome(venvs.probe(python, "server", url))
    assert result["error"] == "DriverNotInstalledError", result
    assert hint in result["message"]
    command = venvs.run(python, "-m", "sqlalchemy_tickets", "next", "--url", url)
    assert command.returncode == 1, command
    assert command.stdout == ""
    lines = command.stderr.splitlines()
    assert len(lines) == 1 and hint in lines[0], command.stderr
    assert lines[0].startswith("sqlalchemy-tickets: error: ")


def test_the_command_line_exits_1_for_a_driver_not_installed_here(
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        import mariadb  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("MariaDB Connector/Python is installed here")
    code = cli.main(["next", "--url", "mariadb+mariadbconnector://user@127.0.0.1:1/db"])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.count("\n") == 1 and "pip install mariadb" in captured.err


# -- a hung ticket server, on each driver the library's own connections may use ---------------

#: (packages in the venv, the URL's driver, the backend)
HUNG = [
    pytest.param(("asyncpg",), "postgresql+asyncpg", id="asyncpg-driven"),
    pytest.param(("asyncmy",), "mysql+asyncmy", id="asyncmy-driven"),
    pytest.param(("asyncpg", "psycopg2-binary"), "postgresql+psycopg2", id="psycopg2"),
    pytest.param(("asyncmy", "mysqlclient"), "mysql+mysqldb", id="mysqlclient"),
    pytest.param(("asyncmy", "mariadb"), "mysql+mariadbconnector", id="mariadb-connector"),
]


def _line(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(GUARD)
    if not found or not found[0]:
        process.kill()
        _, err = process.communicate(timeout=GUARD)
        raise AssertionError(f"no answer from the probe within {GUARD} s; stderr:\n{err}")
    value = json.loads(found[0])
    assert isinstance(value, dict)
    return value


def _ask(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdin is not None
    process.stdin.write("next\n")
    process.stdin.flush()
    return _line(process)


@pytest.mark.parametrize(("packages", "drivername"), HUNG)
def test_a_hung_ticket_server_is_an_error_after_its_timeout(
    venvs: FreshVenvs,
    make_database: Callable[[str], str],
    packages: tuple[str, ...],
    drivername: str,
) -> None:
    python = venvs.python(*packages)
    direct = make_url(make_database(drivername.split("+")[0]))
    with TcpProxy(direct.host or "127.0.0.1", direct.port or 0) as proxy:
        url = on(proxy.url(direct.render_as_string(hide_password=False)), drivername)
        process = venvs.start_probe(python, "hang", url)
        try:
            first = _line(process)
            assert first["first"] == 1 and first["driver"] == drivername.split("+")[1], first
            proxy.hang()
            hung = _ask(process)  # on the connection made before the hang
            connecting = _ask(process)  # the cut one is gone: a new one, to the hung server
            proxy.forward()
            for failed in (hung, connecting):
                assert failed["error"] == "TicketServerUnavailable", failed
                assert BOUND * 0.9 <= failed["elapsed"] < GUARD / 2, failed
            again = _ask(process)  # a new connection once the server answers again
            assert again.get("id", 0) > 1, again
        finally:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(GUARD)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- apply_timeouts: psycopg2 and mysqlclient bounded, the others refused when called ----------

SYNC_TIMEOUT_DRIVERS = {
    "psycopg2": ("postgresql", "postgresql+psycopg2", "psycopg2"),
    "mysqlclient": ("mysql", "mysql+mysqldb", "MySQLdb"),
}


@pytest.fixture(params=sorted(SYNC_TIMEOUT_DRIVERS))
def proxied(
    request: pytest.FixtureRequest, make_database: Callable[[str], str]
) -> Iterator[tuple[TcpProxy, str]]:
    backend, drivername, module = SYNC_TIMEOUT_DRIVERS[request.param]
    pytest.importorskip(module)
    direct = make_url(make_database(backend))
    with TcpProxy(direct.host or "127.0.0.1", direct.port or 0) as proxy:
        url = on(proxy.url(direct.render_as_string(hide_password=False)), drivername)
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
        engine.dispose()
        yield proxy, url


def timed(proxy: TcpProxy, call: Callable[[], Any]) -> tuple[BaseException, float]:
    """Hang the proxy and time ``call()`` until it fails (in a thread: a call the bound does not
    cut short fails the test after ``GUARD`` seconds instead of hanging it)."""
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except Exception as error:  # the error the bound produced
            result.append(error)
        else:
            result.append(None)

    proxy.hang()
    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(GUARD)
    elapsed = time.monotonic() - started
    proxy.forward()
    assert result, f"the call to the hung server was still waiting after {GUARD} s"
    error = result[0]
    assert error is not None, "the call to the hung server succeeded"
    return error, elapsed


def check_bounded(error: BaseException, elapsed: float, bound: float = BOUND) -> None:
    assert isinstance(error, sa.exc.DBAPIError), repr(error)
    assert is_retryable(error), repr(error)
    assert bound * 0.9 <= elapsed < GUARD / 2, elapsed


def test_a_statement_on_a_hung_server(proxied: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied
    engine = apply_timeouts(sa.create_engine(url, pool_size=1), BOUND)
    try:
        with engine.connect() as conn:  # established before the hang
            conn.execute(sa.select(1))

        def query() -> None:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT count(*) FROM notes"))

        check_bounded(*timed(proxy, query))
        with engine.connect() as conn:  # the cut connection was replaced
            assert conn.execute(sa.select(42)).scalar_one() == 42
    finally:
        engine.dispose()


def test_a_commit_on_a_hung_server(proxied: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied
    engine = apply_timeouts(sa.create_engine(url), BOUND)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO notes (id) VALUES (1)"))
            check_bounded(*timed(proxy, conn.commit))
    finally:
        engine.dispose()


def test_a_connect_to_a_hung_server(proxied: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied
    engine = apply_timeouts(sa.create_engine(url), BOUND)

    def connect() -> None:
        with engine.connect() as conn:
            conn.execute(sa.select(1))

    try:
        check_bounded(*timed(proxy, connect))
    finally:
        engine.dispose()


#: (packages in the venv, a URL of a driver apply_timeouts cannot bound, the drivers it names)
REFUSED = [
    pytest.param(("pg8000",), "postgresql+pg8000", "psycopg, psycopg2", id="pg8000"),
    pytest.param(("asyncmy", "mariadb"), "mariadb+mariadbconnector", "pymysql, mysqldb",
                 id="mariadb-connector"),
]


@pytest.mark.parametrize(("packages", "drivername", "supported"), REFUSED)
def test_apply_timeouts_refuses_a_driver_it_cannot_bound_when_called(
    venvs: FreshVenvs, packages: tuple[str, ...], drivername: str, supported: str
) -> None:
    python = venvs.python(*packages)
    # Nothing listens on port 1: the refusal comes before any connect.
    result = outcome(venvs.probe(python, "timeouts", f"{drivername}://user@127.0.0.1:1/db"))
    assert result["error"] == "TicketsError", result
    assert drivername in result["message"] and supported in result["message"], result
