"""A real Patroni cluster on loopback: two PostgreSQL nodes kept by Patroni over a one-member etcd.

The other failover tests promote a replica themselves (``support.rewind.PgPair.promote``). In
production that is a failover manager's decision, made on its own clock: Patroni, a widely used
one for PostgreSQL, holds a leader key in a consensus store, and when the leader stops
refreshing it the key expires and a replica promotes itself. This module runs exactly that,
from the installed binaries (Debian's ``patroni`` 3.0 and ``etcd-server`` 3.4):

* one etcd, a single member on free loopback ports, its data in the work directory;
* two Patroni nodes, each with its PostgreSQL (``support.servers._postgresql_bindir``, the
  PostgreSQL 15 of Debian's packages here) on a free port, its REST API on another, and its
  data directory in the work directory, owned by the ``postgres`` OS user that Patroni runs as
  (PostgreSQL refuses to run as root). The first node bootstraps the cluster (initdb), the
  second becomes an asynchronous streaming replica of it (Patroni's default: ``pg_basebackup``
  and a replication slot). Superuser ``postgres`` and replication user ``replicator`` log in
  with ``trust`` over 127.0.0.1 (``pg_hba`` in Patroni's configuration).

Replication goes through a :class:`~support.proxy.TcpProxy` in front of each node (the node's
``connect_address``, which Patroni hands to replicas as their ``primary_conninfo``), so a test
can make the replica fall behind for real (:meth:`PatroniCluster.hold_replication`): the leader
goes on committing, the replica receives nothing. Clients connect to the nodes directly.

:meth:`PatroniCluster.kill_leader` SIGKILLs the leader's Patroni and its PostgreSQL (every
process of it), nothing else: the leader key expires after :data:`TTL` seconds and the replica's
Patroni promotes it, with no help from the test (:meth:`PatroniCluster.wait_new_leader` only
watches). Everything runs in the caller's work directory; :meth:`PatroniCluster.close` kills
every process, and an ``atexit`` hook does the same for a session that dies first (etcd and
Patroni are :class:`~support.servers.ServerProcess` objects and share that module's hook;
the postmasters, which Patroni starts in sessions of their own, have this module's).

The binaries are ``$TICKETS_PATRONI`` and ``$TICKETS_ETCD``, else ``patroni`` and ``etcd`` on
``PATH`` (``make test`` installs Debian's packages). Without them the ``patroni_cluster``
fixture skips on a developer machine and fails under ``TICKETS_TEST_REQUIRE_ALL=1`` or ``CI``
-- the same rule as the database backends.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import secrets
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from .availability import unavailable
from .proxy import TcpProxy
from .rewind import PgPair, _wait, pg_connect, timeline
from .servers import (
    ServerProcess,
    ServerStartError,
    _check_traversable,
    _find_binary,
    _postgresql_bindir,
    _socket_dir,
    _start_with_port_retry,
    free_port,
)

__all__ = [
    "PatroniCluster",
    "PatroniNode",
    "patroni_cluster",
    "patroni_unavailable_reason",
    "start_patroni_cluster",
]

#: Seconds the leader key lives after the leader's last refresh: a dead leader is replaced
#: about this long after it died. Patroni 3.0.2 validates no minimum; its documented rule,
#: ``loop_wait + 2 * retry_timeout <= ttl``, holds (1 + 2 * 3 = 7 <= 10).
TTL = 10
#: Seconds between two runs of Patroni's HA loop (how often the leader refreshes its key).
LOOP_WAIT = 1
#: Seconds Patroni retries etcd and PostgreSQL before it treats them as down.
RETRY_TIMEOUT = 3
#: Bytes a replica may be behind the leader's last known position and still be promoted.
#: Patroni's default (1 MiB) would keep a replica that :meth:`PatroniCluster.hold_replication`
#: held back a few seconds from ever taking over; production setups that prefer availability
#: raise it the same way, and that is the failover whose lost writes the library must survive.
MAXIMUM_LAG_ON_FAILOVER = 256 * 1024 * 1024

#: Seconds etcd, a node's bootstrap or a replica's first sync may take on a loaded machine.
START_TIMEOUT = 90.0
#: Seconds a failover may take: the TTL, then Patroni's promotion of the replica.
FAILOVER_TIMEOUT = 60.0
#: Seconds one REST request to Patroni or etcd may take.
_HTTP_TIMEOUT = 2.0
#: Interval of the waits' polls.
_POLL = 0.05
#: Seconds a SIGKILLed process may take to be gone.
_KILL_TIMEOUT = 30.0

#: Requests to the loopback REST APIs never go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _etcd_binary() -> str:
    return _find_binary("TICKETS_ETCD", ["etcd", "/usr/bin/etcd"])


def _patroni_binary() -> str:
    return _find_binary("TICKETS_PATRONI", ["patroni", "/usr/bin/patroni"])


def patroni_unavailable_reason() -> str | None:
    """Why a Patroni cluster cannot be started here (a missing package), or None if it can.

    Cheap (nothing is started): the fixture skips or fails with this before spending time on
    a start that cannot work.
    """
    try:
        binaries = [_etcd_binary(), _patroni_binary(), str(_postgresql_bindir() / "postgres")]
    except ServerStartError as error:
        return (
            f"{error} (Debian: apt-get install patroni etcd-server postgresql; "
            "`make test` installs them)"
        )
    for binary in binaries:  # an override ($TICKETS_PATRONI...) is taken as given: check it
        if shutil.which(binary) is None:
            return f"{binary} is not an executable"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(os.environ.get("TICKETS_PG_OS_USER", "postgres"))
        except KeyError:
            return "no postgres OS user to run Patroni and PostgreSQL as (PostgreSQL's package)"
    return None


# --------------------------------------------------------------------------------------------
# REST and processes
# --------------------------------------------------------------------------------------------


def _http(port: int, path: str) -> tuple[int, Any]:
    """``(status, JSON body)`` of ``GET http://127.0.0.1:port/path``; an error status (Patroni
    answers 503 for "not that role") is an answer too. Raises OSError if nothing answers."""
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with _OPENER.open(url, timeout=_HTTP_TIMEOUT) as response:
            status, body = int(response.status), response.read()
    except urllib.error.HTTPError as error:
        status, body = int(error.code), error.read()
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None


def _probe_etcd(port: int) -> None:
    """Succeed only when etcd reports itself healthy (it has a leader: itself)."""
    status, body = _http(port, "/health")
    if status != 200 or not isinstance(body, dict) or body.get("health") != "true":
        raise RuntimeError(f"etcd not healthy yet: {status} {body!r}")


def _probe_patroni(port: int) -> None:
    """Succeed once Patroni's REST API answers: it is up and has read its configuration.
    Its PostgreSQL may still be bootstrapping; the cluster's waits watch for that."""
    _http(port, "/patroni")


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``Z``...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A killed postmaster is nobody's child (Patroni starts it in
    a session of its own and lets its starter exit), so it may stay a zombie until init reaps
    it: a zombie holds no port, no file and no shared memory, and counts as gone."""
    return _state(pid) not in (None, "Z", "X")


def _postmasters(data_dir: Path) -> list[int]:
    """Pids of the postmasters running on ``data_dir`` (a path of this test's own work
    directory, so nothing else matches): found from their command lines, not from
    ``postmaster.pid``, which a postmaster Patroni was starting as it was killed may not have
    written yet."""
    wanted = os.fsencode(data_dir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pairs = zip(argv, argv[1:], strict=False)
        if any(a == b"-D" and b == wanted for a, b in pairs) and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _kill_postgres(data_dir: Path) -> None:
    """SIGKILL every postmaster on ``data_dir`` with its process group (each backend, the WAL
    sender and receiver), as a machine losing power would; return once they are gone."""
    deadline = time.monotonic() + _KILL_TIMEOUT
    while True:
        pids = _postmasters(data_dir)
        if not pids:
            return
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        while any(_alive(pid) for pid in pids):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"postmasters {pids} on {data_dir} survived SIGKILL")
            time.sleep(0.01)


# --------------------------------------------------------------------------------------------
# Nodes and cluster
# --------------------------------------------------------------------------------------------


class PatroniNode:
    """One Patroni and its PostgreSQL.

    ``process`` is the Patroni process (a :class:`~support.servers.ServerProcess` whose
    ``port`` is the REST API's and whose ``url`` names this node's PostgreSQL, database
    ``postgres``); ``pg_port`` is PostgreSQL's port, which clients use. Replicas reach this
    node through ``proxy``.
    """

    def __init__(
        self, name: str, workdir: Path, pg_port: int, proxy: TcpProxy, process: ServerProcess
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.pg_port = pg_port
        self.proxy = proxy
        self.process = process

    @property
    def api_port(self) -> int:
        return self.process.port

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of this node's PostgreSQL alone."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/{database}"

    def status(self) -> dict[str, Any]:
        """Patroni's view of the node (``GET /patroni``: role, state, timeline...); ``{}``
        when its REST API does not answer."""
        try:
            _, body = _http(self.api_port, "/patroni")
        except OSError:
            return {}
        return body if isinstance(body, dict) else {}

    def holds_leader_key(self) -> bool:
        """Whether this node's Patroni holds the leader key (``GET /primary`` says 200)."""
        try:
            return _http(self.api_port, "/primary")[0] == 200
        except OSError:
            return False

    def in_recovery(self) -> bool | None:
        """``pg_is_in_recovery()`` of this node's PostgreSQL; None when it does not answer."""
        try:
            with pg_connect(self.url(), connect_timeout=2) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except Exception:  # noqa: BLE001 - any driver error: not answering
            return None
        return None if row is None else bool(row[0])

    def kill(self) -> None:
        """SIGKILL Patroni (its process group: a ``pg_basebackup`` or ``initdb`` it runs goes
        too) and then its PostgreSQL; return once all of them are gone. Patroni first, so that
        it cannot start PostgreSQL again in between."""
        self.process.kill()
        _kill_postgres(self.data_dir)

    def __repr__(self) -> str:
        return f"<PatroniNode {self.name} pg {self.pg_port} api {self.api_port}>"


