"""Backend resolution and throwaway databases for the whole test suite.

Every backend test runs against a real server. Where that server is comes from, in order:
the ``--postgresql-url`` / ``--mysql-url`` option, the ``TICKETS_TEST_POSTGRESQL_URL`` /
``TICKETS_TEST_MYSQL_URL`` environment variable, or the local default. If it does not answer
within a few seconds, a private server is started from the installed binaries
(``tests/support/servers.py``) so a developer without running services still gets a full run.

If even that fails, the outcome depends on who is asking: on a developer machine the tests
are skipped with the reason, but with ``TICKETS_TEST_REQUIRE_ALL=1`` or ``CI=true`` they
*fail* -- a CI run that silently skipped a backend would be a green light nobody earned.

Servers are resolved lazily, on first use, so a run that only touches SQLite never probes
or starts a server. Each test gets fresh databases named ``tickets_t_<8 hex>`` that are
dropped afterwards, so tests never see each other's tables or ticket counters.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

# The support package lives next to this file. pytest's default "prepend" import mode puts
# this directory on sys.path already; this keeps ``--import-mode=importlib`` working too.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.availability import unavailable  # noqa: E402
from support.galera import (  # noqa: E402
    GaleraCluster,
    galera_unavailable_reason,
    start_galera_cluster,
)
from support.servers import (  # noqa: E402
    ServerProcess,
    start_private_mariadb,
    start_private_postgresql,
)
from support.zookeeper import (  # noqa: E402
    Ensemble,
    start_ensemble,
    zookeeper_unavailable_reason,
)

BACKENDS: tuple[str, ...] = ("sqlite", "postgresql", "mysql")
SERVER_BACKENDS: tuple[str, ...] = ("postgresql", "mysql")

DEFAULT_URLS: dict[str, str] = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/",
}
URL_ENV_VARS: dict[str, str] = {
    "postgresql": "TICKETS_TEST_POSTGRESQL_URL",
    "mysql": "TICKETS_TEST_MYSQL_URL",
}
URL_OPTIONS: dict[str, str] = {"postgresql": "--postgresql-url", "mysql": "--mysql-url"}

DATABASE_PREFIX = "tickets_t_"
#: Seconds a configured server gets to answer before we fall back to a private one.
PROBE_TIMEOUT = 3
#: Seconds a private server gets to initialise and start.
PRIVATE_SERVER_TIMEOUT = 60.0

_NOTES_KEY = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the backend URL options."""
    group = parser.getgroup("tickets", "sqlalchemy-tickets database backends")
    for backend, option in URL_OPTIONS.items():
        group.addoption(
            option,
            default=None,
            metavar="URL",
            help=(
                f"SQLAlchemy URL of a {backend} server for backend tests (server-level: "
                f"databases are created on it). Default: ${URL_ENV_VARS[backend]} or "
                f"{DEFAULT_URLS[backend]}. A private server is started if it does not answer."
            ),
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The one place a test's backends are chosen: a test that uses the ``backend`` fixture (or
    ``database_url``) runs once per backend of its ``@pytest.mark.backend("postgresql", ...)``
    marker (on the test, its class or its module: the closest wins), else once per ``BACKENDS``.
    Only a ``parametrize`` that ties each backend to other arguments names it itself."""
    if "backend" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = [name.strip() for name in argnames.split(",")]
        if "backend" in argnames:
            return  # backend tied to other arguments, case by case (test_offline_scripts_run)
    where = metafunc.definition.nodeid
    marker = metafunc.definition.get_closest_marker("backend")
    names = list(BACKENDS) if marker is None else list(marker.args)
    unknown = [name for name in names if name not in BACKENDS]
    if not names or unknown:
        raise ValueError(
            f"{where}: @pytest.mark.backend takes names from {BACKENDS}, not {names!r}"
        )
    metafunc.parametrize("backend", names, ids=names)


def pytest_configure(config: pytest.Config) -> None:
    """Prepare the list of backend-resolution notes shown in the terminal summary."""
    config.stash[_NOTES_KEY] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which server each backend actually used, so a fallback is never invisible."""
    notes = terminalreporter.config.stash.get(_NOTES_KEY, [])
    if notes:
        terminalreporter.section("database backends")
        for note in notes:
            terminalreporter.write_line(note)


