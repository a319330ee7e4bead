"""What a backend knows about its drivers, URLs and the library's own connections (their
timeouts and sockets); :class:`~sqlalchemy_tickets.dialects.base.TicketBackend` adds the SQL."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Dialect

from ..errors import DriverNotInstalledError, TicketsError
from ._types import ConnectParams


@functools.cache
def driver_installed(backend: str, driver: str, *, greenlet: bool = False) -> bool:
    """Whether SQLAlchemy's ``backend+driver`` dialect can import its driver (``greenlet``: and
    greenlet, which an asyncio driver used synchronously needs too)."""
    try:
        dialect = sa.dialects.registry.load(f"{backend}.{driver}")
        dialect.import_dbapi()
        if greenlet:
            importlib.import_module("greenlet")
    except Exception:  # ImportError, or a driver that fails its own import (no libpq)
        return False
    return True


def transport_fd(transport: Any) -> int | None:
    """The socket descriptor under an asyncio transport (``None`` without one, or once closed)."""
    if transport is None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    fd = int(sock.fileno())
    return fd if fd >= 0 else None


class BackendConnections:
    """The driver and connection knowledge of one backend (see :class:`TicketBackend`)."""

    # -- the library's own connections (dialects/_connect.py runs them) -------------------

    #: The synchronous drivers the library's own connections can use (their round trips can be
    #: bounded: see :meth:`own_connect_params` and :meth:`socket_fd`), preferred first.
    sync_drivers: ClassVar[tuple[str, ...]] = ()

    #: asyncio drivers the library's own connections may use synchronously (``_driven.py``)
    #: where none of :attr:`sync_drivers` is installed.
    drivable: ClassVar[frozenset[str]] = frozenset()

    #: The extra of ``sqlalchemy-tickets`` that installs this backend's preferred driver.
    extra: ClassVar[str] = ""

    #: What ``pip install`` takes for each driver, where it is not the driver's own name.
    driver_packages: ClassVar[Mapping[str, str]] = {}

    def own_connect_params(self, driver: str, timeout: float) -> ConnectParams:
        """What the library adds to the DBAPI connect arguments of its own connections on
        ``driver``: defaults (the application's settings win) and forced settings (the
        timeouts). Nothing may rely on session state: PgBouncer hands each transaction to
        whichever server connection is free."""
        return ConnectParams()

    def own_engine_options(self, url: URL) -> dict[str, Any]:
        """``create_engine`` options for the library's own engine on ``url``: pool class,
        dialect options (without ``poolclass``: a ``QueuePool`` sized by the caller)."""
        return {}

    def settle_own_connection(self, dbapi_connection: Any) -> None:
        """Adjust a connection an application's own ``creator`` made, which the library's
        connect arguments never reached (psycopg: no server-side prepared statements)."""

    def sync_url(self, url: URL, is_async: bool | None = None) -> URL:
        """``url`` on a driver the library's own connections can use: ticket round trips run
        on their own threads and connections, never on an event loop, and are bounded.

        ``url`` itself when it names one of :attr:`sync_drivers` (not checked for being
        installed here: connecting says so, see :meth:`missing_driver`). Otherwise (an asyncio
        driver, or one whose round trips cannot be bounded) the same database on the first of
        :attr:`sync_drivers` that is installed, else on the asyncio driver itself, driven
        synchronously, where it is :attr:`drivable` and installed.

        ``is_async`` says whether the engine ``url`` comes from is an asyncio one (psycopg's
        URLs name both); ``None``: as the URL's dialect says.

        Raises:
            DriverNotInstalledError: nothing installed fits; the message names the extra.
        """
        driver = url.get_driver_name()
        try:
            dialect = url.get_dialect()
        except Exception:  # an unknown driver: create_engine says so in its own words
            return url
        if is_async is None:
            is_async = bool(dialect.is_async)
        if driver in self.sync_drivers and not is_async:
            return url
        backend = url.get_backend_name()
        for candidate in self.sync_drivers:
            if driver_installed(backend, candidate):
                return url.set(drivername=f"{backend}+{candidate}")
        # Its own asyncio driver first: its URL's query is written for it.
        for candidate in sorted(self.drivable, key=lambda name: name != driver):
            if driver_installed(backend, candidate, greenlet=True):
                return url.set(drivername=f"{backend}+{candidate}")
        kind = "an asyncio driver" if is_async else "a driver whose round trips it cannot bound"
        raise DriverNotInstalledError(
            f"{url.render_as_string()}: the library's own connections need a synchronous "
            f"driver of {backend} ({', '.join(self.sync_drivers)}), since {driver} is {kind}, "
            f"and none is installed: {self.install_hint()}"
        )

    def install_hint(self, driver: str | None = None) -> str:
        """How to install ``driver`` (default: this backend's preferred driver)."""
        extra = f"pip install 'sqlalchemy-tickets[{self.extra}]'" if self.extra else ""
        if driver is None or (self.sync_drivers and driver == self.sync_drivers[0]):
            return extra
        package = f"pip install {self.driver_packages.get(driver, driver)}"
        return f"{package} (or {extra} for {self.sync_drivers[0]})" if extra else package

    def missing_driver(self, url: URL, error: ImportError) -> DriverNotInstalledError:
        """The error for an engine on ``url`` whose driver cannot be imported."""
        return DriverNotInstalledError(
            f"{url.render_as_string()}: the {url.get_driver_name()} driver is not installed "
            f"({error}): {self.install_hint(url.get_driver_name())}"
        )

    def embedded_url(self, app_url: URL) -> URL:
        """Where the embedded default keeps the ticket tables of an application database."""
        return app_url

    def embedded_attach(
        self, alias: str
    ) -> tuple[list[sa.sql.Executable], list[sa.sql.Executable]] | None:
        """Where the embedded default keeps an application database's ticket tables in
        another database (:meth:`embedded_url`): the statements that attach it, as the schema
        ``alias``, to a connection of the application's database, and those that detach it —
        the same online and in a ``--sql`` script. ``None``: they are in the application's
        own database."""
        return None

    def is_attached(self, connection: sa.Connection, alias: str) -> bool:
        """Whether :meth:`embedded_attach` attached ``alias`` to ``connection`` already."""
        return False

    def embedded_tables(self, connection: sa.Connection, names: Sequence[str]) -> set[str] | None:
        """Those of ``names`` that are tables where the embedded default keeps the ticket
        tables of the application database ``connection`` is on, when that is another
        database (:meth:`embedded_attach`), read without creating it; ``None``: it is that
        database itself."""
        return None

    def seen_apart(self, app_url: URL) -> bool:
        """Whether a connection of the library's own to the application's database sees what
        the application's connections see (not an in-memory SQLite database: each connection
        has its own)."""
        return True

    def database_key(self, url: URL) -> Hashable:
        """What tells databases of this backend apart: two URLs with the same key name the
        same database, whatever their drivers, users or options."""
        return (url.host or "localhost", url.port, url.database)

    def missing_database(self, url: URL) -> str | None:
        """Why ``url`` names a database that does not exist, if that can be told without
        connecting (``None``: it exists, or only a connection can tell). Read-only tools check
        it first, so that looking does not create a database (a SQLite file) as a side effect."""
        return None

    #: The drivers :func:`~sqlalchemy_tickets.apply_timeouts` can bound: synchronous ones, then
    #: asyncio ones.
    timeout_drivers: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())

    def check_timeouts(self, dialect: Dialect) -> None:
        """Refuse, with a :class:`TicketsError` naming the drivers that can be, an application
        engine on ``dialect`` whose round trips cannot be bounded."""
        sync, asyncio = self.timeout_drivers
        if dialect.driver in (asyncio if dialect.is_async else sync):
            return
        supported = "; ".join(
            f"{kind} {', '.join(drivers)}"
            for kind, drivers in (("synchronous:", sync), ("asyncio:", asyncio))
            if drivers
        )
        if dialect.is_async:
            why = (
                f"timeouts are not supported for the asyncio driver {dialect.name}+"
                f"{dialect.driver}: the library does not know where its connections keep their "
                "socket, so a hung round trip could not be cut short"
            )
        else:
            why = (
                f"timeouts are not supported for {dialect.name}+{dialect.driver}: the library "
                "knows neither a read timeout of that driver nor where its connections keep "
                "their socket, so a hung round trip could not be cut short"
            )
        raise TicketsError(f"{why} (supported for {dialect.name}: {supported or 'none'})")

    def connect_with_timeout(
        self, dialect: Dialect, cargs: Any, cparams: dict[str, Any], seconds: float
    ) -> Any:
        """For an application engine: add the driver's own timeouts to ``cparams``, or return a
        DBAPI connection whose round trips are bounded (``None``: connect as usual)."""
        self.check_timeouts(dialect)
        raise NotImplementedError

    def socket_fd(self, dbapi_connection: Any) -> int | None:
        """The socket under a DBAPI connection (or an asyncio driver's connection), so a
        watchdog can cut a hung round trip short."""
        return None

    def async_connect_timeout(
        self, dialect: Dialect, cparams: dict[str, Any], seconds: float
    ) -> Callable[..., Awaitable[Any]] | None:
        """For an application engine on an asyncio driver: add the driver's own connect
        timeout to ``cparams`` and return the driver's connect coroutine function, which the
        caller bounds as a whole; after connecting, each round trip is bounded by shutting down
        :meth:`socket_fd`. ``None``: nothing more to bound (a file has no network).

        Raises :class:`TicketsError` naming the driver and why when it cannot be bounded.
        """
        self.check_timeouts(dialect)
        raise NotImplementedError

    def connect_timeout_error(self, dbapi: Any, message: str) -> Exception:
        """The DBAPI error a connect that outlived its bound raises (a connection error, so
        SQLAlchemy wraps it and :func:`~sqlalchemy_tickets.is_retryable` retries it)."""
        error: Exception = dbapi.OperationalError(message)
        return error

    # -- tables --------------------------------------------------------------------------
