"""Real "rewind" faults: a database that goes back in time under its clients' feet.

A ticket server's counters must only ever move forward, yet real operations can move a
database backwards: an operator restores last night's dump over the live database, or a
failover promotes an *asynchronous* replica that never received the primary's last writes.
The helpers here make both happen for real, with the installed server binaries, so tests can
check what the library does when the numbers it already handed out come round again.

* :func:`dump` / :func:`restore` -- a dump of one database restored *in place*, while other
  clients stay connected: ``pg_dump -Fc`` + ``pg_restore --clean --if-exists`` (tables are
  dropped and recreated, so they get new OIDs) and ``mariadb-dump --single-transaction`` +
  ``mariadb db < dump`` (``DROP TABLE IF EXISTS``, ``CREATE TABLE``, ``INSERT``).
* :func:`start_postgresql_pair` -- a private primary plus an asynchronous streaming replica
  made with ``pg_basebackup -R``; :class:`PgPair` cuts replication, crashes the primary and
  promotes the replica (new timeline, same ``system_identifier``).
* :func:`start_mariadb_pair` -- the same with MariaDB GTID replication (:class:`MariaDbPair`).
* :class:`FollowingProxy` -- a :class:`~support.proxy.TcpProxy` that can be re-pointed at the
  promoted replica, cutting the connections it had to the old primary, the way a virtual IP
  or a service-discovery update moves clients after a failover.

Private servers come from :mod:`support.servers` (same binaries, same ``atexit`` safety net).
Blocking waits poll with a deadline and raise :class:`TimeoutError` with what was last seen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy.engine import make_url

from .proxy import TcpProxy
from .servers import (
    ServerProcess,
    _Credentials,
    _find_binary,
    _postgresql_bindir,
    start_private_mariadb,
    start_private_postgresql,
)

__all__ = [
    "FollowingProxy",
    "MariaDbPair",
    "PgPair",
    "checkpoint_timeline",
    "dump",
    "mariadb_connect",
    "pg_connect",
    "postgresql_pair",
    "restore",
    "start_mariadb_pair",
    "start_postgresql_pair",
    "system_identifier",
    "timeline",
]

#: Seconds a dump or restore tool may run.
TOOL_TIMEOUT = 120.0
#: Seconds a restore waits for a table lock held by another client before failing (instead
#: of hanging: MariaDB's default ``lock_wait_timeout`` is a year).
LOCK_TIMEOUT = 30
#: Default deadline of the replication waits.
WAIT_TIMEOUT = 30.0
_POLL = 0.02
_CONNECT_TIMEOUT = 5


# --------------------------------------------------------------------------------------------
# Connections and tools
# --------------------------------------------------------------------------------------------


def _kind(url: str) -> str:
    """``"postgresql"`` or ``"mysql"`` (MariaDB) for a SQLAlchemy URL, else ValueError."""
    backend = make_url(url).get_backend_name()
    if backend in ("postgresql", "mysql", "mariadb"):
        return "postgresql" if backend == "postgresql" else "mysql"
    raise ValueError(f"rewind helpers support PostgreSQL and MariaDB URLs, not {backend!r}")


def pg_connect(url: str, **kwargs: Any) -> Any:
    """An autocommit psycopg connection to a SQLAlchemy PostgreSQL URL (raw driver)."""
    import psycopg

    u = make_url(url)
    kwargs.setdefault("connect_timeout", _CONNECT_TIMEOUT)
    return psycopg.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password,
        dbname=u.database or "postgres",
        autocommit=True,
        **kwargs,
    )


def mariadb_connect(url: str, **kwargs: Any) -> Any:
    """An autocommit PyMySQL connection to a SQLAlchemy MySQL/MariaDB URL (raw driver)."""
    import pymysql

    u = make_url(url)
    kwargs.setdefault("connect_timeout", _CONNECT_TIMEOUT)
    return pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=u.database or None,
        autocommit=True,
        **kwargs,
    )


def _pg_scalar(url: str, sql: str, params: Sequence[Any] = ()) -> Any:
    with pg_connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _my_query(url: str, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    import pymysql.cursors

    conn = mariadb_connect(url, cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params or None)
            return list(cur.fetchall())
    finally:
        conn.close()


def _my_execute(url: str, *statements: str) -> None:
    conn = mariadb_connect(url)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def _run_tool(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    stdin: Path | bytes | None = None,
    stdout: Path | None = None,
    timeout: float = TOOL_TIMEOUT,
    run_as: tuple[int, int] | None = None,
) -> bytes:
    """Run a client tool and return its stdout (unless sent to the ``stdout`` file).

    ``stdin`` is a file to read or the bytes to feed. Raises RuntimeError carrying the tool's
    stderr if it exits non-zero or overruns ``timeout``.
    """
    creds = _Credentials(run_as)
    full_env = {**os.environ, **(env or {})}
    in_fh = stdin.open("rb") if isinstance(stdin, Path) else None
    feed = stdin if isinstance(stdin, bytes) else None
    out_fh = stdout.open("wb") if stdout is not None else None
    try:
        result = subprocess.run(  # noqa: S603 - argv built from fixed tool paths
            argv,
            stdin=in_fh if in_fh is not None or feed is not None else subprocess.DEVNULL,
            input=feed,
            stdout=out_fh if out_fh is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            timeout=timeout,
            check=False,
            user=creds.user,
            group=creds.group,
            extra_groups=creds.extra_groups,
        )
    except subprocess.TimeoutExpired as exc:
        err = (exc.stderr or b"").decode("utf-8", "replace")
        raise RuntimeError(f"{Path(argv[0]).name} timed out after {timeout:.0f}s:\n{err}") from exc
    finally:
        for fh in (in_fh, out_fh):
            if fh is not None:
                fh.close()
    if result.returncode != 0:
        err = result.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"{Path(argv[0]).name} failed (exit {result.returncode}):\n{err}")
    return result.stdout or b""


def _pg_args(url: str) -> tuple[list[str], dict[str, str]]:
    """Connection options and environment for libpq tools, from a SQLAlchemy URL."""
    u = make_url(url)
    if not u.database:
        raise ValueError(f"{u.render_as_string()} names no database")
    args = [
        f"--host={u.host or '127.0.0.1'}",
        f"--port={u.port or 5432}",
        f"--username={u.username or 'postgres'}",
        "--no-password",
    ]
    env = {"PGCONNECT_TIMEOUT": str(_CONNECT_TIMEOUT)}
    if u.password:
        env["PGPASSWORD"] = str(u.password)
    return args, env


def _mariadb_args(url: str) -> tuple[list[str], dict[str, str], str]:
    """Connection options, environment and database name for the MariaDB client tools."""
    u = make_url(url)
    if not u.database:
        raise ValueError(f"{u.render_as_string()} names no database")
    args = [
        f"--host={u.host or '127.0.0.1'}",
        f"--port={u.port or 3306}",
        "--protocol=TCP",
        f"--user={u.username or 'root'}",
    ]
    env = {"MYSQL_PWD": str(u.password)} if u.password else {}
    return args, env, u.database


def _mariadb_tool(name: str) -> str:
    env_var = "TICKETS_MARIADB_DUMP" if name == "dump" else "TICKETS_MARIADB_CLIENT"
    candidates = (
        ["/usr/bin/mariadb-dump", "mariadb-dump", "mysqldump"]
        if name == "dump"
        else ["/usr/bin/mariadb", "mariadb", "mysql"]
    )
    return _find_binary(env_var, candidates)


# --------------------------------------------------------------------------------------------
# Dump and restore in place
# --------------------------------------------------------------------------------------------


def dump(
    url: str, path: Path | str, *, tables: Sequence[str] = (), timeout: float = TOOL_TIMEOUT
) -> Path:
    """Dump the database ``url`` names (only ``tables``, when given) to ``path`` and return
    the path.

    PostgreSQL: ``pg_dump -Fc`` (custom format, for :func:`restore`). MariaDB:
    ``mariadb-dump --single-transaction`` (plain SQL with ``DROP TABLE IF EXISTS``).
    """
    path = Path(path)
    if _kind(url) == "postgresql":
        args, env = _pg_args(url)
        database = make_url(url).database
        assert database is not None
        argv = [
            str(_postgresql_bindir() / "pg_dump"),
            *args,
            "--format=custom",
            f"--file={path}",
            *(f"--table={table}" for table in tables),
            f"--dbname={database}",
        ]
        _run_tool(argv, env=env, timeout=timeout)
    else:
        args, env, database = _mariadb_args(url)
        argv = [
            _mariadb_tool("dump"),
            "--no-defaults",
            *args,
            "--single-transaction",
            "--skip-dump-date",
            database,
            *tables,
        ]
        _run_tool(argv, env=env, stdout=path, timeout=timeout)
    return path


def restore(
    url: str,
    path: Path | str,
    *,
    lock_timeout: int = LOCK_TIMEOUT,
    timeout: float = TOOL_TIMEOUT,
) -> None:
    """Restore a :func:`dump` into the *same, live* database ``url`` names, in place.

    Other clients may stay connected. PostgreSQL: ``pg_restore --clean --if-exists`` drops
    and recreates every dumped object (new table OIDs, sequences set back), all in one
    transaction, so a failed restore changes nothing; sessions survive and see the old rows
    afterwards. (pg_restore writes the SQL and ``psql --single-transaction`` runs it: the
    archive itself says ``SET lock_timeout = 0``, which only rewriting the SQL can bound.)
    MariaDB: the dump's ``DROP TABLE IF EXISTS`` / ``CREATE TABLE`` / ``INSERT`` run through
    the ``mariadb`` client (new table ids, ``AUTO_INCREMENT`` set back).

    Dropping a table needs its exclusive lock, so a client *inside* a transaction that touched
    a restored table (for PyMySQL, any connection without autocommit that has read it and not
    committed) blocks the restore; after ``lock_timeout`` seconds it fails instead of hanging.
    Errors raise :class:`RuntimeError` with the tool's stderr.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    if _kind(url) == "postgresql":
        args, env = _pg_args(url)
        database = make_url(url).database
        assert database is not None
        bindir = _postgresql_bindir()
        deadline = time.monotonic() + timeout
        script = _run_tool(
            [str(bindir / "pg_restore"), "--clean", "--if-exists", "--file=-", str(path)],
            timeout=timeout,
        )
        # The archive's header says "SET lock_timeout = 0" (so PGOPTIONS cannot bound the
        # wait): pg_restore turns it into SQL and psql runs that with the bound put in.
        header = b"\nSET lock_timeout = 0;\n"
        bounded = f"\nSET lock_timeout = {int(lock_timeout) * 1000};\n".encode()
        if header in script:
            script = script.replace(header, bounded, 1)
        else:
            script = bounded.lstrip() + script
        argv = [
            str(bindir / "psql"),
            *args,
            "--no-psqlrc",
            "--quiet",
            "--single-transaction",
            "--set=ON_ERROR_STOP=1",
            f"--dbname={database}",
        ]
        _run_tool(argv, env=env, stdin=script, timeout=max(deadline - time.monotonic(), 1.0))
    else:
        args, env, database = _mariadb_args(url)
        argv = [
            _mariadb_tool("client"),
            "--no-defaults",
            *args,
            "--batch",
            "--binary-mode",
            f"--init-command=SET SESSION lock_wait_timeout = {int(lock_timeout)}",
            database,
        ]
        _run_tool(argv, env=env, stdin=path, timeout=timeout)


