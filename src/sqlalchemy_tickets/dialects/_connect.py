"""The library's own connections: one place that opens them, and one bounded round trip.

Every database client of the library (ticket servers, the embedded default, worker leases, the
admin and command-line paths) reaches its database through an :class:`OwnEngine`:

* **Connected as the application connects.** Given the application's ``Engine``, new connections
  come from that engine's own connection factory (``pool._invoke_creator``): its URL,
  ``connect_args``, ``creator``, ``do_connect`` hooks (an IAM token, a rotated password, TLS
  files) and whatever plugins put there. The library adds its own settings on a *copy* of the
  connect arguments through one ``do_connect`` listener on the application's
  dialect, which does nothing at all for the application's own connections (see
  :func:`_inherit_listener`).
* **Apart from the application.** The connections live in a pool of their own, in autocommit:
  never inside a caller's transaction, never starved by a caller holding every connection of
  the application's pool. Pool size, ``echo``, isolation level, pool events (``connect``,
  ``checkout``) and execution options are therefore *not* inherited.
* **Fit for PgBouncer.** Nothing relies on session state between transactions; psycopg gets
  ``prepare_threshold=None`` unless the application asked for server-side prepared statements
  itself (per-backend settings: :meth:`TicketBackend.own_connect_params`).
* **Bounded.** The driver's connect timeout covers the connect; every unit of work after it
  (and the dialect's first-connect queries) is watched by :data:`watchdog`, which shuts the
  socket down when the unit outlives the timeout: psycopg has no client-side read timeout, and
  keepalives do not fire while something in between still acknowledges TCP.

:func:`~sqlalchemy_tickets.apply_timeouts` (``timeouts.py``) gives an *application's* engine the
same bound with the same :data:`watchdog` (and :func:`bounded_call` for psycopg's calls).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar, Union

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Dialect, Engine, make_url

from .. import _process
from .._naming import TicketTable, check_seconds
from ..errors import DatabaseUnavailable, TicketsError
from ._driven import CONNECT_TIMEOUT, driven_url
from ._registry import backend_for
from .base import ConnectParams, TicketBackend

if TYPE_CHECKING:
    # Annotations only: sqlalchemy.ext.asyncio needs greenlet (the asyncio extra).
    from sqlalchemy.ext.asyncio import AsyncEngine

#: What the library's database clients accept as their database.
Bind = Union[str, URL, Engine, "AsyncEngine"]

__all__ = [
    "ConnectParams",
    "OwnEngine",
    "StaleConnection",
    "Watchdog",
    "bounded_call",
    "create_under_lock",
    "watchdog",
]

logger = logging.getLogger("sqlalchemy_tickets")

R = TypeVar("R")

#: What the library keeps in a pooled connection's ``info`` (SQLAlchemy clears it when the
#: connection is invalidated or replaced): its cursor.
_CURSOR = "sqlalchemy_tickets.cursor"

#: Times one call meets a connection closed under it before the database counts as
#: unavailable (each time on a newer connection: one closed by a server that keeps accepting
#: new ones, as a reaper or an operator does, costs one attempt).
CLOSED_ATTEMPTS = 3

#: Times a statement that lost a write conflict (Galera certification, deadlock) runs again
#: within one round trip before its error reaches the caller.
CONFLICT_RETRIES = 50


#: SQLAlchemy 2.0.43 and newer can leave out the DBAPI ``rollback()`` of a connection in
#: autocommit at the end of each use (a round trip on MySQL drivers, for nothing).
_SKIPS_ROLLBACK = "skip_autocommit_rollback" in inspect.signature(
    sa.engine.default.DefaultDialect.__init__
).parameters


class StaleConnection(Exception):
    """A unit of work found its pooled connection closed under it (raised inside
    :meth:`OwnEngine.run`'s retries, never to the library's callers)."""


# -- the watchdog ----------------------------------------------------------------------------


class Watchdog:
    """Shuts down sockets whose round trip outlived its deadline.

    Arming and disarming are two dict operations under a lock: the thread scans on its own tick
    instead of being woken per call, which keeps the cost off the id-allocation path.
    """

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

    def _after_fork_in_child(self) -> None:
        # The watching thread did not survive the fork; the next arm() starts a new one.
        self._lock = threading.Lock()
        self._armed = {}
        self._thread = None


def _shutdown(fd: int) -> None:
    try:
        # A duplicate descriptor: shutdown() acts on the shared socket, and closing the
        # duplicate leaves the driver's own descriptor for the driver to close.
        sock = socket.socket(fileno=socket.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
        logger.warning("database did not answer in time; connection cut (fd %d)", fd)
    except OSError:
        pass
    finally:
        sock.close()


#: The process's one watchdog.
watchdog = Watchdog()

_process.after_fork_in_child(watchdog._after_fork_in_child)


def bounded_call(fd: int, seconds: float, call: Callable[[], R]) -> R:
    """``call()``, with the socket ``fd`` shut down if it takes longer than ``seconds``."""
    token = watchdog.arm(fd, seconds)
    try:
        return call()
    finally:
        watchdog.disarm(token)


# -- inheriting the application's way of connecting ----------------------------------------


class _Request:
    """One connection the library is asking the application's engine for."""

    __slots__ = ("params", "used")

    def __init__(self, params: ConnectParams) -> None:
        self.params = params
        self.used = False


