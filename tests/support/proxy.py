"""A real TCP proxy that injects network faults between a database client and its server.

Ticket-server code must cope with a server that is down, hung, or that dies after executing
a statement but before its reply arrives (the "did my increment happen?" ambiguity). Mocks
cannot reproduce how drivers and connection pools see those failures, so tests route real
driver connections through :class:`TcpProxy` and flip its mode while the test runs.

Design: one acceptor thread per listening socket (woken for shutdown through a socketpair, as
closing a socket does not reliably wake a thread blocked on it), and per proxied connection
two pump threads with blocking sockets, one per direction. Connections are torn down with
``shutdown()`` -- which wakes a thread blocked in ``recv``/``send`` -- and the file
descriptors are closed only once both pumps have exited, so no descriptor can be reused under
a running thread. All shared state is guarded by one lock; its condition variable is what
"hung" pumps wait on.
"""

from __future__ import annotations

import enum
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from sqlalchemy.engine import make_url

__all__ = ["TcpProxy"]

_CHUNK = 65536
#: Upper bound for connecting to the target; the target is on loopback, so this only matters
#: if it is itself wedged.
_UPSTREAM_CONNECT_TIMEOUT = 10.0
#: How long close() waits for worker threads in total.
_JOIN_TIMEOUT = 5.0
#: How long re-listening waits for the old port to become bindable again.
_REBIND_TIMEOUT = 5.0


class _Mode(enum.Enum):
    FORWARD = "forward"
    REFUSE = "refuse"
    HANG = "hang"


