"""A private MariaDB Galera cluster on loopback, started from the installed binaries.

Multi-primary Galera is where a ticket server meets *certification failures*: two nodes
updating the same row at once both commit locally, and the loser of the cluster-wide
certification gets error 1213 ("Deadlock found when trying to get lock") at ``COMMIT`` -- a
fault a single server never produces. Tests that must prove the library retries it need a
real cluster; this module starts one from ``mariadbd`` and the Galera 4 provider (Debian
packages ``mariadb-server``, ``galera-4`` and ``rsync``).

Each node is a ``mariadbd`` of its own (``servers.ServerProcess``: own process group,
``atexit`` safety net, readiness probe) with its own SQL port, Galera port, IST port and SST
port on 127.0.0.1. Node 1 is initialised from the same cached template as every private
MariaDB (``servers.start_private_mariadb``) and bootstraps the cluster
(``--wsrep-new-cluster``); the others start with an empty data directory and receive a
full state snapshot (SST) from it with ``rsync``. ``wsrep_auto_increment_control`` (on by
default) gives every node ``auto_increment_increment`` = cluster size and a distinct offset.

A node may be SIGKILLed (``GaleraNode.kill``) and brought back (``GaleraNode.rejoin``): the
position of its last committed transaction is read with ``--wsrep-recover`` -- what
``mysqld_safe``/``galera_recovery`` do for a packaged server -- and passed as
``--wsrep-start-position`` so the node catches up by incremental state transfer (IST) from a
surviving node's write-set cache instead of a full copy. Rejoining needs at least one node
still running; a cluster that lost every node is not restarted.

Two quirks of the packaged SST script shape the setup:

* The joiner's ``rsync --daemon`` is started as root without a ``uid`` setting, so it
  switches to ``nobody`` before writing. Node data directories are therefore made
  world-writable (``chmod -R a+rwX``) before every start, and ``mariadbd`` runs with
  ``UMASK=0666 UMASK_DIR=0777`` so the files it creates later stay writable for the next
  SST. The whole work directory must be traversable by ``nobody``: pytest's ``tmp_path`` is
  not when running as root (its base directory is 0700), so use ``tempfile.mkdtemp()``.
* The script needs ``ss`` (iproute2) or ``lsof`` to watch its listening socket.

Failure detection is tightened (``evs.suspect_timeout`` 3 s instead of 5 s) so that the
survivors of a SIGKILL form a new primary component -- and accept writes again -- within
about 4 s; it stays well above the scheduling hiccups of a busy two-core machine, which
would otherwise evict a live node. Durability is relaxed like every private server here
(``innodb_flush_log_at_trx_commit=2``): commits survive SIGKILL of ``mariadbd``, not a
machine crash.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from .servers import (
    _MARIADB_SERVER,
    _MARIADB_SIZING,
    ServerProcess,
    ServerStartError,
    _check_traversable,
    _find_binary,
    _probe_mariadb,
    _socket_dir,
    _start_with_port_retry,
    _tail,
    free_port,
    start_private_mariadb,
)

__all__ = [
    "GaleraCluster",
    "GaleraNode",
    "galera_unavailable_reason",
    "start_galera_cluster",
]

#: Where Debian's ``galera-4`` (and other distributions' packages) put the provider library.
_PROVIDER_CANDIDATES = (
    "/usr/lib/galera/libgalera_smm.so",
    "/usr/lib/galera-4/libgalera_smm.so",
    "/usr/lib64/galera-4/libgalera_smm.so",
    "/usr/lib64/galera/libgalera_smm.so",
)

#: Galera provider options shared by every node (the per-node listen addresses are added).
#: Small write-set cache (default 128M, preallocated per node); failure detection in about
#: 3-6 s instead of 5-15 s, so the survivors of a SIGKILL carry on sooner.
_PROVIDER_OPTIONS = (
    "gcache.size=32M",
    "evs.keepalive_period=PT1S",
    "evs.inactive_check_period=PT1S",
    "evs.suspect_timeout=PT3S",
    "evs.inactive_timeout=PT6S",
    "evs.install_timeout=PT6S",
)

#: Server options Galera requires or that keep the nodes light.
_GALERA_SERVER = (
    "--wsrep-on=ON",
    "--wsrep-sst-method=rsync",
    "--wsrep-node-address=127.0.0.1",
    "--binlog-format=ROW",
    "--default-storage-engine=InnoDB",
    "--innodb-autoinc-lock-mode=2",
)

#: ``mariadbd`` environment: files world-writable for the SST rsync daemon running as nobody.
_SST_UMASK = ("UMASK=0666", "UMASK_DIR=0777")

_RECOVERED = re.compile(r"WSREP: Recovered position:?\s+([0-9a-fA-F-]{36}:-?\d+)")
#: How often the synced-state loops poll.
_POLL = 0.1
_STATUS_TIMEOUT = 2
#: Read timeout of cluster-wide DDL and of the causal read that waits for it everywhere.
_DDL_TIMEOUT = 30


def _provider_path() -> str:
    override = os.environ.get("TICKETS_GALERA_PROVIDER")
    if override:
        if not os.path.exists(override):
            raise ServerStartError(f"TICKETS_GALERA_PROVIDER={override} does not exist")
        return override
    for candidate in _PROVIDER_CANDIDATES:
        if os.path.exists(candidate):
            return candidate
    raise ServerStartError(
        f"Galera provider not found in {list(_PROVIDER_CANDIDATES)}: install the Debian "
        "package galera-4 or set TICKETS_GALERA_PROVIDER to libgalera_smm.so"
    )


def galera_unavailable_reason() -> str | None:
    """Why a Galera cluster cannot be started here (missing package), or None if it can.

    Cheap (no process is started): lets a fixture skip or fail with a useful message before
    spending time on a start that cannot work.
    """
    try:
        _provider_path()
        _find_binary("TICKETS_MARIADBD", ["/usr/sbin/mariadbd", "mariadbd", "mysqld"])
    except ServerStartError as exc:
        return str(exc)
    missing = [tool for tool in ("rsync", "wsrep_sst_rsync") if shutil.which(tool) is None]
    if not (shutil.which("ss") or shutil.which("lsof")):
        missing.append("ss (iproute2) or lsof")
    if missing:
        return (
            f"Galera SST needs {', '.join(missing)} on PATH "
            "(Debian: apt-get install rsync iproute2 galera-4 mariadb-server)"
        )
    return None


def _status(port: int, pattern: str = "wsrep%") -> dict[str, str]:
    """``SHOW GLOBAL STATUS LIKE pattern`` of the server on ``port`` (raises if unreachable)."""
    import pymysql

    conn = pymysql.connect(
        host="127.0.0.1",
        port=port,
        user="root",
        connect_timeout=_STATUS_TIMEOUT,
        read_timeout=_STATUS_TIMEOUT,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE %s", (pattern,))
            return {str(name).lower(): str(value) for name, value in cur.fetchall()}
    finally:
        conn.close()


def _make_world_writable(root: Path) -> None:
    """``chmod -R a+rwX root``: the SST rsync daemon writes as ``nobody``."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            extra = 0o111 if mode & 0o111 else 0
            os.chmod(path, (mode & 0o7777) | 0o666 | extra)