def _unavailable(reason: str) -> NoReturn:
    """Fail (CI / require-all) or skip (developer machine) because a backend is missing."""
    unavailable(reason, "every backend must be available, so ")


def _safe(url: str) -> str:
    """Render a URL for messages without its password."""
    return make_url(url).render_as_string(hide_password=True)


def _connect_args(url: str) -> dict[str, int]:
    """Driver-specific timeouts so a dead or hung server is detected quickly.

    PyMySQL's ``connect_timeout`` only covers the TCP connect, so reading the handshake of a
    wedged server needs ``read_timeout`` as well.
    """
    driver = make_url(url).get_driver_name()
    if driver in ("pymysql", "mysqldb", "mariadbconnector"):
        return {"connect_timeout": PROBE_TIMEOUT, "read_timeout": PROBE_TIMEOUT}
    if driver in ("psycopg", "psycopg2"):
        return {"connect_timeout": PROBE_TIMEOUT}
    if driver == "pg8000":
        return {"timeout": PROBE_TIMEOUT}
    return {}


def _admin_engine(url: str) -> Engine:
    """An autocommit engine without pooling for CREATE/DROP DATABASE and probes."""
    return create_engine(
        url,
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        connect_args=_connect_args(url),
    )


def _probe(url: str) -> str | None:
    """Return None if the server at ``url`` runs a query, else a one-line reason."""
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1")).scalar_one()
        return None
    except Exception as exc:  # any failure means "not usable"
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    finally:
        engine.dispose()


class BackendServers:
    """Session-wide, lazy resolution of one server per backend (configured or private)."""

    def __init__(self, config: pytest.Config, tmp_path_factory: pytest.TempPathFactory):
        self._config = config
        self._tmp = tmp_path_factory
        self._resolved: dict[str, str] = {}
        self._failed: dict[str, str] = {}
        self._private: list[ServerProcess] = []
        self._dirs: list[Path] = []

    def configured_url(self, backend: str) -> str:
        """URL from option, then environment, then the default."""
        option = self._config.getoption(URL_OPTIONS[backend].lstrip("-").replace("-", "_"))
        if option:
            return str(option)
        return os.environ.get(URL_ENV_VARS[backend]) or DEFAULT_URLS[backend]

    def admin_url(self, backend: str) -> str:
        """Server-level URL for ``backend``; skips or fails the calling test if unavailable."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
        if backend == "sqlite":
            return "sqlite://"
        if backend in self._resolved:
            return self._resolved[backend]
        if backend not in self._failed:
            self._resolve(backend)
        if backend in self._failed:
            _unavailable(self._failed[backend])
        return self._resolved[backend]

    def _resolve(self, backend: str) -> None:
        notes = self._config.stash[_NOTES_KEY]
        url = self.configured_url(backend)
        problem = _probe(url)
        if problem is None:
            self._resolved[backend] = url
            notes.append(f"{backend}: {_safe(url)}")
            return
        try:
            server = self._start_private(backend)
        except Exception as exc:
            self._failed[backend] = (
                f"{backend} backend unavailable: {_safe(url)} did not answer ({problem}), and "
                f"starting a private {backend} server failed: {exc}. Point "
                f"{URL_OPTIONS[backend]} or ${URL_ENV_VARS[backend]} at a running server."
            )
            notes.append(f"{backend}: UNAVAILABLE ({_safe(url)}: {problem})")
            return
        self._resolved[backend] = server.url
        notes.append(
            f"{backend}: private server {server.url} in {server.workdir} "
            f"({_safe(url)} did not answer: {problem})"
        )

    def _start_private(self, backend: str) -> ServerProcess:
        if backend == "mysql":
            server = start_private_mariadb(
                self._tmp.mktemp("private-mysql"), timeout=PRIVATE_SERVER_TIMEOUT
            )
        else:
            server = start_private_postgresql(
                self.postgres_workdir(), timeout=PRIVATE_SERVER_TIMEOUT
            )
        self._private.append(server)
        return server

    def start_mariadb(
        self, extra_args: Sequence[str] = (), port: int | None = None
    ) -> ServerProcess:
        """Start an extra private MariaDB owned by this session."""
        server = start_private_mariadb(
            self._tmp.mktemp("private-mariadb"),
            extra_args=extra_args,
            port=port,
            timeout=PRIVATE_SERVER_TIMEOUT,
        )
        self._private.append(server)
        return server

    def postgres_workdir(self) -> Path:
        """A work directory the ``postgres`` OS user can reach.

        pytest's basetemp is root-only (0700) when running as root, and PostgreSQL refuses to
        run as root, so PostgreSQL directories come from ``tempfile`` and are removed at the
        end of the session.
        """
        path = Path(tempfile.mkdtemp(prefix="tickets-pg-"))
        path.chmod(0o755)
        self._dirs.append(path)
        return path

    def close(self) -> None:
        """Stop every private server and remove directories pytest does not manage."""
        errors: list[str] = []
        for server in reversed(self._private):
            try:
                server.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{server!r}: {exc!r}")
        self._private.clear()
        for path in self._dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._dirs.clear()
        if errors:
            raise RuntimeError("stopping private servers failed: " + "; ".join(errors))


@pytest.fixture(scope="session")
def backend_servers(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackendServers]:
    """The session's backend resolver; private servers stop when the session ends."""
    servers = BackendServers(pytestconfig, tmp_path_factory)
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def backend_admin_url(backend_servers: BackendServers) -> Callable[[str], str]:
    """``backend_admin_url(backend_name) -> str``: server-level URL of a backend.

    Resolved on first call (probe, else private server); skips or fails the calling test when
    the backend is unavailable. ``"sqlite"`` gives ``"sqlite://"``.
    """
    return backend_servers.admin_url


