"""Private MariaDB and PostgreSQL server processes started from the installed binaries.

Some tests need a server the shared one cannot provide: a second or third MariaDB with its
own ``auto_increment_increment``/``auto_increment_offset`` (ticket-server pairs), or a server
that may be SIGKILLed mid-test. This module starts such servers in a caller-owned work
directory on a loopback port and waits until they really answer a query.

Initialised data directories are built once per process and copied (see
``_copy_from_template``). The caller owns the lifecycle (``stop()`` or ``kill()``); an
``atexit`` hook kills whatever is still running when the interpreter exits, so an aborted
test session does not leave servers behind. A server whose work directory already holds a
data directory is started on that data again (no re-initialisation), which is what lets a
test "crash" a server (``kill()``) and bring it back (``restart()``).

Durability settings are relaxed (``fsync=off`` for PostgreSQL,
``innodb_flush_log_at_trx_commit=2`` for MariaDB): committed data still reaches the OS page
cache on every commit, so it survives SIGKILL of the server processes -- the only crash these
tests simulate -- but not a crash of the machine.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "ServerProcess",
    "ServerStartError",
    "free_port",
    "start_private_mariadb",
    "start_private_postgresql",
]

#: Longest unix socket path we hand to a server; the kernel limit (sun_path) is 108 bytes.
_MAX_SOCKET_PATH = 100
#: How long one readiness probe may block; short so a dead server is noticed quickly.
_PROBE_TIMEOUT = 1.0
#: Interval at which the readiness loop checks whether the server process has exited.
_POLL_INTERVAL = 0.02
#: Attempts with a fresh port when an auto-chosen port was grabbed by someone else meanwhile.
_PORT_ATTEMPTS = 3


class ServerStartError(RuntimeError):
    """A private server could not be initialised or did not become ready in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The kernel picks the port, so it does not collide with anything listening now; another
    process could still take it before the server binds, which callers handle by retrying.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _find_binary(env_var: str, candidates: Sequence[str]) -> str:
    """Locate a server binary: an explicit environment override first, then known paths/PATH.

    An override lets a developer with a differently packaged server run the suite unchanged.
    """
    override = os.environ.get(env_var)
    if override:
        return override
    for candidate in candidates:
        if os.sep in candidate:
            if os.access(candidate, os.X_OK):
                return candidate
        else:
            found = shutil.which(candidate)
            if found:
                return found
    raise ServerStartError(f"none of {list(candidates)} found; set {env_var} to the binary")


def _postgresql_bindir() -> Path:
    """Find the PostgreSQL server binaries (Debian keeps them off PATH, per major version)."""
    override = os.environ.get("TICKETS_PG_BINDIR")
    if override:
        return Path(override)
    versioned = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versioned:
        return versioned[-1].parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServerStartError("PostgreSQL initdb not found; set TICKETS_PG_BINDIR")


