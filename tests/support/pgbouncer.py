"""A private PgBouncer in front of the test PostgreSQL, started from the installed binary.

Most PostgreSQL fleets reach their database through PgBouncer in transaction pooling mode: each
transaction may run on a different server connection, so nothing may rely on session state
(server-side prepared statements included). Tests route real connections through one of these
to prove the library's own connections cope.

The binary is ``$TICKETS_PGBOUNCER``, else ``/usr/sbin/pgbouncer``, else ``pgbouncer`` on
``PATH`` (Debian: ``apt-get install pgbouncer``; ``make test`` installs it). Without it, the
``pgbouncer`` fixture skips on a developer machine and fails under ``TICKETS_TEST_REQUIRE_ALL=1``
or ``CI`` -- the same rule as the database backends (``support.availability``).

Each PgBouncer has its own ini file, auth file, log and port in a temp directory, accepts any
database name (``*``, forwarded to the same name on the target) with ``auth_type = trust``,
and keeps a small server pool so that concurrent clients really share server connections.
"""

from __future__ import annotations

import os
import pwd
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from .availability import unavailable
from .servers import (
    ServerProcess,
    ServerStartError,
    _find_binary,
    _start_with_port_retry,
)

__all__ = ["PgBouncer", "pgbouncer", "start_pgbouncer"]

#: Server connections per (database, user) pool: fewer than the test's client threads, so
#: transactions of one client land on different server connections.
POOL_SIZE = 4
_PROBE_TIMEOUT = 2


def _probe(port: int) -> None:
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="postgres",
        connect_timeout=_PROBE_TIMEOUT,
        prepare_threshold=None,
        autocommit=True,  # statement pooling refuses transaction blocks
    ) as conn:
        conn.execute("SELECT 1").fetchall()


def start_pgbouncer(
    workdir: Path,
    *,
    target_host: str,
    target_port: int,
    pool_mode: str = "transaction",
    port: int | None = None,
    timeout: float = 30,
) -> ServerProcess:
    """Start a PgBouncer in ``pool_mode`` forwarding every database to the PostgreSQL at
    ``target_host:target_port``; returns once a query passes through it."""
    if pool_mode not in ("session", "transaction", "statement"):
        raise ValueError(f"unknown PgBouncer pool_mode {pool_mode!r}")
    binary = _find_binary("TICKETS_PGBOUNCER", ["/usr/sbin/pgbouncer", "pgbouncer"])
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    run_as: tuple[int, int] | None = None
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root.
        pw = pwd.getpwnam(os.environ.get("TICKETS_PG_OS_USER", "postgres"))
        run_as = (pw.pw_uid, pw.pw_gid)
    auth_file = workdir / "users.txt"
    auth_file.write_text('"postgres" ""\n')
    log_path = workdir / "pgbouncer.log"
    log_path.touch()

    def make(listen_port: int) -> ServerProcess:
        ini = workdir / f"pgbouncer-{listen_port}.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={target_host} port={target_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {listen_port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {auth_file}\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "max_client_conn = 500\n"
            "server_lifetime = 3600\n"
            "server_idle_timeout = 60\n"
            "admin_users = postgres\n"
        )
        for path in (workdir, ini, auth_file, log_path):
            if run_as is not None:
                os.chown(path, *run_as)
        return ServerProcess(
            kind="pgbouncer",
            url=f"postgresql+psycopg://postgres@127.0.0.1:{listen_port}/postgres",
            port=listen_port,
            workdir=workdir,
            argv=[binary, str(ini)],
            log_path=log_path,
            stop_signal=signal.SIGTERM,  # immediate shutdown; SIGINT waits for clients
            probe=_probe,
            run_as=run_as,
        )

    return _start_with_port_retry(make, port, timeout)


class PgBouncer:
    """A running PgBouncer and how to route a database URL through it."""

    def __init__(self, process: ServerProcess, pool_mode: str) -> None:
        self.process = process
        self.pool_mode = pool_mode

    @property
    def port(self) -> int:
        return self.process.port

    def url(self, database_url: str) -> str:
        """``database_url`` with PgBouncer's host and port (same database, user, driver)."""
        return (
            make_url(database_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )


@pytest.fixture(scope="session")
def pgbouncer(
    backend_admin_url: Callable[[str], str],
    backend_servers: object,
) -> Iterator[Callable[[str], PgBouncer]]:
    """``pgbouncer(pool_mode="transaction") -> PgBouncer`` in front of the test PostgreSQL.

    One PgBouncer per pool mode per session, stopped when the session ends. Import this
    fixture into a test module (``from support.pgbouncer import pgbouncer``).
    """
    started: dict[str, PgBouncer] = {}

    def get(pool_mode: str = "transaction") -> PgBouncer:
        found = started.get(pool_mode)
        if found is not None:
            return found
        target = make_url(backend_admin_url("postgresql"))
        workdir: Path = backend_servers.postgres_workdir()  # type: ignore[attr-defined]
        try:
            process = start_pgbouncer(
                workdir / pool_mode,
                target_host=target.host or "127.0.0.1",
                target_port=target.port or 5432,
                pool_mode=pool_mode,
            )
        except (ServerStartError, OSError, KeyError) as error:
            unavailable(f"cannot start PgBouncer ({pool_mode} pooling): {error}",
                        "PgBouncer must be installed, e.g. `apt-get install pgbouncer`; ")
        found = started[pool_mode] = PgBouncer(process, pool_mode)
        return found

    try:
        yield get
    finally:
        deadline = time.monotonic() + 30
        for bouncer in started.values():
            bouncer.process.stop(timeout=max(1.0, deadline - time.monotonic()))