def _quote(engine: Engine, name: str) -> str:
    return engine.dialect.identifier_preparer.quote_identifier(name)


def _create_database(admin_url: str, name: str) -> None:
    engine = _admin_engine(admin_url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "mysql":
                # Explicit charset: a server defaulting to latin1 must not change test results.
                conn.exec_driver_sql(
                    f"CREATE DATABASE {_quote(engine, name)} CHARACTER SET utf8mb4"
                )
            else:
                conn.exec_driver_sql(f"CREATE DATABASE {_quote(engine, name)}")
    finally:
        engine.dispose()


def _drop_database(admin_url: str, name: str) -> None:
    """Drop ``name`` even if a test left connections open to it."""
    engine = _admin_engine(admin_url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quote(engine, name)} WITH (FORCE)")
            else:
                # A leftover connection holding a metadata lock would block DROP DATABASE for
                # lock_wait_timeout (a year by default): kill such sessions and bound the wait.
                conn.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
                ids = conn.execute(
                    text(
                        "SELECT id FROM information_schema.processlist "
                        "WHERE db = :db AND id <> CONNECTION_ID()"
                    ),
                    {"db": name},
                ).scalars()
                for session_id in list(ids):
                    try:
                        conn.exec_driver_sql(f"KILL {int(session_id)}")
                    except Exception:  # noqa: BLE001 - it may have ended meanwhile
                        pass
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quote(engine, name)}")
    finally:
        engine.dispose()