# --------------------------------------------------------------------------------------------
# PostgreSQL: primary + asynchronous streaming replica
# --------------------------------------------------------------------------------------------


def timeline(url: str) -> int:
    """The timeline the server at ``url`` is writing (or, on a standby, replaying) WAL on.

    On a primary this is the first 8 hex digits of ``pg_walfile_name(pg_current_wal_lsn())``,
    which changes the moment a promotion finishes. Both functions refuse to run during
    recovery, so on a standby it is :func:`checkpoint_timeline` instead.
    """
    with pg_connect(url) as conn:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        if row is not None and not row[0]:
            name = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            assert name is not None
            return int(str(name[0])[:8], 16)
    return checkpoint_timeline(url)


def checkpoint_timeline(url: str) -> int:
    """``timeline_id`` of the last checkpoint in the control file (``pg_control_checkpoint()``).

    After a promotion this moves to the new timeline only once a checkpoint has completed
    (:meth:`PgPair.promote` runs one unless told not to).
    """
    return int(_pg_scalar(url, "SELECT timeline_id FROM pg_control_checkpoint()"))


def system_identifier(url: str) -> int:
    """The cluster's ``system_identifier`` (``pg_control_system()``); a replica shares it."""
    return int(_pg_scalar(url, "SELECT system_identifier FROM pg_control_system()"))