class _Connection:
    """One proxied client connection and its upstream socket.

    All fields are guarded by the owning proxy's lock.
    """

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        #: Threads (serve/c->s pump, s->c pump) still using the sockets; the last one to
        #: leave closes them.
        self.refs = 1
        self.closed = False
        #: Set once the armed marker went to the server: drop the next reply, then close.
        self.swallow_next_reply = False
        #: Tail of the client->server stream, so a marker split across reads still matches.
        self.c2s_tail = b""

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class _Acceptor:
    """A listening socket plus the thread accepting on it and a way to stop that thread."""

    def __init__(self, listener: socket.socket, proxy: TcpProxy) -> None:
        self.listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(
            target=self._run,
            args=(proxy,),
            name=f"TcpProxy-accept-{listener.getsockname()[1]}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, proxy: TcpProxy) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        client, _addr = self.listener.accept()
                    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                        continue  # the peer gave up between select() and accept()
                    except OSError:
                        return  # listener closed under us: we are being stopped
                    proxy._on_accept(client)

    def stop(self, timeout: float) -> None:
        """Stop accepting, wait for the thread, and close the listening socket."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout)
        for sock in (self.listener, self._wake_r, self._wake_w):
            sock.close()


class TcpProxy:
    """Forward TCP connections to ``target_host:target_port``, with switchable faults.

    Modes (switching affects new *and* existing connections):

    * :meth:`forward` -- pass bytes both ways.
    * :meth:`refuse` -- "server down": existing client connections are closed and the port
      stops listening, so connects fail with ECONNREFUSED. :meth:`forward` listens again on
      the same port.
    * :meth:`hang` -- "server hung": connections are still accepted but nothing moves in
      either direction and nothing is closed. Bytes already read stay buffered and are
      delivered if the proxy goes back to :meth:`forward`; further bytes stay unread in the
      kernel. A chunk already past the gate when ``hang()`` is called may still be delivered.

    :meth:`swallow_reply_after` arms a one-shot fault that drops a server reply;
    :meth:`drop_new_connections` closes the next new connections during their handshake.
    """

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1"):
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._mode = _Mode.FORWARD
        self._port: int | None = None
        self._acceptor: _Acceptor | None = None
        self._conns: set[_Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._marker: bytes | None = None
        self._then_hang = False
        self._faults_fired = 0
        self._drop_new = 0
        self._connections_accepted = 0
        self._closed = False

    # -- public API ----------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (stable across refuse()/forward())."""
        with self._lock:
            if self._port is None:
                raise RuntimeError("proxy not started")
            return self._port

    @property
    def faults_fired(self) -> int:
        """How many replies :meth:`swallow_reply_after` and :meth:`drop_new_connections`
        have dropped."""
        with self._lock:
            return self._faults_fired

    @property
    def connections_accepted(self) -> int:
        """Client connections accepted so far (those rejected while refusing not counted)."""
        with self._lock:
            return self._connections_accepted

    @property
    def active_connections(self) -> int:
        """Client connections currently open through the proxy."""
        with self._lock:
            return sum(1 for c in self._conns if not c.closed)

    @property
    def mode(self) -> str:
        """Current mode: ``"forward"``, ``"refuse"`` or ``"hang"``."""
        with self._lock:
            return self._mode.value

    def url(self, base_url: str) -> str:
        """Return ``base_url`` with host and port pointing at this proxy."""
        return (
            make_url(base_url)
            .set(host=self.listen_host, port=self.port)
            .render_as_string(hide_password=False)
        )

    def start(self) -> TcpProxy:
        """Listen on an ephemeral port and start forwarding."""
        with self._lock:
            if self._closed:
                raise RuntimeError("proxy is closed")
            if self._port is not None:
                raise RuntimeError("proxy already started")
            self._acceptor = _Acceptor(self._listen(0), self)
            self._port = self._acceptor.listener.getsockname()[1]
        return self

    def forward(self) -> None:
        """Normal operation; re-listens on the same port after :meth:`refuse`."""
        self._set_mode(_Mode.FORWARD)

    def hang(self) -> None:
        """Accept connections but move no bytes and close nothing, like a wedged server."""
        self._set_mode(_Mode.HANG)

    def refuse(self) -> None:
        """Close every client connection and stop listening, like a server that went down."""
        with self._lock:
            self._require_running()
            self._mode = _Mode.REFUSE
            self._cond.notify_all()
            acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.stop(_JOIN_TIMEOUT)
        with self._lock:
            for conn in list(self._conns):
                self._abort_locked(conn)

    def swallow_reply_after(self, marker: bytes, *, then_hang: bool = False) -> None:
        """Arm a one-shot fault keyed on ``marker`` in the client->server stream.

        Once bytes containing ``marker`` have been forwarded to the server, the next bytes
        the server sends on that connection are dropped and both sides of the connection are
        closed: the statement ran, but the client never learns its outcome. ``then_hang``:
        the proxy hangs from that moment (:meth:`hang`), so the client cannot come back
        until :meth:`forward` (a ZooKeeper session then expires with its write in flight).
        """
        if not marker:
            raise ValueError("marker must be non-empty")
        with self._lock:
            self._marker = bytes(marker)
            self._then_hang = then_hang
            for conn in self._conns:
                conn.c2s_tail = b""

    def drop_new_connections(self, count: int) -> None:
        """Close each of the next ``count`` accepted connections at the server's first bytes
        (dropped): a connection the server accepted and then closed during its handshake, as
        a kill, a reaper or a pooler's restart does."""
        with self._lock:
            self._drop_new = count

    def close(self) -> None:
        """Stop all threads and close every socket; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.stop(_JOIN_TIMEOUT)
        with self._lock:
            for conn in list(self._conns):
                self._abort_locked(conn)
            threads = list(self._threads)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        with self._lock:  # threads that did not finish in time must not keep descriptors
            for conn in list(self._conns):
                for sock in conn.sockets():
                    sock.close()
            self._conns.clear()

    def __enter__(self) -> TcpProxy:
        if self._port is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<TcpProxy {self.listen_host}:{self._port} -> "
            f"{self.target_host}:{self.target_port} {self._mode.value}>"
        )

    # -- internals -----------------------------------------------------------------------

    def _require_running(self) -> None:
        if self._closed:
            raise RuntimeError("proxy is closed")
        if self._port is None:
            raise RuntimeError("proxy not started")

    def _set_mode(self, mode: _Mode) -> None:
        """Switch to a listening mode, re-opening the listener if :meth:`refuse` closed it."""
        with self._lock:
            self._require_running()
            self._mode = mode
            self._cond.notify_all()
            if self._acceptor is None:
                assert self._port is not None
                self._acceptor = _Acceptor(self._listen(self._port), self)

    def _listen(self, port: int) -> socket.socket:
        """Bind and listen; for a fixed port, retry briefly while the old one is released."""
        family = socket.AF_INET6 if ":" in self.listen_host else socket.AF_INET
        deadline = time.monotonic() + _REBIND_TIMEOUT
        while True:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.listen_host, port))
                sock.listen(128)
            except OSError as exc:
                sock.close()
                if port == 0 or exc.errno != errno.EADDRINUSE:
                    raise
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"cannot listen on {self.listen_host}:{port} again: taken by another "
                        "socket while the proxy was refusing"
                    ) from exc
                self._cond.wait(0.05)  # poll with a deadline; releases the lock meanwhile
                continue
            sock.setblocking(False)  # the acceptor only accept()s after select() said so
            return sock

    def _spawn_locked(
        self, target: Callable[[_Connection], None], conn: _Connection, name: str
    ) -> threading.Thread:
        """Start a tracked worker thread, so close() can join it.

        Started under the lock: close() snapshots the threads under it, and joining one not
        yet started raises. start() returns once the thread runs, before it needs the lock.
        """
        thread = threading.Thread(target=target, args=(conn,), name=name, daemon=True)
        self._threads.add(thread)
        thread.start()
        return thread

    def _on_accept(self, client: socket.socket) -> None:
        """Register a freshly accepted client and start serving it (acceptor thread)."""
        client.setblocking(True)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed or self._mode is _Mode.REFUSE:
                client.close()
                return
            self._connections_accepted += 1
            conn = _Connection(client)
            if self._drop_new > 0:
                self._drop_new -= 1
                conn.swallow_next_reply = True
            self._conns.add(conn)
            self._spawn_locked(self._serve, conn, f"TcpProxy-c2s-{self._port}")

    def _wait_not_hung_locked(self, conn: _Connection) -> bool:
        """Block while the proxy hangs; False if the connection or proxy went away."""
        while self._mode is _Mode.HANG and not conn.closed and not self._closed:
            self._cond.wait()
        return not conn.closed and not self._closed

    def _serve(self, conn: _Connection) -> None:
        """Connect upstream (once not hung), then pump client->server in this thread."""
        try:
            with self._lock:
                if not self._wait_not_hung_locked(conn):
                    return
            try:
                upstream = socket.create_connection(
                    (self.target_host, self.target_port), timeout=_UPSTREAM_CONNECT_TIMEOUT
                )
            except OSError:
                return  # target down: the client sees its connection closed
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if conn.closed or self._closed:
                    upstream.close()
                    return
                conn.upstream = upstream
                conn.refs += 1
                self._spawn_locked(self._pump_s2c, conn, f"TcpProxy-s2c-{self._port}")
            self._pump(conn, conn.client, upstream, client_to_server=True)
        finally:
            self._release(conn)

    def _pump_s2c(self, conn: _Connection) -> None:
        try:
            assert conn.upstream is not None
            self._pump(conn, conn.upstream, conn.client, client_to_server=False)
        finally:
            self._release(conn)

    def _pump(
        self,
        conn: _Connection,
        src: socket.socket,
        dst: socket.socket,
        *,
        client_to_server: bool,
    ) -> None:
        """Copy ``src`` to ``dst`` until EOF, error, fault or abort; then abort the pair.

        EOF is treated like data: while hung it is held back, so a server closing an idle
        connection does not make the hung proxy close the client.
        """
        try:
            while True:
                data = src.recv(_CHUNK)
                with self._lock:
                    if not client_to_server and conn.swallow_next_reply and data:
                        # Before the hang gate: a reply armed to be dropped is dropped even
                        # while hung (swallow_reply_after(..., then_hang=True)).
                        conn.swallow_next_reply = False
                        self._faults_fired += 1
                        return  # drop the reply; finally closes both sides
                    if not self._wait_not_hung_locked(conn) or not data:
                        return
                    if client_to_server:
                        self._scan_for_marker_locked(conn, data)
                dst.sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._abort_locked(conn)

    def _scan_for_marker_locked(self, conn: _Connection, data: bytes) -> None:
        """Arm the connection's reply swallow if the armed marker is in the outgoing stream.

        Called before the bytes are sent, so the flag is set before the server can answer.
        """
        marker = self._marker
        if marker is None:
            return
        window = conn.c2s_tail + data
        if marker in window:
            self._marker = None
            conn.swallow_next_reply = True
            if self._then_hang:
                self._mode = _Mode.HANG
            conn.c2s_tail = b""
        else:
            conn.c2s_tail = window[-(len(marker) - 1) :] if len(marker) > 1 else b""

    def _abort_locked(self, conn: _Connection) -> None:
        """Shut both sockets down (waking blocked pumps); descriptors stay open until released."""
        if conn.closed:
            return
        conn.closed = True
        self._cond.notify_all()
        for sock in conn.sockets():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected

    def _release(self, conn: _Connection) -> None:
        """Drop a thread's hold on ``conn``; the last holder closes the descriptors."""
        with self._lock:
            self._abort_locked(conn)
            conn.refs -= 1
            if conn.refs == 0:
                for sock in conn.sockets():
                    sock.close()
                self._conns.discard(conn)
            self._threads.discard(threading.current_thread())
