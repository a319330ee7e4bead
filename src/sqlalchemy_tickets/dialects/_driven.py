"""An asyncio driver used synchronously: the library's own connections where no synchronous
driver of the database is installed (an application on ``asyncpg`` or ``asyncmy`` alone).

SQLAlchemy's asyncio dialects adapt their driver to the DBAPI through greenlet: each call of the
adapted connection or cursor runs ``await_()``, which hands the driver's coroutine to the
enclosing ``greenlet_spawn()`` on an event loop. Here each such call runs in ``greenlet_spawn()``
on one event loop of the library's own, on a daemon thread, while the calling thread waits for
its result. The connections are then synchronous DBAPI connections, usable from any thread, one
at a time, as the library's pools use them -- from a thread that runs an event loop too,
which the call blocks as a synchronous driver's call would.

The engine gets a subclass of the asyncio dialect that says it is not asynchronous (so
SQLAlchemy gives it a thread-safe ``QueuePool``), wraps the adapted DBAPI module, and runs the
dialect's own on-connect work on the loop. Everything else -- compiling, result handling, the
driver's error classes -- is the asyncio dialect's own. The library's watchdog bounds the round
trips by shutting down the connection's socket, as for any driver; the driver's coroutine on
the loop then fails like any lost connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sqlalchemy.dialects import registry
from sqlalchemy.engine import URL

from .. import _process

__all__ = ["CONNECT_TIMEOUT", "driven_url"]

R = TypeVar("R")

#: The connect argument that bounds a driven connect as a whole (TCP connect and handshake):
#: taken out before the driver sees the arguments.
CONNECT_TIMEOUT = "sqlalchemy_tickets_connect_timeout"

#: Calls that may run where they cannot wait (a pool record finalized by the garbage collector
#: on the loop's own thread): scheduled there instead, their result not awaited.
_FIRE_AND_FORGET = frozenset({"close", "terminate"})


class _Loop:
    """The event loop where every driven connection lives, on a daemon thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Loops a forked child inherited: never closed there (closing would unregister the
        # parent's descriptors from the epoll set both processes share), only kept.
        self._inherited: list[asyncio.AbstractEventLoop] = []

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._run,
                    args=(loop, ready),
                    name="sqlalchemy-tickets-asyncio",
                    daemon=True,
                )
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    def on_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def call(
        self, fn: Callable[..., R], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> R:
        """``fn(*args, **kwargs)`` in ``greenlet_spawn()`` on the loop, waited for here
        (``timeout``: at most this long, then :class:`TimeoutError`, the call cancelled)."""
        from sqlalchemy.util.concurrency import greenlet_spawn

        loop = self._running()
        if self.on_loop_thread():
            raise RuntimeError("a driven connection was called from its own event loop")
        spawned = greenlet_spawn(fn, *args, **kwargs)
        work = spawned if timeout is None else asyncio.wait_for(spawned, timeout)
        future: Future[R] = asyncio.run_coroutine_threadsafe(work, loop)
        return future.result()

    def schedule(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` in ``greenlet_spawn()`` on the loop, soon, not waited for."""
        from sqlalchemy.util.concurrency import greenlet_spawn

        loop = self._running()
        task = loop.create_task(greenlet_spawn(fn, *args))
        # A failed close has nobody to tell: retrieving the error keeps asyncio quiet.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    def _after_fork_in_child(self) -> None:
        if self._loop is not None:
            self._inherited.append(self._loop)
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None


_loop = _Loop()
_process.after_fork_in_child(_loop._after_fork_in_child)


class _Driven:
    """A synchronous stand-in for an adapted DBAPI object: its methods, and the setting of its
    attributes (an adapter's ``autocommit`` setter may await), run on the loop; reading an
    attribute reads the adapted object's."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value) or isinstance(value, type):  # error classes stay classes
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in _FIRE_AND_FORGET and _loop.on_loop_thread():
                _loop.schedule(lambda: value(*args, **kwargs))
                return None
            return _loop.call(value, *args, **kwargs)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        _loop.call(setattr, self._target, name, value)

    def __repr__(self) -> str:
        return f"<driven {self._target!r}>"


class DrivenCursor(_Driven):
    __slots__ = ()

    def __iter__(self) -> Any:
        return iter(self.fetchall())


class DrivenConnection(_Driven):
    __slots__ = ()

    def cursor(self, *args: Any, **kwargs: Any) -> DrivenCursor:
        return DrivenCursor(_loop.call(self._target.cursor, *args, **kwargs))


class DrivenModule(_Driven):
    """The adapted DBAPI module of an asyncio dialect, whose ``connect()`` is synchronous."""

    __slots__ = ()

    def connect(self, *args: Any, **kwargs: Any) -> DrivenConnection:
        timeout = kwargs.pop(CONNECT_TIMEOUT, None)
        try:
            made = _loop.call(self._target.connect, *args, timeout=timeout, **kwargs)
        except asyncio.TimeoutError as error:  # not builtins.TimeoutError before Python 3.11
            # The driver's connection error, so the pool and the callers see a refused connect.
            raise self._target.OperationalError(
                f"no connection within {timeout:g} s"
            ) from error
        return DrivenConnection(made)


def adapted(connection: Any) -> Any:
    """The adapted DBAPI connection behind a driven one (itself if it is not driven)."""
    return connection._target if isinstance(connection, _Driven) else connection


def _driven_dialect(async_dialect: type[Any]) -> type[Any]:
    """A synchronous dialect running ``async_dialect``'s adapted DBAPI on the loop."""

    class Driven(async_dialect):  # type: ignore[misc]
        is_async = False
        # Its own attribute, or SQLAlchemy turns statement caching off for a subclass.
        supports_statement_cache = async_dialect.supports_statement_cache

        @classmethod
        def import_dbapi(cls) -> Any:
            return DrivenModule(super().import_dbapi())

        @classmethod
        def get_pool_class(cls, url: URL) -> Any:
            from sqlalchemy.pool import QueuePool

            return QueuePool

        def on_connect(self) -> Any:
            setup = super().on_connect()
            if setup is None:
                return None

            def connect(connection: Any) -> None:
                _loop.call(setup, adapted(connection))

            return connect

        def get_driver_connection(self, connection: Any) -> Any:
            return super().get_driver_connection(adapted(connection))

    Driven.__name__ = Driven.__qualname__ = f"Driven_{async_dialect.__name__}"
    return Driven


_registered: dict[str, str] = {}
_registered_lock = threading.Lock()


def driven_url(url: URL) -> URL:
    """``url`` (on an asyncio driver) on the driven dialect of that driver, registered with
    SQLAlchemy on first use under the driver name ``tickets_driven_<driver>``."""
    backend, driver = url.get_backend_name(), url.get_driver_name()
    name = f"tickets_driven_{driver}"
    key = f"{backend}.{name}"
    with _registered_lock:
        if key not in _registered:
            attribute = f"_dialect_{backend}_{driver}"
            globals()[attribute] = _driven_dialect(url.get_dialect())
            registry.register(key, __name__, attribute)
            _registered[key] = attribute
    return url.set(drivername=f"{backend}+{name}")