def _wait(
    check: Callable[[], bool], timeout: float, what: Callable[[], str], poll: float = _POLL
) -> None:
    """Poll ``check`` until true; TimeoutError describing ``what()`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not {what()} after {timeout:.0f}s")
        time.sleep(poll)


def _url_for(server: ServerProcess, database: str) -> str:
    return make_url(server.url).set(database=database).render_as_string(hide_password=False)


class PgPair:
    """A private PostgreSQL primary and its asynchronous streaming replica.

    Both are :class:`~support.servers.ServerProcess` objects whose ``url`` names database
    ``postgres``; :meth:`database_urls` gives URLs for another database (created on the
    primary, it reaches the replica like any other write). The usual rewind script is
    :meth:`wait_caught_up`, :meth:`cut_replication`, more writes on the primary,
    :meth:`crash_primary`, :meth:`promote`: the replica then accepts writes on timeline 2 and
    has none of the writes made after the cut.
    """

    def __init__(self, primary: ServerProcess, replica: ServerProcess, workdir: Path) -> None:
        self.primary = primary
        self.replica = replica
        self.workdir = workdir

    def database_urls(self, name: str) -> tuple[str, str]:
        """``(primary_url, replica_url)`` for database ``name``."""
        return _url_for(self.primary, name), _url_for(self.replica, name)

    def wait_streaming(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until the replica's WAL receiver reports status ``streaming``."""
        seen: list[Any] = [None]

        def check() -> bool:
            seen[0] = _pg_scalar(self.replica.url, "SELECT status FROM pg_stat_wal_receiver")
            return bool(seen[0] == "streaming")

        _wait(check, timeout, lambda: f"streaming (wal receiver status {seen[0]!r})")

    def wait_caught_up(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until the replica has replayed everything the primary has written so far."""
        target = str(_pg_scalar(self.primary.url, "SELECT pg_current_wal_lsn()"))
        seen: list[Any] = [None]

        def check() -> bool:
            with pg_connect(self.replica.url) as conn:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn(), pg_last_wal_replay_lsn() >= %s::pg_lsn",
                    (target,),
                ).fetchone()
            seen[0] = row[0] if row else None
            return bool(row and row[1])

        _wait(check, timeout, lambda: f"caught up to {target} (replayed {seen[0]})")

    def cut_replication(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Stop the replica's WAL receiver: later primary writes never reach it.

        ``primary_conninfo`` is emptied with ``ALTER SYSTEM`` and the configuration reloaded
        (PostgreSQL >= 13 applies that without a restart); returns once
        ``pg_stat_wal_receiver`` is empty. The replica stays a hot standby.
        """
        with pg_connect(self.replica.url) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
        _wait(
            lambda: not _pg_scalar(self.replica.url, "SELECT count(*) FROM pg_stat_wal_receiver"),
            timeout,
            lambda: "disconnected (a WAL receiver is still running)",
        )

    def multi_host_url(self, database: str) -> str:
        """A libpq multi-host URL of ``database`` that connects to whichever server takes
        writes: what an application on the pair uses to follow a failover."""
        return (f"postgresql+psycopg://postgres@/{database}?host=127.0.0.1:{self.primary.port}"
                f"&host=127.0.0.1:{self.replica.port}&target_session_attrs=read-write")

    def set_standbys(self, spec: str, *, wait_sync: bool = True,
                     timeout: float = WAIT_TIMEOUT) -> None:
        """``synchronous_standby_names = spec`` on the primary (``{}`` in it: the replica's
        quoted name, as ``pg_stat_replication`` shows it), reloaded; with ``wait_sync``,
        returns once the replica is a synchronous (or quorum) standby."""
        from psycopg import sql

        value = ""
        if spec:
            name = _pg_scalar(self.primary.url, "SELECT application_name FROM pg_stat_replication")
            assert name is not None, "the replica is not streaming"
            value = spec.format(f'"{name}"')
        with pg_connect(self.primary.url) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                sql.Literal(value)))
            conn.execute("SELECT pg_reload_conf()")

        def applied() -> bool:
            with pg_connect(self.primary.url) as conn:
                # Each backend applies a reload at its next statement: a new one shows it.
                shown = conn.execute("SHOW synchronous_standby_names").fetchone()
                synced = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication "
                    "WHERE sync_state IN ('sync', 'quorum')").fetchone()
            return bool(shown == (value,) and (not wait_sync or synced == (1,)))

        _wait(applied, timeout, lambda: f"synchronous_standby_names = {value!r} in force")

    def crash_primary(self) -> float:
        """SIGKILL the primary's whole process group (postmaster and backends); when, on the
        monotonic clock."""
        self.primary.kill()
        return time.monotonic()

    def promote(self, timeout: float = WAIT_TIMEOUT, *, checkpoint: bool = True) -> None:
        """Promote the replica (``pg_promote(wait => true)``); it then accepts writes.

        With ``checkpoint`` (the default) a ``CHECKPOINT`` follows, as failover tools do, so
        that the control file -- :func:`checkpoint_timeline` -- shows the new timeline too.
        """
        with pg_connect(self.replica.url) as conn:
            row = conn.execute(
                "SELECT pg_promote(wait => true, wait_seconds => %s)", (max(int(timeout), 1),)
            ).fetchone()
            if not (row and row[0]):
                raise TimeoutError(f"replica on port {self.replica.port} did not promote")
            if checkpoint:
                conn.execute("CHECKPOINT")

    def stop(self) -> None:
        """Stop both servers (replica first); data directories stay in ``workdir``."""
        self.replica.stop()
        self.primary.stop()

    def __enter__(self) -> PgPair:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<PgPair primary={self.primary!r} replica={self.replica!r}>"


