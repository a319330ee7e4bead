"""Bound every ticket round trip in time, whatever the driver offers.

psycopg has no client-side read timeout, and keepalives do not fire while something in between
still acknowledges TCP. One daemon thread per process watches armed round trips; when one outlives
its deadline it shuts the connection's socket down, so the blocked driver call fails at once with
a connection error and the source discards that connection.

Arming and disarming are two dict operations under a lock: the thread scans on its own tick
instead of being woken per call, which keeps the cost off the id-allocation path.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time

from . import _process

logger = logging.getLogger("sqlalchemy_tickets")


class Watchdog:
    """Shuts down sockets whose round trip outlived its deadline."""

    def __init__(self, tick: float = 0.05) -> None:
        self._tick = tick
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, timeout: float) -> int:
        """Start watching ``fd``; returns the token that :meth:`disarm` takes."""
        token = next(self._tokens)
        deadline = time.monotonic() + timeout
        with self._lock:
            self._armed[token] = (deadline, fd)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sqlalchemy-tickets-watchdog", daemon=True
                )
                self._thread.start()
        return token

    def disarm(self, token: int) -> bool:
        """Stop watching; ``False`` if the deadline had already passed and the socket was cut."""
        with self._lock:
            return self._armed.pop(token, None) is not None

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            now = time.monotonic()
            with self._lock:
                expired = [(t, fd) for t, (deadline, fd) in self._armed.items() if deadline <= now]
                for token, _ in expired:
                    del self._armed[token]
            for _, fd in expired:
                _shutdown(fd)


def _shutdown(fd: int) -> None:
    try:
        # A duplicate descriptor: shutdown() acts on the shared socket, and closing the
        # duplicate leaves the driver's own descriptor for the driver to close.
        sock = socket.socket(fileno=socket.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
        logger.warning("ticket server did not answer in time; connection cut (fd %d)", fd)
    except OSError:
        pass
    finally:
        sock.close()


watchdog = Watchdog()


def _after_fork_in_child() -> None:
    # The watching thread did not survive the fork; the next arm() starts a new one.
    watchdog._lock = threading.Lock()
    watchdog._armed = {}
    watchdog._thread = None


_process.after_fork_in_child(_after_fork_in_child)