_local = threading.local()
_listen_lock = threading.Lock()


def _inherit_listener(
    dialect: Dialect, record: Any, cargs: list[Any], cparams: dict[str, Any]
) -> Any:
    """``do_connect`` on the application's dialect: for the library's own connections only,
    the application's hooks run on a copy of the arguments with the library's settings.

    The application's own connections find no request and go on untouched (``None``). A copy,
    because before SQLAlchemy 2.1 the arguments are the engine's own dict, shared by every
    later connect. The hooks after this one run here, so hooks added later are honoured too.
    Hooks added before it run before it, on the arguments as they are (SQLAlchemy calls an
    engine's listeners in the order they were added, whatever ``insert=True`` asks); one of
    them that returns a connection makes it, and :meth:`OwnEngine._inherited_connection`
    settles that connection for the library.
    """
    request: _Request | None = getattr(_local, "request", None)
    if request is None:
        return None
    _local.request = None  # a hook connecting somewhere else is the application's business
    request.used = True
    args, params = list(cargs), dict(cparams)
    request.params.apply_defaults(params)
    listeners = list(dialect.dispatch.do_connect)
    mine = [i for i, fn in enumerate(listeners) if fn is _inherit_listener]
    for fn in listeners[mine[0] + 1 :] if mine else []:
        made = fn(dialect, record, args, params)
        if made is not None:
            return made
    request.params.apply_forced(params)
    return dialect.connect(*args, **params)


def _listen_for_inheritance(app_engine: Engine) -> None:
    with _listen_lock:
        if not event.contains(app_engine, "do_connect", _inherit_listener):
            event.listen(app_engine, "do_connect", _inherit_listener, insert=True)


# -- the library's own engine ----------------------------------------------------------------


class _Clock:
    """The watchdog's clock on one unit of work of an :class:`OwnEngine`'s connection."""

    def __init__(self, own: OwnEngine, dbapi_connection: Any, seconds: float | None = None) -> None:
        self._own = own
        self._dbapi_connection = dbapi_connection
        self._token = own.arm(dbapi_connection, seconds)
        #: Whether the unit overran and the connection was cut.
        self.cut = False

    def restart(self, *_: Any) -> None:
        """Give what follows the whole timeout again (a ``before_cursor_execute`` listener)."""
        if self.stop():
            self._token = self._own.arm(self._dbapi_connection)

    def stop(self) -> bool:
        """Stop the clock; ``False`` if the unit overran (now or before) and was cut."""
        token, self._token = self._token, None
        if not self._own.disarm(token):
            self.cut = True
        return not self.cut


def sync_bind(bind: Bind) -> Bind:
    """The URL of an asyncio driver (``mysql+aiomysql``, ``postgresql+asyncpg``,
    ``sqlite+aiosqlite``...) becomes the same database on its family's synchronous driver:
    the library's round trips run on threads, never on an event loop. Engines go as given."""
    if not isinstance(bind, (str, URL)):
        return bind
    url = to_url(bind)
    return backend_for(url.get_backend_name()).sync_url(url)