_LIVE: set[PatroniCluster] = set()
_LIVE_LOCK = threading.Lock()


class PatroniCluster:
    """An etcd and two :class:`PatroniNode` s; ``leader`` and ``replica`` as last seen."""

    def __init__(self, workdir: Path, etcd: ServerProcess, scope: str) -> None:
        self.workdir = workdir
        self.etcd = etcd
        self.scope = scope
        self.nodes: list[PatroniNode] = []
        self.leader: PatroniNode | None = None
        self.replica: PatroniNode | None = None
        #: The node :meth:`kill_leader` killed.
        self.killed: PatroniNode | None = None
        with _LIVE_LOCK:
            _LIVE.add(self)

    # -- what clients use ----------------------------------------------------------------

    @property
    def leader_port(self) -> int:
        """PostgreSQL port of the leader."""
        assert self.leader is not None, "no leader"
        return self.leader.pg_port

    @property
    def replica_port(self) -> int:
        """PostgreSQL port of the replica."""
        assert self.replica is not None, "no replica"
        return self.replica.pg_port

    def url(self, database: str = "tickets") -> str:
        """A libpq multi-host URL over every node, wanting the one that takes writes: what an
        application in front of Patroni uses when it has no proxy or virtual IP. It stays the
        same through a failover."""
        hosts = "&".join(f"host=127.0.0.1:{node.pg_port}" for node in self.nodes)
        return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def create_database(self, name: str, timeout: float = START_TIMEOUT) -> None:
        """``CREATE DATABASE`` on the leader; returns once the replica has replayed it."""
        assert self.leader is not None
        with pg_connect(self.leader.url()) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.wait_caught_up(timeout)

    # -- replication ---------------------------------------------------------------------

    def _pair(self) -> PgPair:
        """The leader and replica as a :class:`~support.rewind.PgPair`, for its replication
        waits only: its promote and crash are what Patroni does here."""
        assert self.leader is not None and self.replica is not None
        return PgPair(self.leader.process, self.replica.process, self.workdir)

    def wait_streaming(self, timeout: float = START_TIMEOUT) -> None:
        """Block until the replica's WAL receiver streams from the leader."""
        self._pair().wait_streaming(timeout)

    def wait_caught_up(self, timeout: float = START_TIMEOUT) -> None:
        """Block until the replica has replayed everything the leader wrote so far."""
        self._pair().wait_caught_up(timeout)

    def hold_replication(self) -> None:
        """From now on the replica receives nothing: the proxy in front of the leader stops
        moving bytes (the replication connection stays open, so neither side notices). The
        leader goes on committing; what it commits is on the leader alone, and lost for good
        once :meth:`kill_leader` drops what the proxy held."""
        assert self.leader is not None
        self.leader.proxy.hang()

    # -- failover ------------------------------------------------------------------------

    def kill_leader(self) -> float:
        """SIGKILL the leader's Patroni and PostgreSQL, and cut the replica off from anything
        the leader sent that had not reached it (the proxy is closed: no byte it held is
        delivered, and the replica's reconnects are refused). Returns ``time.monotonic()`` at
        which the leader was dead. Its leader key stays in etcd until its TTL runs out: then
        the replica's Patroni promotes it (:meth:`wait_new_leader`)."""
        leader = self.leader
        assert leader is not None, "no leader to kill"
        if not leader.holds_leader_key():
            # Patroni moved the lead by itself (a starved leader lost its key): the scenario
            # the caller set up (a held replica behind this leader) is not there any more.
            raise AssertionError(
                f"{leader.name} no longer holds the leader key: "
                f"{[(node.name, node.status()) for node in self.nodes]!r}"
            )
        leader.kill()
        killed_at = time.monotonic()
        leader.proxy.close()
        self.killed, self.leader = leader, None
        return killed_at

    def wait_new_leader(self, timeout: float = FAILOVER_TIMEOUT) -> PatroniNode:
        """Wait until Patroni has promoted the replica by itself: its Patroni holds the leader
        key and its PostgreSQL takes writes, on a later timeline than before. It is then the
        ``leader`` (and there is no replica)."""
        candidate = self.replica
        assert candidate is not None, "no replica to promote"
        before = self._timeline(candidate)
        seen: list[Any] = [None]

        def promoted() -> bool:
            seen[0] = candidate.status()
            return candidate.holds_leader_key() and candidate.in_recovery() is False

        _wait(promoted, timeout, lambda: f"promoted by Patroni (last status {seen[0]!r})", _POLL)
        after = timeline(candidate.url())
        if before is not None and after <= before:
            raise AssertionError(f"promoted on timeline {after}, not after {before}")
        self.leader, self.replica = candidate, None
        return candidate

    @staticmethod
    def _timeline(node: PatroniNode) -> int | None:
        try:
            return timeline(node.url())
        except Exception:  # noqa: BLE001 - a node that does not answer has none to compare
            return None

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process (Patroni first, so none restarts its PostgreSQL, then the
        PostgreSQLs, then etcd) and close the proxies. The work directory is the caller's."""
        try:
            for node in self.nodes:
                node.process.kill()
            for node in self.nodes:
                _kill_postgres(node.data_dir)
        finally:
            for node in self.nodes:
                node.proxy.close()
            self.etcd.kill()
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self) -> PatroniCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PatroniCluster {self.scope} leader={self.leader!r} replica={self.replica!r}>"

    # -- starting ------------------------------------------------------------------------

    def _add_node(self, name: str, run_as: tuple[int, int] | None, timeout: float) -> PatroniNode:
        """Write a node's configuration and start its Patroni; returns once its REST API
        answers (its PostgreSQL may still be on its way)."""
        workdir = self.workdir / name
        workdir.mkdir()
        if run_as is not None:
            _check_traversable(workdir, *run_as)
            os.chown(workdir, *run_as)
        pg_port = free_port()
        proxy = TcpProxy("127.0.0.1", pg_port).start()
        sock_dir, short = _socket_dir(workdir, ".s.PGSQL.65535")
        if short is not None and run_as is not None:
            os.chown(short, *run_as)
        patroni = _patroni_binary()
        etcd_port = self.etcd.port

        def make(api_port: int) -> ServerProcess:
            config = _node_config(
                scope=self.scope, name=name, workdir=workdir, api_port=api_port,
                pg_port=pg_port, connect_port=proxy.port, etcd_port=etcd_port,
                sock_dir=sock_dir,
            )
            path = workdir / "patroni.yml"
            path.write_text(json.dumps(config, indent=2))  # JSON is YAML
            log_path = workdir / "patroni.log"
            log_path.touch()
            if run_as is not None:
                os.chown(path, *run_as)
                os.chown(log_path, *run_as)
            return ServerProcess(
                kind="patroni",
                url=f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/postgres",
                port=api_port,
                workdir=workdir,
                argv=[patroni, str(path)],
                log_path=log_path,
                stop_signal=signal.SIGTERM,
                probe=_probe_patroni,
                run_as=run_as,
                cleanup=[short] if short is not None else [],
            )

        try:
            process = _start_with_port_retry(make, None, timeout)
        except BaseException:
            proxy.close()
            raise
        node = PatroniNode(name, workdir, pg_port, proxy, process)
        self.nodes.append(node)
        return node

    def _wait_role(self, node: PatroniNode, role: str, timeout: float) -> None:
        """Wait until Patroni reports ``node`` running as ``role`` (``leader``: it holds the
        key and PostgreSQL takes writes; ``replica``: a running standby)."""
        seen: list[Any] = [None]

        def check() -> bool:
            if not node.process.is_running():
                raise ServerStartError(
                    f"Patroni {node.name} exited; log {node.process.log_path}:\n"
                    f"{_log_tail(node.process.log_path)}"
                )
            seen[0] = node.status()
            if role == "leader":
                return node.holds_leader_key() and node.in_recovery() is False
            status = seen[0]
            return bool(status.get("role") == "replica" and status.get("state") == "running")

        try:
            _wait(check, timeout, lambda: f"{node.name} a {role} (status {seen[0]!r})", _POLL)
        except TimeoutError as error:
            raise ServerStartError(
                f"{error}; log {node.process.log_path}:\n{_log_tail(node.process.log_path)}"
            ) from error