def _ensure_replication_source(primary: ServerProcess, timeout: float) -> None:
    """Make ``primary`` accept streaming replicas from 127.0.0.1 as ``postgres`` (trust).

    initdb's defaults already do (``wal_level=replica``, ``max_wal_senders=10``, ``host
    replication all 127.0.0.1/32 trust`` with ``--auth=trust``); this only repairs a cluster
    that differs, so an unusual packaging fails loudly here rather than in pg_basebackup.
    """
    datadir = primary.workdir / "data"
    hba = datadir / "pg_hba.conf"
    lines = hba.read_text().splitlines()
    allowed = any(
        fields[:2] == ["host", "replication"] and fields[3:4] == ["127.0.0.1/32"]
        for fields in (line.split() for line in lines)
        if len(fields) >= 5
    )
    with pg_connect(primary.url) as conn:
        if not allowed:
            with hba.open("a") as fh:
                fh.write("host    replication     all     127.0.0.1/32    trust\n")
            conn.execute("SELECT pg_reload_conf()")
        wal_level = conn.execute("SHOW wal_level").fetchone()
        senders = conn.execute("SHOW max_wal_senders").fetchone()
        needs_restart = (wal_level and wal_level[0] == "minimal") or (
            senders and int(senders[0]) < 2
        )
        if needs_restart:
            conn.execute("ALTER SYSTEM SET wal_level = 'replica'")
            conn.execute("ALTER SYSTEM SET max_wal_senders = 10")
    if needs_restart:
        primary.stop()
        primary.restart(timeout)