def _tail(path: Path, start: int = 0, limit: int = 4000) -> str:
    """Return the end of a log file from byte ``start`` on, for error messages."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    return data[-limit:].decode("utf-8", "replace")


def _socket_dir(workdir: Path, filename: str) -> tuple[Path, Path | None]:
    """Pick a directory for a unix socket, falling back to a short temp dir for deep workdirs.

    Returns the directory and, when a fallback was created, the path to remove on teardown.
    """
    if len(str(workdir / filename)) <= _MAX_SOCKET_PATH:
        return workdir, None
    short = Path(tempfile.mkdtemp(prefix="tkt-sock-"))
    return short, short


class _Credentials:
    """Popen keyword arguments that run a child as another OS user (or unchanged if None).

    Supplementary groups are dropped too, so the child does not keep root's groups.
    """

    def __init__(self, run_as: tuple[int, int] | None) -> None:
        self.user: int | None = run_as[0] if run_as else None
        self.group: int | None = run_as[1] if run_as else None
        self.extra_groups: list[int] | None = [] if run_as else None


_TEMPLATES: dict[str, Path] = {}
_TEMPLATES_LOCK = threading.Lock()
_TEMPLATE_ROOT: Path | None = None


def _copy_from_template(key: str, datadir: Path, build: Callable[[Path], None]) -> None:
    """Fill ``datadir`` with a copy of a freshly initialised data directory.

    Initialising (bootstrap SQL for MariaDB, initdb for PostgreSQL) is the slow part of a
    start, and every private server of one kind starts from the same empty state, so it is
    done once per process and copied -- the way mysql-test-run does it. Data directories of
    both servers contain only relative paths, so a copy is a valid cluster. The templates live
    in one temp directory removed at interpreter exit.
    """
    global _TEMPLATE_ROOT
    with _TEMPLATES_LOCK:
        template = _TEMPLATES.get(key)
        if template is None:
            if _TEMPLATE_ROOT is None:
                _TEMPLATE_ROOT = Path(tempfile.mkdtemp(prefix="tickets-templates-"))
                # PostgreSQL's initdb runs as the postgres user and must reach its template.
                _TEMPLATE_ROOT.chmod(0o755)
                atexit.register(shutil.rmtree, _TEMPLATE_ROOT, True)
            template = _TEMPLATE_ROOT / key
            try:
                build(template)
            except BaseException:
                shutil.rmtree(template, ignore_errors=True)
                raise
            _TEMPLATES[key] = template
    shutil.copytree(template / "data", datadir, symlinks=True)


# --------------------------------------------------------------------------------------------
# Process handle
# --------------------------------------------------------------------------------------------

_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()


class ServerProcess:
    """A running (or stopped) private database server that this process started.

    The server is the leader of its own process group, so ``kill()`` takes down PostgreSQL's
    backend processes together with the postmaster, exactly like a machine losing power.
    """

    def __init__(
        self,
        *,
        kind: str,
        url: str,
        port: int,
        workdir: Path,
        argv: list[str],
        log_path: Path,
        stop_signal: signal.Signals,
        probe: Callable[[int], None],
        run_as: tuple[int, int] | None,
        cleanup: Sequence[Path] = (),
    ) -> None:
        self.kind = kind
        self.url = url
        self.port = port
        self.workdir = workdir
        self.log_path = log_path
        self._argv = argv
        self._stop_signal = stop_signal
        self._probe = probe
        self._run_as = run_as
        self._cleanup = list(cleanup)
        self._popen: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """PID of the server process (the postmaster for PostgreSQL)."""
        if self._popen is None:
            raise RuntimeError("server was never started")
        return self._popen.pid

    def is_running(self) -> bool:
        """True while the server process has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def restart(self, timeout: float = 60) -> None:
        """Start the server again on the same data directory and port (after stop/kill)."""
        if self.is_running():
            raise RuntimeError(f"{self.kind} server on port {self.port} is still running")
        self._launch(timeout)

    def kill(self) -> None:
        """SIGKILL the whole server process group and wait until the leader is reaped."""
        popen = self._popen
        if popen is not None and popen.returncode is None:
            # Only signal while the leader is unreaped: then its pid (= pgid) cannot have been
            # reused by an unrelated process.
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait()
        self._forget()

    def stop(self, timeout: float = 30) -> None:
        """Shut the server down cleanly; fall back to ``kill()`` if it overruns ``timeout``."""
        popen = self._popen
        if popen is not None and popen.returncode is None:
            try:
                popen.send_signal(self._stop_signal)
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self._forget()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<ServerProcess {self.kind} {self.url} {state}>"

    # -- internals -----------------------------------------------------------------------

    def _launch(self, timeout: float) -> None:
        """Spawn the server and block until it answers a query, it dies, or time runs out."""
        deadline = time.monotonic() + timeout
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        creds = _Credentials(self._run_as)
        for path in self._cleanup:  # fallback socket dir, removed by a previous stop/kill
            if not path.exists():
                path.mkdir(mode=0o700)
                if self._run_as is not None:
                    os.chown(path, *self._run_as)
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(  # noqa: S603 - fixed argv built above
                self._argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,  # own process group: killpg(), and no terminal ^C
                user=creds.user,
                group=creds.group,
                extra_groups=creds.extra_groups,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        last_error: BaseException | None = None
        while True:
            try:
                self._probe(self.port)
                return
            except Exception as exc:  # any driver error means "not ready yet"
                last_error = exc
            try:
                code = self._popen.wait(timeout=_POLL_INTERVAL)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                self._forget()
                raise ServerStartError(
                    f"{self.kind} exited with code {code} during startup; log "
                    f"{self.log_path}:\n{_tail(self.log_path, log_start)}"
                )
            if time.monotonic() >= deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.kind} on port {self.port} not ready after {timeout:.0f}s "
                    f"(last error: {last_error!r}); log {self.log_path}:\n"
                    f"{_tail(self.log_path, log_start)}"
                )

    def _forget(self) -> None:
        """Drop the process from the atexit registry and remove fallback socket dirs."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        for path in self._cleanup:
            shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _kill_leftover_servers() -> None:
    """Safety net: never leave private servers running after the test process exits."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for server in leftovers:
        try:
            server.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _start_with_port_retry(
    make: Callable[[int], ServerProcess], port: int | None, timeout: float
) -> ServerProcess:
    """Launch ``make(port)``; if an auto-chosen port was taken meanwhile, try a fresh one.

    ``free_port()`` cannot reserve a port, so a parallel process may grab it between the
    check and the server's bind. An explicit port is never silently replaced.
    """
    deadline = time.monotonic() + timeout
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        server = make(port if port is not None else free_port())
        log_start = server.log_path.stat().st_size if server.log_path.exists() else 0
        try:
            server._launch(max(deadline - time.monotonic(), 1.0))
            return server
        except ServerStartError:
            in_use = "Address already in use" in _tail(server.log_path, log_start, 1 << 20)
            if not in_use or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# MariaDB