def _log_tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_bytes()[-limit:].decode("utf-8", "replace")
    except OSError as error:
        return f"<log unreadable: {error}>"


def _node_config(
    *,
    scope: str,
    name: str,
    workdir: Path,
    api_port: int,
    pg_port: int,
    connect_port: int,
    etcd_port: int,
    sock_dir: Path,
) -> dict[str, Any]:
    """One node's Patroni configuration. The same durability shortcuts as every private server
    here (``fsync`` off: commits survive SIGKILL, not a machine crash), small buffers, and the
    cluster-wide settings (``bootstrap.dcs``) that only the first node writes to etcd."""
    return {
        "scope": scope,
        "namespace": "/tickets-tests/",
        "name": name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{api_port}",
            "connect_address": f"127.0.0.1:{api_port}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL,
                "loop_wait": LOOP_WAIT,
                "retry_timeout": RETRY_TIMEOUT,
                "maximum_lag_on_failover": MAXIMUM_LAG_ON_FAILOVER,
                "postgresql": {
                    "use_pg_rewind": False,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "max_connections": 100,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{pg_port}",
            # Replicas stream from the leader through its proxy (hold_replication).
            "connect_address": f"127.0.0.1:{connect_port}",
            "data_dir": str(workdir / "data"),
            "bin_dir": str(_postgresql_bindir()),
            "pgpass": str(workdir / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "replicator", "password": "replicator"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication replicator 127.0.0.1/32 trust",
            ],
            "parameters": {
                "unix_socket_directories": str(sock_dir),
                "fsync": "off",
                "full_page_writes": "off",
                "shared_buffers": "32MB",
                # A standby whose primary is gone retries it this often, and PostgreSQL 15
                # acted on Patroni's promote request only at the end of that wait: with the
                # default (5 s) a failover took 9.5 to 16.6 s (TTL 10), with 1 s 9.5 to 10.5 s.
                "wal_retrieve_retry_interval": "1s",
            },
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def _start_etcd(workdir: Path, timeout: float) -> ServerProcess:
    """A single-member etcd on two free loopback ports (clients, peers), data in ``workdir``."""
    workdir.mkdir()
    etcd = _etcd_binary()

    def make(client_port: int) -> ServerProcess:
        # A new member each attempt: nothing of one that could not bind its ports is kept.
        shutil.rmtree(workdir / "data", ignore_errors=True)
        peer = f"http://127.0.0.1:{free_port()}"
        client = f"http://127.0.0.1:{client_port}"
        argv = [
            etcd,
            "--name=tickets",
            f"--data-dir={workdir / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=tickets={peer}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token=tickets-{secrets.token_hex(4)}",
        ]
        return ServerProcess(
            kind="etcd",
            url=client,
            port=client_port,
            workdir=workdir,
            argv=argv,
            log_path=workdir / "etcd.log",
            stop_signal=signal.SIGTERM,
            probe=_probe_etcd,
            run_as=None,
        )

    return _start_with_port_retry(make, None, timeout)


def start_patroni_cluster(workdir: Path | str, *, timeout: float = START_TIMEOUT) -> PatroniCluster:
    """Start etcd and two Patroni nodes in ``workdir``: the first bootstraps and leads, the
    second joins as a streaming replica. Returns once the replica streams and has replayed
    everything. ``workdir`` must be reachable by the ``postgres`` OS user when running as
    root (e.g. from ``tempfile.mkdtemp()``, made 0755)."""
    workdir = Path(workdir).resolve()
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    run_as: tuple[int, int] | None = None
    if os.geteuid() == 0:
        pw = pwd.getpwnam(os.environ.get("TICKETS_PG_OS_USER", "postgres"))
        run_as = (pw.pw_uid, pw.pw_gid)
    etcd = _start_etcd(workdir / "etcd", left())
    cluster = PatroniCluster(workdir, etcd, f"tickets-{secrets.token_hex(4)}")
    try:
        first = cluster._add_node("pg0", run_as, left())
        cluster._wait_role(first, "leader", left())
        second = cluster._add_node("pg1", run_as, left())
        cluster._wait_role(second, "replica", left())
        cluster.leader, cluster.replica = first, second
        cluster.wait_streaming(left())
        cluster.wait_caught_up(left())
        return cluster
    except BaseException:
        cluster.close()
        raise


@atexit.register
def _kill_leftover_clusters() -> None:
    """Safety net: no postmaster of a cluster outlives the test process (the Patroni and etcd
    processes are ``support.servers``' to kill)."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for cluster in leftovers:
        try:
            cluster.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


@pytest.fixture
def patroni_cluster() -> Iterator[PatroniCluster]:
    """A fresh Patroni cluster (etcd, a leader and a replica) for one test, killed and removed
    afterwards. Missing packages skip, or fail under ``TICKETS_TEST_REQUIRE_ALL=1`` / ``CI``.
    Import this fixture into a test module (``from support.patroni import patroni_cluster``)."""
    reason = patroni_unavailable_reason()
    if reason is not None:
        unavailable(f"Patroni unavailable: {reason}")
    # Not tmp_path: PostgreSQL runs as the postgres OS user, which cannot enter pytest's 0700
    # base directory when the suite runs as root.
    workdir = Path(tempfile.mkdtemp(prefix="tickets-patroni-"))
    try:
        workdir.chmod(0o755)
        try:
            cluster = start_patroni_cluster(workdir)
        except Exception as error:
            unavailable(f"cannot start a Patroni cluster: {error}")
        with cluster:
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
