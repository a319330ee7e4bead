"""One engine of the library's own per application database, shared by every client of the
library there (the embedded default, the read of a table's largest key, a test suite's reset)
and closed with the application's engine: its ``dispose()``, or its garbage collection."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.engine import Engine

from .. import _process
from ..errors import DatabaseUnavailable
from ._connect import OwnEngine
from ._registry import backend_for

logger = logging.getLogger("sqlalchemy_tickets")


class _Shared:
    """What the library keeps for one application engine: its engines of its own, by URL, and
    what must run before they close when the application's engine is collected."""

    __slots__ = ("engines", "closers", "before_dispose")

    def __init__(self) -> None:
        self.engines: dict[str, OwnEngine] = {}
        self.closers: list[Callable[[], None]] = []
        self.before_dispose: list[Callable[[Engine], None]] = []


_shared: weakref.WeakKeyDictionary[Engine, _Shared] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def _shared_of(app: Engine) -> _Shared:
    # Under _shared_lock.
    found = _shared.get(app)
    if found is None:
        found = _shared[app] = _Shared()
        # Closed with the application's engine: its dispose(), or its collection (not left
        # to the collector: a driver may warn of a connection deleted while open).
        event.listen(app, "engine_disposed", _dispose_shared)
        weakref.finalize(app, _on_app_collected, found).atexit = False
    return found


def shared_engine(
    app: Engine,
    *,
    embedded: bool,
    timeout: float,
    pool_size: int,
    what: str,
    unavailable: type[DatabaseUnavailable] = DatabaseUnavailable,
) -> OwnEngine:
    """The library's one engine of its own on the database an application's ``Engine`` reaches
    (``embedded``: where the embedded default keeps that engine's ticket tables), made on first
    use and held weakly by that engine: every client of the library there (the embedded
    default, the read of a table's largest key, a test suite's reset) shares its pool, instead
    of each connecting, and initializing a dialect, on its own. The first client's
    ``timeout``, ``pool_size``, ``what`` and ``unavailable`` are the engine's."""
    backend = backend_for(app.url.get_backend_name())
    url = backend.embedded_url(app.url) if embedded else app.url
    key = url.render_as_string(hide_password=False)
    with _shared_lock:
        engines = _shared_of(app).engines
        own = engines.get(key)
        if own is None:
            own = engines[key] = OwnEngine(
                app, timeout=timeout, pool_size=pool_size, what=what, embedded=embedded,
                weakly=True, unavailable=unavailable,
            )
    return own


def close_before_collected(app: Engine, closer: Callable[[], None]) -> None:
    """Run ``closer`` when ``app`` is garbage collected, before the library's engines on its
    database close (it may still use them: the embedded default gives its ids back there).
    ``closer`` must not hold ``app``."""
    with _shared_lock:
        _shared_of(app).closers.append(closer)


def close_before_disposed(app: Engine, closer: Callable[[Engine], None]) -> None:
    """Run ``closer(app)`` when ``app`` is disposed, before the library's engines on its
    database close (as :func:`close_before_collected`); once, however often it is passed."""
    with _shared_lock:
        found = _shared_of(app)
        if closer not in found.before_dispose:
            found.before_dispose.append(closer)


def _dispose_shared(app: Engine) -> None:
    # One listener runs the closers, then closes the engines: SQLAlchemy does not keep an
    # engine's listeners in the order asked for (``insert=True`` is not honoured once other
    # events of the engine have listeners), and a closer run after the engines closed would
    # connect again.
    with _shared_lock:
        found = _shared.get(app)
        closers = list(found.before_dispose) if found is not None else []
        engines = list(found.engines.values()) if found is not None else []
    for closer in closers:
        closer(app)
    for own in engines:
        own.dispose()


def _on_app_collected(found: _Shared) -> None:
    # Run by the collector, possibly inside library code holding a lock a closer needs: run
    # from a thread of its own, which ends with the close. One thread, in order: the closers
    # still use the engines (closing them first, the closers would open connections again,
    # left in pools nobody disposes).
    threading.Thread(
        target=_close_collected, args=(found,), name="sqlalchemy-tickets-close", daemon=True
    ).start()


def _close_collected(found: _Shared) -> None:
    for closer in found.closers:
        try:
            closer()
        except Exception:  # noqa: BLE001 -- the engines still close; nobody to raise to
            logger.debug("closing after an engine's collection failed", exc_info=True)
    for own in list(found.engines.values()):
        own.dispose()


def _forget_shared_in_child() -> None:
    # The parent's connections are the parent's: never closed here, never used (each
    # engine's pool is replaced without closing them).
    global _shared_lock
    _shared_lock = threading.Lock()
    for found in list(_shared.values()):
        for own in found.engines.values():
            own.dispose(close=False)


_process.after_fork_in_child(_forget_shared_in_child)