def engine_of(bind: object) -> Engine | None:
    """The ``Engine`` behind ``bind`` (an ``AsyncEngine``'s ``sync_engine``), or ``None`` for
    a URL."""
    if isinstance(bind, Engine):
        return bind
    sync = getattr(bind, "sync_engine", None)  # AsyncEngine, without importing asyncio support
    return sync if isinstance(sync, Engine) else None


def to_url(bind: str | URL) -> URL:
    """A URL from a string, or :class:`TicketsError` saying what a URL looks like."""
    try:
        return make_url(bind)
    except (sa_exc.ArgumentError, ValueError, TypeError) as error:
        raise TicketsError(
            f"invalid database URL {bind!r}: expected e.g. "
            "'postgresql+psycopg://user@host/db' or 'mysql+pymysql://user@host/db'"
        ) from error


class OwnEngine:
    """An autocommit engine of the library's own on one database, and its bounded round trip.

    Args:
        bind: a URL, or the application's ``Engine``, whose way of connecting is inherited
            (see the module docstring for what is and is not). An ``AsyncEngine``'s
            connections cannot be used synchronously: its URL is used, on a synchronous driver
            of the same database that is installed, else on its own asyncio driver driven
            synchronously (:meth:`TicketBackend.sync_url`); so is a URL of an asyncio driver,
            or of a driver whose round trips cannot be bounded.
        timeout: seconds a connect, or a unit of work, may take.
        pool_size: connections kept in the pool (``max_overflow``: twice as many more).
        what: how messages name this database (``"ticket server"``, ``"worker lease
            database"``).
        embedded: the ticket tables of an application's engine, where the embedded default
            keeps them (SQLite: a sibling file, reached from the URL alone).
        weakly: hold the application's ``Engine`` weakly (always so when ``embedded``): for
            an engine of the library's own kept per application engine, which must not keep
            that engine alive.
        unavailable: the error raised when the database refuses, drops or does not answer.

    The application's ``Engine`` is held strongly unless ``embedded`` or ``weakly`` (the
    embedded default is keyed weakly by that engine, and must not keep it alive).
    """

    def __init__(
        self,
        bind: Bind,
        *,
        timeout: float,
        pool_size: int = 5,
        max_overflow: int | None = None,
        what: str = "database",
        embedded: bool = False,
        weakly: bool = False,
        unavailable: type[DatabaseUnavailable] = DatabaseUnavailable,
    ) -> None:
        self.timeout = check_seconds("timeout", timeout)
        self.what = what
        self._unavailable = unavailable
        app = engine_of(bind)
        url = app.url if app is not None else to_url(bind)  # type: ignore[arg-type]
        self.backend: TicketBackend = backend_for(url.get_backend_name())
        if app is not None and embedded:
            url = self.backend.embedded_url(url)
        url = self.backend.sync_url(url, bool(app.dialect.is_async) if app is not None else None)
        self.url: URL = url
        #: Whether the connections are an asyncio driver's, driven synchronously.
        self.driven = url.get_driver_name() in self.backend.drivable
        #: Whether connections come from the application's engine (else from the URL alone).
        self.inherits = app is not None and not app.dialect.is_async and url == app.url
        self._app: Callable[[], Engine | None] | None = None
        if self.inherits:
            assert app is not None
            _listen_for_inheritance(app)
            self._app = weakref.ref(app) if embedded or weakly else (lambda app=app: app)
        self._params = self.backend.own_connect_params(url.get_driver_name(), self.timeout)
        if self.driven:
            # The driver's own connect timeout, where it has one, may not cover the handshake.
            forced = {**self._params.forced, CONNECT_TIMEOUT: self.timeout}
            self._params = ConnectParams(self._params.defaults, forced)
        options = self.backend.own_engine_options(url)
        if "poolclass" not in options:
            options.update(
                pool_size=pool_size,
                max_overflow=pool_size * 2 if max_overflow is None else max_overflow,
            )
        if self.inherits:
            options["creator"] = self._inherited_connection
        if _SKIPS_ROLLBACK:
            options["skip_autocommit_rollback"] = True
        try:
            self.engine: Engine = sa.create_engine(
                driven_url(url) if self.driven else url,
                isolation_level="AUTOCOMMIT",
                # Autocommit connections hold no transaction: a rollback on return would only
                # cost a round trip per checkin.
                pool_reset_on_return=None,
                **options,
            )
        except ImportError as error:
            raise self.backend.missing_driver(url, error) from error
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError) as error:
            raise TicketsError(f"cannot use {url.render_as_string()!r}: {error}") from error
        if not self.inherits:
            event.listen(self.engine, "do_connect", self._from_url)
        # First, so the dialect's own first-connect queries are bounded too.
        event.listen(self.engine, "connect", self._arm_new, insert=True)
        self._made = itertools.count(1)
        #: Connections made so far: each new one may reach another database (a failover
        #: behind the same name), which its users check before trusting what they knew.
        self.connections = 0
        event.listen(self.engine, "connect", self._counted)

    def __repr__(self) -> str:
        return f"OwnEngine({self.url.render_as_string()!r}, inherits={self.inherits})"

    # -- connecting ----------------------------------------------------------------------

    def _from_url(
        self, dialect: Dialect, record: Any, cargs: list[Any], cparams: dict[str, Any]
    ) -> None:
        self._params.apply_defaults(cparams)
        self._params.apply_forced(cparams)

    def _inherited_connection(self, record: Any) -> Any:
        app = self._app() if self._app is not None else None
        if app is None:
            raise self._unavailable(
                f"{self.what} {self.url.render_as_string()}: the application's engine it "
                "connects through is gone"
            )
        request = _Request(self._params)
        previous = getattr(_local, "request", None)
        _local.request = request
        try:
            connection = app.pool._invoke_creator(record)
        finally:
            _local.request = previous
        if not request.used:
            # The application's engine has a creator of its own: its connection, as it made it.
            self.backend.settle_own_connection(connection)
        return connection

    def _counted(self, dbapi_connection: Any, record: Any) -> None:
        self.connections = next(self._made)

    def _arm_new(self, dbapi_connection: Any, record: Any) -> None:
        tokens: list[int] | None = getattr(_local, "connecting", {}).get(id(self))
        if tokens is not None:
            fd = self.backend.socket_fd(dbapi_connection)
            if fd is not None:
                tokens.append(watchdog.arm(fd, self.timeout))

    @contextmanager
    def _connecting(self, *, again: bool = False) -> Iterator[None]:
        """Bound the checkout of a new connection: the driver's connect timeout covers the
        connect, the watchdog the dialect's first queries on it. With ``again``, a new
        connection closed during its handshake (by a server that accepted it: an operator's
        kill, a reaper, a pooler's restart) raises :class:`StaleConnection` for the caller to
        try once more, as for a pooled connection closed under a unit of work."""
        pending: dict[int, list[int]] = getattr(_local, "connecting", None) or {}
        _local.connecting = pending
        tokens = pending[id(self)] = []
        try:
            yield
        except (sa_exc.DBAPIError, self.engine.dialect.loaded_dbapi.Error, OSError) as error:
            # raw_connection() raises the driver's own errors, connect() wraps them.
            cut = not all([watchdog.disarm(t) for t in tokens])
            tokens.clear()
            if again and not cut and self._closed_while_connecting(error):
                raise StaleConnection() from error
            raise self._error(error, cut, connecting=True) from error
        finally:
            for token in tokens:
                watchdog.disarm(token)
            del pending[id(self)]

    def _checkout(self, *, again: bool = False) -> Any:
        """A pooled DBAPI connection (``PoolProxiedConnection``), its connect bounded
        (``again``: see :meth:`_connecting`)."""
        with self._connecting(again=again):
            return self.engine.raw_connection()

    def _closed_while_connecting(self, error: BaseException) -> bool:
        """Whether a failed connect was a connection the server accepted and then closed."""
        return self.backend.is_dropped(getattr(error, "orig", None) or error)

    def arm(self, dbapi_connection: Any, seconds: float | None = None) -> int | None:
        """Start the clock on a unit of work on ``dbapi_connection`` (``seconds``: what is
        left of the call's time, else ``timeout``; ``None`` returned: nothing to watch, e.g.
        SQLite)."""
        fd = self.backend.socket_fd(dbapi_connection)
        if fd is None:
            return None
        return watchdog.arm(fd, self.timeout if seconds is None else seconds)

    @staticmethod
    def disarm(token: int | None) -> bool:
        """Stop the clock; ``False`` if the unit overran and the connection was cut (discard
        it, even if the unit's last answer arrived)."""
        return token is None or watchdog.disarm(token)

    def _disconnected(self, error: Any, conn: Any, cursor: Any) -> bool:
        """Whether ``error`` says the connection is closed (by the server, or by something in
        between), so that every connection the pool made before it may be too."""
        dialect = self.engine.dialect
        try:
            return bool(dialect.is_disconnect(error, conn.dbapi_connection, cursor))
        except Exception:  # a dialect that cannot tell on a broken connection
            return False

    def _forget_older(self, conn: Any, error: BaseException) -> None:
        """Invalidate every connection the pool made up to ``conn`` (those checked out now are
        replaced when they come back): what SQLAlchemy's own connections do on a disconnect.
        An idle reaper, ``pg_terminate_backend`` or a pooler's restart closes them all."""
        self.engine.pool._invalidate(conn, error)

    def round_trip(self, work: Callable[[Any], R]) -> R:
        """``work(cursor)`` on a pooled connection in autocommit, the whole call bounded by
        ``timeout``; the cursor stays with its connection for the next call.

        A connection found closed by the server or by something in between (an idle reaper,
        ``pg_terminate_backend``, ``KILL CONNECTION``, a pooler or proxy restart) costs only
        the round trip that found it: the pool forgets every connection it made before
        (SQLAlchemy's pool invalidation) and ``work`` runs again on a fresh one, within what is
        left of the call's time. ``work`` must be safe to run again: a statement whose answer
        was lost may have run (a block taken that way is burned: never handed out, and never
        taken again, since the next take starts above it). A statement that lost a write
        conflict (a deadlock, a failed Galera certification) was rolled back whole and runs
        again. A database file replaced under its connections (SQLite) is reopened once.

        Raises the ``unavailable`` error when the database refuses or drops a fresh
        connection, or does not answer in time; other DBAPI errors (a missing table, a
        constraint) as the driver raised them.
        """
        deadline = time.monotonic() + self.timeout
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        reopened = False
        closed = 0
        while True:
            try:
                conn = self._checkout(
                    again=closed + 1 < CLOSED_ATTEMPTS and time.monotonic() < deadline)
            except StaleConnection as error:
                closed += 1
                logger.debug("%s: a new connection was closed while connecting (%s); "
                             "again", self, error.__cause__)
                continue
            left = deadline - time.monotonic()
            cursor = None
            token = None
            try:
                held = conn.info.get(_CURSOR)
                if held is None:
                    held = conn.info[_CURSOR] = conn.cursor()
                cursor = held
                token = self.arm(conn.dbapi_connection, max(left, 0.0))
                result = self._without_conflicts(work, cursor, deadline)
            except dbapi_error as error:
                in_time = self.disarm(token) and time.monotonic() < deadline
                if in_time and self.backend.is_missing_table(error):
                    conn.close()  # the connection is fine: back to the pool
                    raise
                disconnected = self._disconnected(error, conn, cursor)
                conn.invalidate(error)
                if in_time and not reopened and self.backend.is_moved(error):
                    reopened = True  # a file replaced: its other connections have the old one
                    self.dispose()
                    continue
                if disconnected:
                    self._forget_older(conn, error)
                    closed += 1
                    if in_time and closed < CLOSED_ATTEMPTS:
                        logger.debug("%s: a connection was closed under a round trip (%s); "
                                     "again on a new one", self, error)
                        continue
                dbapi = self.engine.dialect.loaded_dbapi
                if not in_time or disconnected or isinstance(
                    error, (dbapi.OperationalError, dbapi.InterfaceError)
                ):
                    raise self._error(error, not in_time) from error
                raise
            except BaseException:
                self.disarm(token)
                conn.invalidate()
                raise
            if not self.disarm(token):
                # The answer came as the deadline passed: the socket is being cut.
                conn.invalidate()
            else:
                conn.close()
            return result

    def _without_conflicts(self, work: Callable[[Any], R], cursor: Any, deadline: float) -> R:
        """``work(cursor)``, again while it loses write conflicts (rolled back whole: it did
        nothing), until :data:`CONFLICT_RETRIES` or the deadline."""
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        for attempt in range(1, CONFLICT_RETRIES + 1):
            try:
                return work(cursor)
            except dbapi_error as error:
                if (
                    attempt == CONFLICT_RETRIES
                    or time.monotonic() >= deadline
                    or not self.backend.is_conflict(error)
                ):
                    raise
                logger.debug("%s: a statement conflicted (%s); again", self, error)
                # Apart from the writer it lost to, which is still at it.
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
        raise AssertionError("unreachable")

    def run(self, work: Callable[[sa.Connection], R], *, each_statement: bool = False) -> R:
        """``work(connection)`` in one unit (:meth:`connect`); a pooled connection found
        closed under it costs only that attempt: ``work`` runs again on a fresh connection
        (every older one forgotten), within the unit's time. ``work`` must be safe to run
        again (its transaction, if it opened one, either committed with its answer lost or
        did nothing)."""
        deadline = time.monotonic() + self.timeout
        for attempt in range(1, CLOSED_ATTEMPTS + 1):
            try:
                with self.connect(
                    each_statement=each_statement,
                    deadline=deadline,
                    again=attempt < CLOSED_ATTEMPTS,
                ) as conn:
                    return work(conn)
            except StaleConnection:
                logger.debug("%s: a connection was closed under a unit of work; again on a "
                             "new one", self)
        raise AssertionError("unreachable: the last attempt raises the unavailable error")

    @contextmanager
    def connect(
        self,
        *,
        each_statement: bool = False,
        deadline: float | None = None,
        again: bool = False,
    ) -> Iterator[sa.Connection]:
        """An autocommit ``Connection`` for one bounded unit of work.

        The whole unit (connect included) gets ``timeout`` seconds (or until ``deadline``, on
        the monotonic clock); with ``each_statement``, each statement (and the work before it)
        gets them, for a unit of many statements (tables created in batches) that a server
        answering every one of them in time may take longer than that over. A database that
        refuses, drops or outlives the timeout raises the ``unavailable`` error; other
        database errors (a constraint, a missing table) propagate as SQLAlchemy raised them.
        With ``again`` (:meth:`run`), a connection found closed under the unit before the
        deadline raises :class:`StaleConnection` instead, for ``run`` to try again.
        """
        with self._connecting(again=again):
            conn = self.engine.connect()
        dbapi_connection = conn.connection.dbapi_connection
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        clock = _Clock(self, dbapi_connection, left)
        if each_statement:
            event.listen(conn, "before_cursor_execute", clock.restart)
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            yield conn
        except (sa_exc.DBAPIError, dbapi_error) as error:
            cut = not clock.stop()
            if isinstance(error, sa_exc.DBAPIError):
                closed = error.connection_invalidated
            else:  # a raw cursor's error (a unit that reads through the DBAPI)
                closed = not conn.invalidated and self._disconnected(
                    error, conn.connection, None)
                if closed:
                    self._forget_older(conn.connection, error)
            if cut or closed:
                conn.invalidate()
                if again and not cut and (deadline is None or time.monotonic() < deadline):
                    raise StaleConnection() from error
                raise self._error(error, cut) from error
            raise
        finally:
            if not clock.stop() and not conn.invalidated:
                conn.invalidate()  # it overran while finishing: never reuse a cut socket
            try:
                conn.close()
            except sa_exc.DBAPIError:
                # Ending it (an older SQLAlchemy's rollback in autocommit) met a connection
                # closed since the unit's last statement: its work is done, and SQLAlchemy
                # has discarded the connection.
                logger.debug("%s: closing a connection that was closed under it", self)

    def _error(
        self, error: BaseException, cut: bool, *, connecting: bool = False
    ) -> DatabaseUnavailable:
        where = f"{self.what} {self.url.render_as_string()}"
        if cut:
            return self._unavailable(f"{where} did not answer within {self.timeout:g} s")
        lines = str(getattr(error, "orig", None) or error).strip().splitlines()
        first = lines[0] if lines else type(error).__name__
        verb = "failed to connect" if connecting else "failed"
        return self._unavailable(f"{where} {verb}: {first}")

    def unavailable(self, error: BaseException, cut: bool = False) -> DatabaseUnavailable:
        """The ``unavailable`` error for a failure of this database (``cut``: by the watchdog)."""
        return self._error(error, cut)

    def dispose(self, close: bool = True) -> None:
        """Close the pool's connections (``close=False`` in a forked child: they are the
        parent's)."""
        self.engine.dispose(close=close)