class GaleraNode:
    """One ``mariadbd`` of a ``GaleraCluster``: its ports, URL and process.

    ``url`` is server-level (``mysql+pymysql://root@127.0.0.1:PORT/``); ``url_for(db)`` names
    a database. The SQL port is chosen at the first start and kept across ``kill()`` /
    ``rejoin()``, so URLs handed out earlier stay valid.
    """

    def __init__(
        self,
        *,
        index: int,
        workdir: Path,
        cluster_name: str,
        cluster_address: str,
        galera_port: int,
        ist_port: int,
        sst_port: int,
        mariadbd: str,
        provider: str,
        reserved_ports: frozenset[int] = frozenset(),
    ) -> None:
        self.index = index
        self.name = f"node{index}"
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.galera_port = galera_port
        self.ist_port = ist_port
        self.sst_port = sst_port
        self.port = 0  # SQL port, set by the first start
        #: The ``--wsrep-start-position`` given at the last start (None: none, e.g. first start).
        self.start_position: str | None = None
        self._reserved_ports = reserved_ports
        self._cluster_name = cluster_name
        self._cluster_address = cluster_address
        self._mariadbd = mariadbd
        self._provider = provider
        self._process: ServerProcess | None = None
        self._sock_dir, self._sock_cleanup = _socket_dir(workdir, "mysqld.sock")
        self._user_args = ["--user=root"] if os.geteuid() == 0 else []
        self._env = [shutil.which("env") or "/usr/bin/env", *_SST_UMASK]

    # -- public ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Server-level SQLAlchemy URL of this node."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/"

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this node."""
        return f"{self.url}{database}"

    @property
    def log_path(self) -> Path:
        """The node's server log (error log and SST script output), appended across starts."""
        return self.workdir / "mariadbd.log"

    @property
    def is_running(self) -> bool:
        """True while this node's ``mariadbd`` has not exited."""
        return self._process is not None and self._process.is_running()

    def status(self) -> dict[str, str]:
        """The node's ``wsrep%`` status variables, names lower-cased."""
        return _status(self.port)

    def kill(self) -> None:
        """SIGKILL the node (its SST helpers included), like a machine losing power."""
        if self._process is not None:
            self._process.kill()

    def stop(self, timeout: float = 30) -> None:
        """Shut the node down cleanly; it leaves the cluster, which shrinks by one."""
        if self._process is not None:
            self._process.stop(timeout=timeout)

    def rejoin(self, timeout: float = 60) -> None:
        """Start a stopped or killed node again and wait until it is ``Synced``.

        The last committed position is recovered from InnoDB (``--wsrep-recover``) and given
        to the server, so it asks a running node for the missing write sets only (IST); if
        that is impossible the donor falls back to a full rsync SST. Returns once the node is
        ``Synced`` in a cluster that counts every running node of its ``GaleraCluster``.
        """
        if self.is_running:
            raise RuntimeError(f"{self.name} (port {self.port}) is still running")
        deadline = time.monotonic() + timeout
        position = self.recover_position(timeout=max(deadline - time.monotonic(), 1.0))
        self._launch(
            port=self.port or None,
            bootstrap=False,
            start_position=position,
            timeout=max(deadline - time.monotonic(), 1.0),
        )
        self.wait_synced(self._expected_size(), timeout=max(deadline - time.monotonic(), 1.0))

    def recover_position(self, timeout: float = 60) -> str | None:
        """Run ``mariadbd --wsrep-recover`` on the (stopped) data directory.

        Returns ``"<cluster state uuid>:<seqno>"`` of the last committed transaction, or None
        if InnoDB holds none (a node that never finished its first SST).
        """
        if self.is_running:
            raise RuntimeError(f"{self.name} is running; recover the position of a stopped node")
        _make_world_writable(self.datadir)
        log = self.workdir / "wsrep-recover.log"
        with log.open("wb") as out:
            result = subprocess.run(  # noqa: S603 - fixed argv
                [*self._argv(self.port or free_port()), "--wsrep-recover"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                timeout=timeout,
                check=False,
            )
        text = log.read_text("utf-8", "replace")
        if result.returncode != 0:
            raise ServerStartError(
                f"{self.name}: mariadbd --wsrep-recover exited with {result.returncode}:\n"
                f"{text[-4000:]}"
            )
        found = _RECOVERED.findall(text)
        if not found or found[-1].startswith("00000000-0000-0000-0000-000000000000"):
            return None
        position: str = found[-1]
        return None if position.endswith(":-1") else position

    def wait_synced(self, cluster_size: int, timeout: float = 60) -> dict[str, str]:
        """Wait until this node is ``Synced``, ready and in a primary component of
        ``cluster_size`` nodes; return its ``wsrep%`` status."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] | str = "never answered"
        while True:
            if not self.is_running:
                raise ServerStartError(
                    f"{self.name} exited while waiting for Synced; log {self.log_path}:\n"
                    f"{_tail(self.log_path)}"
                )
            try:
                status = self.status()
                last = status
                if (
                    status.get("wsrep_local_state_comment") == "Synced"
                    and status.get("wsrep_ready") == "ON"
                    and status.get("wsrep_cluster_status") == "Primary"
                    and status.get("wsrep_cluster_size") == str(cluster_size)
                ):
                    return status
            except Exception as exc:  # noqa: BLE001 - not answering yet
                last = repr(exc)
            if time.monotonic() >= deadline:
                if isinstance(last, dict):
                    last = {
                        key: last.get(key, "?")
                        for key in (
                            "wsrep_local_state_comment",
                            "wsrep_ready",
                            "wsrep_cluster_status",
                            "wsrep_cluster_size",
                        )
                    }
                raise ServerStartError(
                    f"{self.name} not Synced in a cluster of {cluster_size} after "
                    f"{timeout:.0f}s (last: {last}); log {self.log_path}:\n"
                    f"{_tail(self.log_path)}"
                )
            time.sleep(_POLL)

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<GaleraNode {self.name} {self.url} galera:{self.galera_port} {state}>"

    # -- internals ------------------------------------------------------------------------

    #: Set by the owning cluster: counts running nodes for ``rejoin``.
    _cluster: GaleraCluster | None = None

    def _expected_size(self) -> int:
        if self._cluster is None:
            return 1
        return sum(1 for node in self._cluster.nodes if node.is_running)

    def _argv(self, port: int) -> list[str]:
        options = ";".join(
            (
                f"gmcast.listen_addr=tcp://127.0.0.1:{self.galera_port}",
                f"ist.recv_addr=127.0.0.1:{self.ist_port}",
                *_PROVIDER_OPTIONS,
            )
        )
        return [
            *self._env,
            self._mariadbd,
            "--no-defaults",  # must come first
            *self._user_args,
            f"--datadir={self.datadir}",
            f"--socket={self._sock_dir / 'mysqld.sock'}",
            f"--pid-file={self.workdir / 'mysqld.pid'}",
            f"--port={port}",
            *_MARIADB_SIZING,
            *_MARIADB_SERVER,
            *_GALERA_SERVER,
            f"--wsrep-provider={self._provider}",
            f"--wsrep-cluster-name={self._cluster_name}",
            f"--wsrep-cluster-address={self._cluster_address}",
            f"--wsrep-node-name={self.name}",
            f"--wsrep-provider-options={options}",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
        ]

    def _launch(
        self, *, port: int | None, bootstrap: bool, start_position: str | None, timeout: float
    ) -> None:
        """Start ``mariadbd`` and wait until it answers SQL (joiners: after their SST)."""
        _make_world_writable(self.datadir)
        extra = ["--wsrep-new-cluster"] if bootstrap else []
        if start_position is not None:
            extra.append(f"--wsrep-start-position={start_position}")

        def make(server_port: int) -> ServerProcess:
            while server_port in self._reserved_ports:  # free now, but another node's later
                server_port = free_port()
            return ServerProcess(
                kind=f"galera {self.name}",
                url=f"mysql+pymysql://root@127.0.0.1:{server_port}/",
                port=server_port,
                workdir=self.workdir,
                argv=[*self._argv(server_port), *extra],
                log_path=self.log_path,
                stop_signal=signal.SIGTERM,
                probe=_probe_mariadb,
                run_as=None,
                cleanup=[self._sock_cleanup] if self._sock_cleanup else [],
            )

        self.start_position = start_position
        self._process = _start_with_port_retry(make, port, timeout)
        self.port = self._process.port


class GaleraCluster:
    """A running Galera cluster of ``GaleraNode`` s; ``stop()`` or use it as a context manager.

    ``nodes[0]`` bootstrapped the cluster, but every node accepts reads and writes.
    """

    def __init__(self, name: str, workdir: Path, nodes: Sequence[GaleraNode]) -> None:
        self.name = name
        self.workdir = workdir
        self.nodes: list[GaleraNode] = list(nodes)
        for node in self.nodes:
            node._cluster = self

    @property
    def urls(self) -> list[str]:
        """Server-level URL of every node, in node order."""
        return [node.url for node in self.nodes]

    @property
    def running(self) -> list[GaleraNode]:
        """The nodes whose ``mariadbd`` is running."""
        return [node for node in self.nodes if node.is_running]

    def wait_synced(self, timeout: float = 60) -> None:
        """Wait until every running node is ``Synced`` in one primary component of them all.

        Also checks that they agree on ``wsrep_cluster_state_uuid`` -- one cluster, not
        several that happen to have the same size.
        """
        deadline = time.monotonic() + timeout
        running = self.running
        if not running:
            raise RuntimeError(f"no node of Galera cluster {self.name} is running")
        uuids = {
            node.wait_synced(len(running), max(deadline - time.monotonic(), 1.0))[
                "wsrep_cluster_state_uuid"
            ]
            for node in running
        }
        if len(uuids) != 1:
            raise ServerStartError(f"running nodes report different cluster states: {uuids}")

    def create_database(self, name: str) -> list[str]:
        """Create database ``name`` (utf8mb4) through a running node; wait until every running
        node has it, and return its URL on every node, in node order."""
        if not re.fullmatch(r"[A-Za-z0-9_]{1,64}", name):
            raise ValueError(f"unsafe database name {name!r}")
        self._execute_everywhere(
            f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4",
            "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = %s",
            name,
            1,
        )
        return [node.url_for(name) for node in self.nodes]

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` (if it exists) and wait until no running node has it."""
        if not re.fullmatch(r"[A-Za-z0-9_]{1,64}", name):
            raise ValueError(f"unsafe database name {name!r}")
        self._execute_everywhere(
            f"DROP DATABASE IF EXISTS `{name}`",
            "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = %s",
            name,
            0,
        )

    def stop(self, timeout: float = 60) -> None:
        """Stop every node cleanly, one after the other (last first), then kill stragglers.

        One at a time: a node leaving alone is acknowledged by the others at once, while
        nodes leaving together wait ``evs.suspect_timeout`` for each other.
        """
        deadline = time.monotonic() + timeout
        try:
            for node in reversed(self.nodes):
                node.stop(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL every node."""
        for node in self.nodes:
            node.kill()

    def __enter__(self) -> GaleraCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<GaleraCluster {self.name} {self.nodes!r}>"

    def _execute_everywhere(self, ddl: str, check: str, name: str, expected: int) -> None:
        import pymysql

        running = self.running
        if not running:
            raise RuntimeError(f"no node of Galera cluster {self.name} is running")
        conn = pymysql.connect(
            host="127.0.0.1",
            port=running[0].port,
            user="root",
            connect_timeout=_STATUS_TIMEOUT,
            read_timeout=_DDL_TIMEOUT,
        )
        try:
            with conn.cursor() as cur:
                cur.execute(ddl)
        finally:
            conn.close()
        for node in running:
            conn = pymysql.connect(
                host="127.0.0.1",
                port=node.port,
                user="root",
                connect_timeout=_STATUS_TIMEOUT,
                read_timeout=_DDL_TIMEOUT,
            )
            try:
                with conn.cursor() as cur:
                    # Causality check: wait until this node applied everything before it.
                    cur.execute("SET SESSION wsrep_sync_wait = 1")
                    cur.execute(check, (name,))
                    row = cur.fetchone()
                    if row is None or int(row[0]) != expected:
                        raise RuntimeError(f"{node.name}: {ddl!r} not applied")
            finally:
                conn.close()


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def start_galera_cluster(workdir: Path, nodes: int = 3, timeout: float = 120) -> GaleraCluster:
    """Start a ``nodes``-node MariaDB Galera cluster in ``workdir``; return once all are Synced.

    Node ``i`` lives in ``workdir/node<i>`` (data directory, ``mariadbd.log``). ``workdir``
    should be new, and must be reachable by the ``nobody`` user (see the module docstring),
    e.g. a ``tempfile.mkdtemp()``; the caller removes it after ``stop()``. On any failure the nodes
    already started are killed and ``ServerStartError`` says why (with the log's tail).
    """
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    deadline = time.monotonic() + timeout
    reason = galera_unavailable_reason()
    if reason is not None:
        raise ServerStartError(reason)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        try:
            _check_traversable(workdir, nobody.pw_uid, nobody.pw_gid)  # its parents, that is
        except ServerStartError as exc:
            raise ServerStartError(
                f"Galera workdir {workdir}: the SST rsync daemon runs as nobody and cannot "
                f"reach it ({str(exc).split(';')[0]}); use e.g. tempfile.mkdtemp()"
            ) from None
    workdir.chmod(0o755)
    mariadbd = _find_binary("TICKETS_MARIADBD", ["/usr/sbin/mariadbd", "mariadbd", "mysqld"])
    provider = _provider_path()

    ports = _distinct_free_ports(3 * nodes)
    galera_ports = ports[0::3]
    address = "gcomm://" + ",".join(f"127.0.0.1:{port}" for port in galera_ports)
    name = f"tickets-{secrets.token_hex(4)}"
    members: list[GaleraNode] = []
    for index in range(nodes):
        node_dir = workdir / f"node{index + 1}"
        node_dir.mkdir(exist_ok=True)
        node_dir.chmod(0o755)
        if index > 0:  # joiners start empty; node 1 gets an initialised one below
            (node_dir / "data").mkdir(exist_ok=True)
        members.append(
            GaleraNode(
                index=index + 1,
                workdir=node_dir,
                cluster_name=name,
                cluster_address=address,
                galera_port=galera_ports[index],
                ist_port=ports[3 * index + 1],
                sst_port=ports[3 * index + 2],
                mariadbd=mariadbd,
                provider=provider,
                reserved_ports=frozenset(ports),
            )
        )
    cluster = GaleraCluster(name, workdir, members)
    try:
        first = members[0]
        if not (first.datadir / "mysql").is_dir():
            # An initialised data directory from the shared template: start and stop a plain
            # private MariaDB on it once (the joiners get theirs by SST).
            start_private_mariadb(
                first.workdir, timeout=max(deadline - time.monotonic(), 1.0)
            ).stop()
        first._launch(
            port=None,
            bootstrap=True,
            start_position=None,
            timeout=max(deadline - time.monotonic(), 1.0),
        )
        first.wait_synced(1, timeout=max(deadline - time.monotonic(), 1.0))
        for count, node in enumerate(members[1:], start=2):
            node._launch(
                port=None,
                bootstrap=False,
                start_position=None,
                timeout=max(deadline - time.monotonic(), 1.0),
            )
            node.wait_synced(count, timeout=max(deadline - time.monotonic(), 1.0))
        cluster.wait_synced(timeout=max(deadline - time.monotonic(), 1.0))
    except BaseException:
        cluster.kill()
        raise
    return cluster