@pytest.fixture
def make_database(
    backend_admin_url: Callable[[str], str], tmp_path: Path
) -> Iterator[Callable[[str], str]]:
    """``make_database(backend) -> url``: a fresh, empty database, dropped after the test.

    Each call creates another database (tests of several ticket servers call it several
    times). SQLite databases are files in ``tmp_path``, left for pytest's tmp retention.
    """
    created: list[tuple[str, str]] = []

    def make(backend: str) -> str:
        name = f"{DATABASE_PREFIX}{secrets.token_hex(4)}"
        if backend == "sqlite":
            return URL.create("sqlite", database=str(tmp_path / f"{name}.db")).render_as_string()
        admin_url = backend_admin_url(backend)
        _create_database(admin_url, name)
        created.append((admin_url, name))
        return make_url(admin_url).set(database=name).render_as_string(hide_password=False)

    yield make

    errors: list[str] = []
    for admin_url, name in reversed(created):
        try:
            _drop_database(admin_url, name)
        except Exception as exc:  # drop the rest, then report
            errors.append(f"{name} on {_safe(admin_url)}: {exc!r}")
    if errors:
        raise RuntimeError("could not drop test databases: " + "; ".join(errors))


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Backend name; tests using it (or ``database_url``) run once per backend of their
    ``@pytest.mark.backend`` marker, else of ``BACKENDS`` (see ``pytest_generate_tests``)."""
    name: str = request.param
    return name


@pytest.fixture
def database_url(backend: str, make_database: Callable[[str], str]) -> str:
    """URL of a fresh database on the current ``backend``."""
    return make_database(backend)


@pytest.fixture
def postgresql_url(make_database: Callable[[str], str]) -> str:
    """URL of a fresh PostgreSQL database, for PostgreSQL-only tests."""
    return make_database("postgresql")


@pytest.fixture
def mysql_url(make_database: Callable[[str], str]) -> str:
    """URL of a fresh MySQL/MariaDB database, for MySQL-only tests."""
    return make_database("mysql")


@pytest.fixture(scope="session")
def private_mariadb_factory(
    backend_servers: BackendServers,
) -> Callable[..., ServerProcess]:
    """``factory(extra_args=[...], port=None) -> ServerProcess``: an extra private MariaDB.

    For tests needing several servers (ticket-server pairs with different auto-increment
    offsets) or one they may kill. All are stopped at the end of the session. Skips or fails
    like an unavailable backend if the server cannot be started.
    """

    def factory(extra_args: Sequence[str] = (), port: int | None = None) -> ServerProcess:
        try:
            return backend_servers.start_mariadb(extra_args=extra_args, port=port)
        except Exception as exc:
            _unavailable(f"cannot start a private MariaDB server: {exc}")

    return factory


@pytest.fixture(scope="session")
def galera_cluster() -> Iterator[GaleraCluster]:
    """A 3-node MariaDB Galera cluster shared by the session, started from the installed
    binaries on first use (tests that kill a node rejoin it before they return). Missing
    Galera packages skip, or fail under ``TICKETS_TEST_REQUIRE_ALL=1`` / ``CI``."""
    reason = galera_unavailable_reason()
    if reason is not None:
        _unavailable(f"Galera unavailable: {reason}")
    # Not tmp_path: the state transfer's rsync daemon runs as nobody, which cannot enter
    # pytest's 0700 base directory when the suite runs as root.
    workdir = Path(tempfile.mkdtemp(prefix="tickets-galera-"))
    try:
        try:
            cluster = start_galera_cluster(workdir)
        except Exception as exc:
            _unavailable(f"cannot start a Galera cluster: {exc}")
        with cluster:
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def zookeeper_ensemble() -> Iterator[Ensemble]:
    """A 3-server ZooKeeper ensemble on loopback shared by the session, started from Debian's
    package on first use (tests that fault a member make it whole again: see ``zookeeper``).
    Missing ZooKeeper skips, or fails under ``TICKETS_TEST_REQUIRE_ALL=1`` / ``CI``."""
    reason = zookeeper_unavailable_reason()
    if reason is not None:
        _unavailable(f"ZooKeeper unavailable: {reason}")
    workdir = Path(tempfile.mkdtemp(prefix="tickets-zk-"))
    try:
        try:
            ensemble = start_ensemble(workdir)
        except Exception as exc:
            _unavailable(f"cannot start a ZooKeeper ensemble: {exc}")
        try:
            yield ensemble
        finally:
            ensemble.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def zookeeper(zookeeper_ensemble: Ensemble, request: pytest.FixtureRequest) -> Iterator[Ensemble]:
    """The session's ensemble, every member serving, before and after the test."""
    zookeeper_ensemble.healthy()
    yield zookeeper_ensemble
    zookeeper_ensemble.healthy()


@pytest.fixture
def zk_path(request: pytest.FixtureRequest) -> str:
    """A ZooKeeper path of the test's own."""
    return f"/t-{uuid.uuid4().hex[:12]}"