# --------------------------------------------------------------------------------------------

#: Options shared by bootstrap and server: keep InnoDB files small so both start quickly.
_MARIADB_SIZING = (
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=8M",
    "--innodb-temp-data-file-path=ibtmp1:1M:autoextend",
)

#: Server options: loopback only, no DNS, same charset as the packaged server, fast commits.
_MARIADB_SERVER = (
    "--bind-address=127.0.0.1",
    "--skip-name-resolve",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--innodb-flush-log-at-trx-commit=2",
    "--skip-log-bin",
)


def _own_tmpdir(workdir: Path) -> Path:
    """A temporary directory of this server's own: in the shared /tmp, a bootstrap once failed
    on an Aria temporary file that vanished under it (``Error on delete of '/tmp/#sql-...'``)."""
    tmpdir = workdir / "tmp"
    tmpdir.mkdir(exist_ok=True)
    return tmpdir


def _probe_mariadb(port: int) -> None:
    """Succeed only when root can log in over TCP and run a query."""
    import pymysql

    conn = pymysql.connect(
        host="127.0.0.1",
        port=port,
        user="root",
        connect_timeout=_PROBE_TIMEOUT,
        read_timeout=_PROBE_TIMEOUT * 5,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchall()
    finally:
        conn.close()


def start_private_mariadb(
    workdir: Path,
    *,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    timeout: float = 60,
) -> ServerProcess:
    """Initialise (once) and start a private MariaDB in ``workdir``; wait until it answers.

    ``root`` has no password over TCP (``--auth-root-authentication-method=normal``), grant
    tables are enforced as usual. ``extra_args`` go to ``mariadbd`` after the defaults, so they
    override them (e.g. ``--auto-increment-increment=2``). ``--no-defaults`` keeps the host's
    ``/etc/mysql`` configuration (datadir, socket, port of the system server) out of the way.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    datadir = workdir / "data"
    as_root = os.geteuid() == 0
    user_args = ["--user=root"] if as_root else []

    if not (datadir / "mysql").is_dir():

        def install(template: Path) -> None:
            template.mkdir()
            install_db = _find_binary(
                "TICKETS_MARIADB_INSTALL_DB",
                ["/usr/bin/mariadb-install-db", "mariadb-install-db"],
            )
            install_log = template / "install.log"
            with install_log.open("wb") as log:
                result = subprocess.run(  # noqa: S603
                    [
                        install_db,
                        "--no-defaults",
                        f"--datadir={template / 'data'}",
                        f"--tmpdir={_own_tmpdir(template)}",
                        *user_args,
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                        "--skip-name-resolve",
                        *_MARIADB_SIZING,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=template,
                    timeout=max(deadline - time.monotonic(), 1.0),
                    check=False,
                )
            if result.returncode != 0:
                raise ServerStartError(
                    f"mariadb-install-db failed ({result.returncode}):\n{_tail(install_log)}"
                )

        _copy_from_template("mariadb", datadir, install)

    mariadbd = _find_binary("TICKETS_MARIADBD", ["/usr/sbin/mariadbd", "mariadbd", "mysqld"])
    sock_dir, cleanup = _socket_dir(workdir, "mysqld.sock")

    def make(server_port: int) -> ServerProcess:
        argv = [
            mariadbd,
            "--no-defaults",  # must come first
            *user_args,
            f"--datadir={datadir}",
            f"--socket={sock_dir / 'mysqld.sock'}",
            f"--pid-file={workdir / 'mysqld.pid'}",
            f"--tmpdir={_own_tmpdir(workdir)}",
            f"--port={server_port}",
            *_MARIADB_SIZING,
            *_MARIADB_SERVER,
            *extra_args,
        ]
        return ServerProcess(
            kind="mariadb",
            url=f"mysql+pymysql://root@127.0.0.1:{server_port}/",
            port=server_port,
            workdir=workdir,
            argv=argv,
            log_path=workdir / "mariadbd.log",
            stop_signal=signal.SIGTERM,
            probe=_probe_mariadb,
            run_as=None,
            cleanup=[cleanup] if cleanup else [],
        )

    return _start_with_port_retry(make, port, max(deadline - time.monotonic(), 1.0))


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


def _probe_postgresql(port: int) -> None:
    """Succeed only when the server accepts a TCP login and runs a query."""
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="postgres",
        connect_timeout=max(int(_PROBE_TIMEOUT), 1),
    ) as conn:
        conn.execute("SELECT 1").fetchall()


def _check_traversable(path: Path, uid: int, gid: int) -> None:
    """Fail early, with a useful message, if ``uid`` cannot reach ``path``.

    PostgreSQL refuses to run as root, so it runs as the ``postgres`` OS user; pytest's
    ``tmp_path`` lives under a root-only (0700) directory, which would otherwise surface as an
    obscure "permission denied" deep inside initdb.
    """
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_mode & stat.S_IXOTH:
            continue
        if st.st_uid == uid and st.st_mode & stat.S_IXUSR:
            continue
        if st.st_gid == gid and st.st_mode & stat.S_IXGRP:
            continue
        raise ServerStartError(
            f"{parent} (mode {stat.filemode(st.st_mode)}) is not traversable by uid {uid}; "
            f"put the PostgreSQL workdir somewhere that user can reach (e.g. tempfile.mkdtemp())"
        )


def start_private_postgresql(
    workdir: Path,
    *,
    port: int | None = None,
    timeout: float = 60,
) -> ServerProcess:
    """Initialise (once) and start a private PostgreSQL in ``workdir``; wait until it answers.

    Authentication is ``trust`` for superuser ``postgres``; the server listens on
    127.0.0.1 only, with its unix socket in ``workdir``. When running as root the server runs
    as the ``postgres`` OS user and ``workdir`` is chowned to it.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    bindir = _postgresql_bindir()
    datadir = workdir / "data"

    run_as: tuple[int, int] | None = None
    if os.geteuid() == 0:
        pw = pwd.getpwnam(os.environ.get("TICKETS_PG_OS_USER", "postgres"))
        run_as = (pw.pw_uid, pw.pw_gid)
        _check_traversable(workdir, *run_as)
    creds = _Credentials(run_as)

    if not (datadir / "PG_VERSION").exists():

        def initdb(template: Path) -> None:
            template.mkdir()
            if run_as is not None:
                os.chown(template, *run_as)
            init_log = template / "initdb.log"
            with init_log.open("wb") as log:
                result = subprocess.run(  # noqa: S603
                    [
                        str(bindir / "initdb"),
                        f"--pgdata={template / 'data'}",
                        "--username=postgres",
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--locale=C.UTF-8",
                        "--no-sync",  # throwaway cluster: skip the fsync of every file
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=template,
                    timeout=max(deadline - time.monotonic(), 1.0),
                    check=False,
                    user=creds.user,
                    group=creds.group,
                    extra_groups=creds.extra_groups,
                )
            if result.returncode != 0:
                raise ServerStartError(f"initdb failed ({result.returncode}):\n{_tail(init_log)}")

        _copy_from_template("postgresql", datadir, initdb)

    log_path = workdir / "postgres.log"
    log_path.touch()
    if run_as is not None:
        for root, dirs, files in os.walk(workdir):
            os.chown(root, *run_as)
            for name in (*dirs, *files):
                os.chown(os.path.join(root, name), *run_as, follow_symlinks=False)

    sock_dir, cleanup = _socket_dir(workdir, ".s.PGSQL.65535")
    if cleanup is not None and run_as is not None:
        os.chown(cleanup, *run_as)

    def make(server_port: int) -> ServerProcess:
        argv = [
            str(bindir / "postgres"),
            "-D",
            str(datadir),
            "-p",
            str(server_port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={sock_dir}",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "shared_buffers=32MB",
        ]
        return ServerProcess(
            kind="postgresql",
            url=f"postgresql+psycopg://postgres@127.0.0.1:{server_port}/postgres",
            port=server_port,
            workdir=workdir,
            argv=argv,
            log_path=log_path,
            stop_signal=signal.SIGINT,  # "fast" shutdown: roll back sessions, then exit
            probe=_probe_postgresql,
            run_as=run_as,
            cleanup=[cleanup] if cleanup else [],
        )

    return _start_with_port_retry(make, port, max(deadline - time.monotonic(), 1.0))
