"""A real 3-server ZooKeeper ensemble on loopback, from Debian's ``zookeeper`` package.

Each member is ``java -Xmx128m … org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg``
with its own data directory, client port and quorum ports (chosen free) in a temp directory.
Faults are real: :meth:`Ensemble.kill` (SIGKILL), :meth:`Ensemble.pause` / :meth:`resume`
(SIGSTOP / SIGCONT), :meth:`Ensemble.start` again; :meth:`Ensemble.leader` asks each member
(``srvr``) which one leads. :meth:`Ensemble.copy_data` / :meth:`restore_data` save and put back
every member's data directory (an ensemble restored from an older snapshot).

The jar is ``$TICKETS_ZOOKEEPER_JAR``, else ``/usr/share/java/zookeeper.jar`` (Debian: ``apt-get
install zookeeper``; ``make test`` installs it). Without it (or without ``java``), the
``zookeeper_ensemble`` fixture skips on a developer machine and fails under
``TICKETS_TEST_REQUIRE_ALL=1`` or ``CI`` -- the same rule as the database backends.

Small timings (``tickTime`` 200 ms, ``syncLimit`` 5 ticks) keep elections and the detection of
a stalled leader around a second, so fault tests stay short.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Ensemble", "Member", "zookeeper_unavailable_reason", "start_ensemble"]

TICK_MS = 200
JAR_CANDIDATES = ("/usr/share/java/zookeeper.jar",)
CONF_DIR = "/etc/zookeeper/conf"  # log4j/logback settings of Debian's package (optional)


def _jar() -> str | None:
    override = os.environ.get("TICKETS_ZOOKEEPER_JAR")
    if override:
        return override if Path(override).is_file() else None
    return next((j for j in JAR_CANDIDATES if Path(j).is_file()), None)


def zookeeper_unavailable_reason() -> str | None:
    """Why the ensemble cannot start here (``None``: it can)."""
    if _jar() is None:
        return ("ZooKeeper is not installed (Debian: apt-get install zookeeper, or set "
                "TICKETS_ZOOKEEPER_JAR); `make test` installs it")
    if shutil.which("java") is None:
        return "java is not on PATH (Debian's zookeeper package brings a JRE)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def four_letter(port: int, word: str = "srvr", timeout: float = 1.0) -> str:
    """A four-letter-word command's answer ('' when the member does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class Member:
    """One server of the ensemble."""

    def __init__(self, myid: int, workdir: Path, client_port: int) -> None:
        self.myid = myid
        self.dir = workdir / f"zk{myid}"
        self.data = self.dir / "data"
        self.client_port = client_port
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def write_config(self, servers: str) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        (self.data / "myid").write_text(f"{self.myid}\n")
        (self.dir / "zoo.cfg").write_text(
            f"tickTime={TICK_MS}\ninitLimit=25\nsyncLimit=5\n"
            f"dataDir={self.data}\nclientPort={self.client_port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=srvr,ruok,stat,mntr,dump,cons\n"
            f"minSessionTimeout={2 * TICK_MS}\nmaxSessionTimeout=60000\n"
            "preAllocSize=1024\nsnapCount=1000\nautopurge.snapRetainCount=3\n"
            "electionPortBindRetry=10\n" + servers
        )

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        jar = _jar()
        assert jar is not None
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the child holds it
        classpath = f"{jar}:{CONF_DIR}" if Path(CONF_DIR).is_dir() else jar
        self.process = subprocess.Popen(
            ["java", "-Xmx128m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", classpath,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.dir / "zoo.cfg")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.paused = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.paused:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(30)
        self.paused = False

    def mode(self) -> str | None:
        """``leader``, ``follower``, ``standalone`` or ``None`` (not serving)."""
        if not self.running or self.paused:
            return None
        for line in four_letter(self.client_port).splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class Ensemble:
    """Three :class:`Member` s on loopback."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        ports = _free_ports(3 * size)
        self.members = [Member(i + 1, workdir, ports[3 * i]) for i in range(size)]
        servers = "".join(
            f"server.{i + 1}=127.0.0.1:{ports[3 * i + 1]}:{ports[3 * i + 2]}\n"
            for i in range(size)
        )
        for member in self.members:
            member.write_config(servers)

    @property
    def hosts(self) -> str:
        """kazoo's form: ``127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        return ",".join(m.address for m in self.members)

    def url(self, path: str) -> str:
        return f"zookeeper://{self.hosts}{path}"

    def start(self, *which: int) -> None:
        """Start the members ``which`` (indexes; default: every stopped one)."""
        for i in which or range(len(self.members)):
            if not self.members[i].running:
                self.members[i].start()

    def kill(self, i: int) -> None:
        self.members[i].kill()

    def pause(self, i: int) -> None:
        self.members[i].signal(signal.SIGSTOP)
        self.members[i].paused = True

    def resume(self, i: int) -> None:
        self.members[i].signal(signal.SIGCONT)
        self.members[i].paused = False

    def stop_all(self) -> None:
        for member in self.members:
            member.kill()

    def modes(self) -> list[str | None]:
        return [m.mode() for m in self.members]

    def leader(self, timeout: float = 60) -> int:
        """The index of the member that leads (waits for one)."""
        deadline = time.monotonic() + timeout
        while True:
            modes = self.modes()
            if "leader" in modes:
                return modes.index("leader")
            if time.monotonic() > deadline:
                raise AssertionError(f"no ZooKeeper leader within {timeout} s: {modes}")
            time.sleep(0.1)

    def wait_serving(self, *which: int, timeout: float = 90) -> None:
        """Wait until the members ``which`` (default: every running one) serve, with a
        leader among them."""
        deadline = time.monotonic() + timeout
        while True:
            idx = which or [i for i, m in enumerate(self.members) if m.running]
            modes = [self.members[i].mode() for i in idx]
            if all(m in ("leader", "follower") for m in modes) and (
                "leader" in self.modes()
            ):
                return
            if time.monotonic() > deadline:
                logs = {m.myid: (m.dir / "server.log").read_text(errors="replace")[-2000:]
                        for m in self.members}
                raise AssertionError(f"ZooKeeper members {idx} not serving within {timeout} "
                                     f"s: {self.modes()}\n{logs}")
            time.sleep(0.1)

    def healthy(self) -> None:
        """Every member running, unpaused and serving (after a test's faults)."""
        for i, member in enumerate(self.members):
            if member.paused:
                self.resume(i)
        self.start()
        self.wait_serving()

    def copy_data(self, into: Path) -> None:
        """Copy every member's data directory (the ensemble should be stopped)."""
        for member in self.members:
            shutil.copytree(member.data, into / member.data.parent.name, dirs_exist_ok=False)

    def restore_data(self, source: Path) -> None:
        """Put back the data directories :meth:`copy_data` saved (the ensemble stopped)."""
        for member in self.members:
            assert not member.running
            shutil.rmtree(member.data)
            shutil.copytree(source / member.data.parent.name, member.data)

    def close(self) -> None:
        for member in self.members:
            member.kill()


def start_ensemble(workdir: Path | None = None) -> Ensemble:
    """Start a 3-member ensemble and wait until it serves."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="tickets-zk-"))
    for attempt in range(3):
        ensemble = Ensemble(workdir / f"try{attempt}")
        ensemble.start()
        try:
            ensemble.wait_serving(timeout=90)
            return ensemble
        except AssertionError:
            ensemble.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def synced_reader(hosts: str) -> Any:
    """A started plain kazoo client whose reads see every write made before them: ZooKeeper's
    reads are served by whichever server the session is on, and a follower may answer before
    it applied the latest writes (``sync`` first: what a test asserting on the ensemble's
    state after a write needs)."""
    from kazoo.client import KazooClient

    class SyncedReader(KazooClient):  # type: ignore[misc]
        def get(self, path: str, *args: Any, **kwargs: Any) -> Any:
            self.sync(path)
            return super().get(path, *args, **kwargs)

        def get_children(self, path: str, *args: Any, **kwargs: Any) -> Any:
            self.sync(path)
            return super().get_children(path, *args, **kwargs)

        def exists(self, path: str, *args: Any, **kwargs: Any) -> Any:
            self.sync(path)
            return super().exists(path, *args, **kwargs)

    client = SyncedReader(hosts=hosts, timeout=10)
    client.start(30)
    return client
