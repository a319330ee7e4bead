"""The default source: what ``configure()`` set, else the embedded default beside the data."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL, Engine

from ..dialects._shared import close_before_collected, close_before_disposed
from ..errors import TicketsError
from . import _urls
from .base import TicketSource
from .cache import CachedSource
from .server import TicketServer

#: The most ids of one sequence a restart of a process using the embedded default can burn.
EMBEDDED_WASTE_BUDGET = 10_000

_lock = threading.Lock()
_configured: TicketSource | None = None
# What configure() made from a URL (the cache and the source under it): closed when replaced.
_built: tuple[CachedSource, Any] | None = None
_embedded: weakref.WeakKeyDictionary[Engine, _Embedded] = weakref.WeakKeyDictionary()

logger = logging.getLogger("sqlalchemy_tickets")


class _Embedded:
    """The embedded default of one application engine, and the process that made it.

    It belongs to the engine: ``engine.dispose()`` and the engine's collection close it. A
    forked child that resets the pool it inherited (``dispose(close=False)``, SQLAlchemy's
    advice after fork) keeps it: the cache already dropped the parent's ids in the child.
    """

    __slots__ = ("cache", "pid", "__weakref__")

    def __init__(self, cache: CachedSource) -> None:
        self.cache = cache
        self.pid = os.getpid()

    @property
    def server(self) -> TicketServer:
        """The ticket server under the cache."""
        server = self.cache.source
        assert isinstance(server, TicketServer)
        return server

    def close(self) -> None:
        """Give the ids in hand back and close the connections; idempotent."""
        self.cache.close()
        self.server.close()

    def close_in_owner(self) -> None:
        """:meth:`close`, in the process that made it only (a forked child's copy dropped the
        parent's ids already; its connections are the parent's)."""
        if self.pid == os.getpid():
            self.close()


def _on_engine_disposed(app_engine: Engine) -> None:
    with _lock:
        found = _embedded.get(app_engine)
        if found is None or found.pid != os.getpid():
            return
        del _embedded[app_engine]
    found.close()


def configure(source: TicketSource | str | URL | None) -> None:
    """Set the source of ``TicketId`` columns that name none.

    ``source`` is any object with ``next_id``/``next_block`` (a :class:`TicketServer`,
    :class:`TicketServers`, :class:`CachedSource`...), used as given, or a database URL, which
    becomes ``CachedSource(TicketServer(url))``: the fast path. A URL of another registered
    scheme becomes a cache over the source it names: ``zookeeper://h1:2181,h2:2181/path``
    is ``CachedSource(ZooKeeperSource(...))``. ``None`` restores the embedded default.
    """
    global _configured, _built
    built: tuple[CachedSource, Any] | None = None
    if _urls.scheme_of(source) is not None:
        assert isinstance(source, str)
        inner = _urls.parse(source).build()
        source = CachedSource(inner)
        built = (source, inner)
    elif isinstance(source, (str, URL)):
        server = TicketServer(source)
        source = CachedSource(server)
        built = (source, server)
    elif source is not None and not isinstance(source, TicketSource):
        raise TicketsError(
            f"{source!r} is not a ticket source: it needs next_id() and next_block() methods"
        )
    with _lock:
        _configured = source
        replaced, _built = _built, built
        if replaced is not None and replaced[0] is source:  # configured again: still in use
            replaced, _built = None, replaced
    # A source the caller passed in is theirs to close; one built here from a URL is ours, and
    # nothing else holds it: close it (its ids given up, its connections closed), after the
    # swap, so that new calls already go to the new source.
    if replaced is not None:
        cache, server = replaced
        cache.close()
        server.close()


def configured_source() -> TicketSource | None:
    """The source set by :func:`configure`, if any."""
    return _configured


def embedded_source(app_engine: Engine) -> CachedSource:
    """The embedded default for an application engine: ticket tables beside its data.

    Tables live in the database the rows go to (SQLite: a sibling file), are created on first
    use, and are reached on connections of their own, outside the caller's transaction, made
    the way ``app_engine`` makes its own (``connect_args``, ``creator``, ``do_connect`` hooks;
    an async engine's connections are made from its URL, on the synchronous driver). A cache
    in front (``supply`` of 10 s, blocks of 16 to 10,000) keeps round trips off most inserts;
    a restart burns at most what it held: never more than 10,000 ids per sequence. The
    :class:`TicketServer` is its ``.source``.

    It belongs to ``app_engine``: ``app_engine.dispose()`` and the engine's garbage collection
    give its ids back and close its connections and threads (see :class:`_Embedded` for the
    forked child's ``dispose(close=False)``); the next use after a dispose makes a new one.
    """
    found = _embedded.get(app_engine)
    if found is not None and not found.cache.closed:
        return found.cache
    with _lock:
        found = _embedded.get(app_engine)
        if found is not None and not found.cache.closed:
            return found.cache
        found = _Embedded(CachedSource(
            TicketServer(app_engine, pool_size=2, embedded=True),
            supply=10.0,
            max_block=EMBEDDED_WASTE_BUDGET,
            # Everything the cache holds (ready, ahead, in flight) counts: a restart burns at
            # most this many ids per sequence.
            waste_budget=EMBEDDED_WASTE_BUDGET,
        ))
        _embedded[app_engine] = found
        # Its ids given back on the connections still open, before the library's pool on
        # that database closes with the engine (its dispose, or its collection).
        close_before_disposed(app_engine, _on_engine_disposed)
        close_before_collected(app_engine, found.close_in_owner)
    return found.cache


def detach_embedded(app_engine: Engine) -> TicketServer | None:
    """Forget the embedded default of ``app_engine``, if it has one (the next use makes a new
    one): its cache closed, its ids in hand given back; its :class:`TicketServer` returned
    open, its connections ready, for the caller to use and close."""
    with _lock:
        found = _embedded.pop(app_engine, None)
    if found is None:
        return None
    found.cache.close()
    return found.server


def resolve(explicit: TicketSource | None, app_engine: Callable[[], Engine]) -> TicketSource:
    """The source a ``TicketId`` column draws from when it writes through ``app_engine()``
    (called only when the embedded default is the answer)."""
    if explicit is not None:
        return explicit
    configured = _configured
    return configured if configured is not None else embedded_source(app_engine())