# -- creating tables ---------------------------------------------------------------------------

#: Times a creation runs in all when a concurrent creator that takes no creation lock (a
#: migration) keeps winning the race on the catalog.
_CREATE_ATTEMPTS = 3


def create_under_lock(
    own: OwnEngine,
    tables: Sequence[TicketTable],
    statements: Callable[[sa.Connection], Iterable[sa.sql.Executable]],
    *,
    transactions: bool = True,
) -> bool:
    """Run ``statements(connection)`` on one of ``own``'s connections as one step for every
    other client: under the creation locks of ``tables`` (:meth:`TicketBackend.creating`:
    concurrent creators of any of them wait), in one transaction where DDL is transactional.

    ``statements`` is called once the locks are held, so it may look at what is there by then;
    every statement it returns must be safe to run again (``IF NOT EXISTS``, an idempotent
    seed). A concurrent creator that takes no creation lock (a migration) may win the race on
    the catalog (PostgreSQL: an ``IntegrityError``): the step runs again, and finds its tables.
    ``transactions=False``: each statement on its own, without locks, for a database that
    refuses transaction blocks (PgBouncer in statement pooling), which is also found out here.

    Returns whether transaction blocks work (``False`` once they were refused: pass it next
    time). Raises ``own``'s unavailable error when the database refuses, drops or outlives
    the timeout, or when a lock does not come within it.
    """
    backend = own.backend
    conflicts = 0

    def step(conn: sa.Connection) -> None:
        guard = backend.creating(conn, tables, own.timeout) if transactions else nullcontext()
        with guard:
            for statement in statements(conn):
                conn.execute(statement)

    while True:
        try:
            # A connection closed under the step (a kill, a reaper) costs that attempt only:
            # the step runs again on a fresh one, as every statement of it may.
            own.run(step, each_statement=True)
            return transactions
        except sa_exc.IntegrityError:
            conflicts += 1
            if conflicts == _CREATE_ATTEMPTS:
                raise
            logger.debug("%s: created concurrently; again", ", ".join(t.name for t in tables))
        except (sa_exc.DBAPIError, DatabaseUnavailable) as error:
            orig = getattr(error, "orig", None) or getattr(error.__cause__, "orig", None)
            if orig is not None and backend.created_concurrently(orig):
                # Without locks (no transaction blocks), another creator's CREATE of the same
                # table landed between this one's look and its own: the step runs again.
                conflicts += 1
                if conflicts == _CREATE_ATTEMPTS:
                    raise
                logger.debug("%s: created concurrently; again",
                             ", ".join(t.name for t in tables))
                continue
            if transactions and backend.refuses_transactions(orig):
                logger.info(
                    "%s refuses transaction blocks (PgBouncer in statement pooling?): "
                    "creating tables statement by statement", own.url.render_as_string()
                )
                transactions = False
                continue
            if isinstance(error, DatabaseUnavailable):
                raise
            raise own.unavailable(error) from error