@contextlib.contextmanager
def postgresql_pair(database: str = "tickets") -> Iterator[PgPair]:
    """A primary and its streaming replica in a temporary directory (removed afterwards),
    streaming, with ``database`` made on the primary: an asynchronous pair until
    :meth:`PgPair.set_standbys` says otherwise."""
    with tempfile.TemporaryDirectory(prefix="tickets-pair-") as workdir:
        shutil.chown(workdir, "postgres", "postgres")  # reachable by the servers' OS user
        with start_postgresql_pair(workdir) as pair:
            pair.wait_streaming()
            with pg_connect(pair.primary.url) as conn:
                conn.execute(f'CREATE DATABASE "{database}"')
            yield pair


def start_postgresql_pair(workdir: Path | str, *, timeout: float = 60.0) -> PgPair:
    """Start a private primary in ``workdir/primary`` and a streaming replica of it.

    The replica is a ``pg_basebackup -R -X stream`` copy in ``workdir/replica`` (run as the
    server's OS user when root, like the servers themselves), started on its own port.
    Returns once the replica is streaming and has replayed everything. ``workdir`` must be
    reachable by the ``postgres`` OS user when running as root (see
    :func:`support.servers.start_private_postgresql`), e.g. from ``tempfile.mkdtemp()``.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    primary = start_private_postgresql(workdir / "primary", timeout=timeout)
    replica: ServerProcess | None = None
    try:
        _ensure_replication_source(primary, max(deadline - time.monotonic(), 1.0))
        run_as: tuple[int, int] | None = None
        if os.geteuid() == 0:  # the same OS user the private primary runs as
            st = (primary.workdir / "data").stat()
            run_as = (st.st_uid, st.st_gid)
        replica_dir = workdir / "replica"
        shutil.rmtree(replica_dir, ignore_errors=True)
        replica_dir.mkdir()
        if run_as is not None:
            os.chown(replica_dir, *run_as)
        _run_tool(
            [
                str(_postgresql_bindir() / "pg_basebackup"),
                f"--pgdata={replica_dir / 'data'}",
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
                "--host=127.0.0.1",
                f"--port={primary.port}",
                "--username=postgres",
                "--no-password",
            ],
            timeout=max(deadline - time.monotonic(), 1.0),
            run_as=run_as,
        )
        replica = start_private_postgresql(
            replica_dir, timeout=max(deadline - time.monotonic(), 1.0)
        )
        pair = PgPair(primary, replica, workdir)
        pair.wait_streaming(max(deadline - time.monotonic(), 1.0))
        pair.wait_caught_up(max(deadline - time.monotonic(), 1.0))
        return pair
    except BaseException:
        if replica is not None:
            replica.kill()
        primary.kill()
        raise


# --------------------------------------------------------------------------------------------
# MariaDB: primary + asynchronous GTID replica
# --------------------------------------------------------------------------------------------

#: mariadbd options of the pair; they come after support.servers' defaults (which include
#: ``--skip-log-bin``) and so override them.
PRIMARY_ARGS: tuple[str, ...] = (
    "--server-id=1",
    "--log-bin=mariadb-bin",
    "--binlog-format=ROW",
)
REPLICA_ARGS: tuple[str, ...] = (
    "--server-id=2",
    "--log-bin=mariadb-bin",
    "--log-slave-updates",
    "--binlog-format=ROW",
    "--relay-log=relay-bin",
    "--read-only",  # root (READ ONLY ADMIN) may still write; promote() clears it anyway
)


class MariaDbPair:
    """A private MariaDB primary and its asynchronous GTID replica (``slave_pos``).

    Same shape as :class:`PgPair`; the servers' ``url`` names no database.
    """

    def __init__(self, primary: ServerProcess, replica: ServerProcess) -> None:
        self.primary = primary
        self.replica = replica

    def database_urls(self, name: str) -> tuple[str, str]:
        """``(primary_url, replica_url)`` for database ``name``."""
        return _url_for(self.primary, name), _url_for(self.replica, name)

    def slave_status(self) -> dict[str, Any]:
        """The replica's ``SHOW SLAVE STATUS`` row (empty once :meth:`promote` reset it)."""
        rows = _my_query(self.replica.url, "SHOW SLAVE STATUS")
        return rows[0] if rows else {}

    def wait_replicating(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until both replication threads of the replica run."""
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen.clear()
            seen.update(self.slave_status())
            return seen.get("Slave_IO_Running") == "Yes" and seen.get("Slave_SQL_Running") == "Yes"

        _wait(
            check,
            timeout,
            lambda: (
                f"replicating (IO {seen.get('Slave_IO_Running')!r} "
                f"{seen.get('Last_IO_Error')!r}, SQL {seen.get('Slave_SQL_Running')!r} "
                f"{seen.get('Last_SQL_Error')!r})"
            ),
        )

    def wait_caught_up(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until the replica has applied the primary's current ``gtid_binlog_pos``."""
        target = str(_my_query(self.primary.url, "SELECT @@gtid_binlog_pos AS p")[0]["p"])
        rows = _my_query(
            self.replica.url,
            "SELECT MASTER_GTID_WAIT(%s, %s) AS r, @@gtid_slave_pos AS p",
            (target, max(timeout, 0.1)),
        )
        if rows[0]["r"] != 0:
            raise TimeoutError(
                f"replica not caught up to {target!r} after {timeout:.0f}s "
                f"(gtid_slave_pos {rows[0]['p']!r}, status {self.slave_status()!r})"
            )

    def cut_replication(self) -> None:
        """``STOP SLAVE``: later primary writes are neither received nor applied."""
        _my_execute(self.replica.url, "STOP SLAVE")

    def crash_primary(self) -> None:
        """SIGKILL the primary."""
        self.primary.kill()

    def promote(self) -> None:
        """``STOP SLAVE; RESET SLAVE ALL``, then ``read_only = 0``: the replica is a primary."""
        _my_execute(self.replica.url, "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")

    def stop(self) -> None:
        """Stop both servers (replica first)."""
        self.replica.stop()
        self.primary.stop()

    def __enter__(self) -> MariaDbPair:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<MariaDbPair primary={self.primary!r} replica={self.replica!r}>"


def start_mariadb_pair(
    factory_or_workdir: Callable[..., ServerProcess] | Path | str,
    *,
    timeout: float = 60.0,
) -> MariaDbPair:
    """Start a private MariaDB primary and a GTID replica replicating from it.

    ``factory_or_workdir`` is either conftest's ``private_mariadb_factory`` (the session then
    owns the servers too) or a directory to start them in (``primary/``, ``replica/``). The
    replica connects as ``root`` over 127.0.0.1 (``--skip-name-resolve`` makes that
    ``root@127.0.0.1``, which has ``REPLICATION SLAVE`` as part of ``ALL``) with
    ``MASTER_USE_GTID = slave_pos``. Returns once the replica has caught up.
    """
    if isinstance(factory_or_workdir, (str, os.PathLike)):
        base = Path(factory_or_workdir)

        def start(name: str, args: Sequence[str]) -> ServerProcess:
            return start_private_mariadb(base / name, extra_args=args, timeout=timeout)

    else:
        factory = factory_or_workdir

        def start(name: str, args: Sequence[str]) -> ServerProcess:
            return factory(extra_args=list(args))

    primary = start("primary", PRIMARY_ARGS)
    replica: ServerProcess | None = None
    try:
        replica = start("replica", REPLICA_ARGS)
        _my_execute(
            replica.url,
            f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {int(primary.port)}, "
            "MASTER_USER = 'root', MASTER_PASSWORD = '', MASTER_CONNECT_RETRY = 1, "
            "MASTER_USE_GTID = slave_pos",
            "START SLAVE",
        )
        pair = MariaDbPair(primary, replica)
        pair.wait_replicating(timeout)
        pair.wait_caught_up(timeout)
        return pair
    except BaseException:
        if replica is not None:
            replica.kill()
        primary.kill()
        raise


# --------------------------------------------------------------------------------------------
# A proxy that follows the failover
# --------------------------------------------------------------------------------------------


class FollowingProxy(TcpProxy):
    """A :class:`~support.proxy.TcpProxy` whose target can be switched (:meth:`retarget`).

    Switching cuts every proxied connection (clients see their connection closed, as when a
    virtual IP moves) and sends new connections to the new target. All fault modes of
    ``TcpProxy`` keep working.
    """

    @classmethod
    def for_url(cls, url: str) -> FollowingProxy:
        """A started proxy in front of the server ``url`` names."""
        host, port = _host_port(url)
        return cls(host, port).start()

    def start(self) -> FollowingProxy:
        """Listen on an ephemeral port and start forwarding."""
        super().start()
        return self

    def retarget(self, host: str, port: int) -> None:
        """Send new connections to ``host:port`` and close all current ones."""
        with self._lock:
            self.target_host = host
            self.target_port = port
            for conn in list(self._conns):
                self._abort_locked(conn)

    def follow(self, url: str) -> None:
        """:meth:`retarget` to the host and port of a SQLAlchemy URL (e.g. the new primary)."""
        self.retarget(*_host_port(url))


def _host_port(url: str) -> tuple[str, int]:
    u = make_url(url)
    default = 5432 if u.get_backend_name() == "postgresql" else 3306
    return u.host or "127.0.0.1", u.port or default
