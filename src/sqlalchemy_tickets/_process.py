"""The one place that hooks the library into the life of the process: fork and exit.

Modules that keep process-wide state (open caches, ticket servers, generators, the watchdog)
register plain callables here instead of calling :func:`os.register_at_fork` or
:func:`atexit.register` themselves, so the hooks are registered once, guarded once for
platforms without ``fork`` (Windows), and run in an order that is written down:

* :func:`before_fork` callbacks run in the parent just before ``fork()``, last registered first;
* :func:`after_fork_in_parent` and :func:`after_fork_in_child` callbacks run after it, first
  registered first (the order :func:`os.register_at_fork` uses);
* :func:`at_exit` callbacks run once at interpreter exit, last registered first (as :mod:`atexit`
  does), so a module that depends on another is shut down before the one it depends on. That
  includes the exit of a :mod:`multiprocessing` child, which leaves through ``os._exit()`` and
  so skips :mod:`atexit`, but runs multiprocessing's own finalizers first.

Objects that must reset themselves in a forked child (generators: random state, leases, locks)
are registered with :func:`track`; their ``_after_fork_in_child()`` runs before the
:func:`after_fork_in_child` callbacks, for as long as the object lives.

A callback that raises is logged and the others still run. Registering the same callable twice
for the same moment is a no-op. Registration is thread-safe; on a platform without ``fork`` the
fork callbacks are kept and never called.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Literal, TypeVar

__all__ = [
    "after_fork_in_child",
    "after_fork_in_parent",
    "at_exit",
    "before_fork",
    "exiting",
    "gil_enabled",
    "track",
    "tracked",
]

logger = logging.getLogger(__name__)

_Moment = Literal["before_fork", "after_fork_in_parent", "after_fork_in_child", "at_exit"]
_F = TypeVar("_F", bound=Callable[[], object])

# Each moment maps to an immutable tuple that registration replaces under the lock. The hooks
# read the current tuple without taking the lock: in a forked child the lock may have been held
# by a parent thread that no longer exists there, and taking it would hang the child forever.
_callbacks: dict[_Moment, tuple[Callable[[], object], ...]] = {
    "before_fork": (),
    "after_fork_in_parent": (),
    "after_fork_in_child": (),
    "at_exit": (),
}
_lock = threading.Lock()

_T = TypeVar("_T")
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
_tracked_lock = threading.Lock()


def _register(moment: _Moment, fn: _F) -> _F:
    if not callable(fn):
        raise TypeError(f"expected a callable taking no arguments, got {fn!r}")
    with _lock:
        current = _callbacks[moment]
        if fn not in current:
            _callbacks[moment] = (*current, fn)
    return fn


def before_fork(fn: _F) -> _F:
    """Call ``fn()`` in the parent just before every ``os.fork()``; returns ``fn`` (a decorator).

    Callbacks run last registered first. Use it to take a lock that the child must find in a
    consistent state, and release it in :func:`after_fork_in_parent` / :func:`after_fork_in_child`.
    """
    return _register("before_fork", fn)


def after_fork_in_parent(fn: _F) -> _F:
    """Call ``fn()`` in the parent right after every ``os.fork()``; returns ``fn`` (a decorator)."""
    return _register("after_fork_in_parent", fn)


def after_fork_in_child(fn: _F) -> _F:
    """Call ``fn()`` in the child right after every ``os.fork()``; returns ``fn`` (a decorator).

    Only the forking thread exists in the child: ``fn`` must replace locks other threads may have
    held, forget threads, and drop anything (sockets, reserved ids) the parent still owns.
    """
    return _register("after_fork_in_child", fn)


def at_exit(fn: _F) -> _F:
    """Call ``fn()`` once at interpreter exit; returns ``fn`` (a decorator).

    Callbacks run last registered first, after non-daemon threads have been joined.
    """
    return _register("at_exit", fn)


def track(obj: _T) -> _T:
    """Call ``obj._after_fork_in_child()`` in every forked child for as long as ``obj`` lives
    (held weakly); returns ``obj``."""
    if not callable(getattr(obj, "_after_fork_in_child", None)):
        raise TypeError(f"{obj!r} has no _after_fork_in_child() method")
    with _tracked_lock:
        _tracked.add(obj)
    return obj


def tracked(cls: type[_T]) -> list[_T]:
    """The live tracked objects that are instances of ``cls``."""
    with _tracked_lock:
        return [obj for obj in _tracked if isinstance(obj, cls)]


def _run(moment: _Moment, *, reverse: bool) -> None:
    callbacks = _callbacks[moment]
    for fn in reversed(callbacks) if reverse else callbacks:
        try:
            fn()
        except Exception:
            logger.exception("%s hook %r failed", moment.replace("_", " "), fn)


def _before_fork() -> None:
    _run("before_fork", reverse=True)


def _after_fork_in_parent() -> None:
    _run("after_fork_in_parent", reverse=False)


def _after_fork_in_child() -> None:
    global _lock, _tracked_lock
    _lock = threading.Lock()
    _tracked_lock = threading.Lock()
    for obj in list(_tracked):
        try:
            obj._after_fork_in_child()
        except Exception:
            logger.exception("after fork in child: resetting %r failed", obj)
    _run("after_fork_in_child", reverse=False)


_exited = threading.Event()


def gil_enabled() -> bool:
    """Whether the interpreter runs with the GIL: a builtin iterator's ``next()`` is then one
    atomic step, which lock-free hot paths rely on (free-threaded builds take a lock instead)."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def exiting() -> bool:
    """Whether the :func:`at_exit` callbacks have started: the process is on its way out."""
    return _exited.is_set()


def _at_exit() -> None:
    # Reached from atexit, and from multiprocessing's exit finalizers in its children (and
    # in the main process, where both run): once.
    if _exited.is_set():
        return
    _exited.set()
    # By now a test runner may have closed the streams its logging handlers write to: a
    # line logged here must not become a "--- Logging error ---" traceback on stderr.
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        _run("at_exit", reverse=True)
    finally:
        logging.raiseExceptions = raise_exceptions


class _MultiprocessingHook:
    """Registers :func:`_at_exit` among multiprocessing's exit finalizers: its children leave
    through ``os._exit()``, skipping atexit, after running them. A forked child starts with
    those finalizers cleared and then calls its after-fork hooks, which register it again."""

    def register(self) -> None:
        multiprocessing.util.Finalize(None, _at_exit, exitpriority=0)

    def __call__(self, _: object) -> None:
        self.register()


_multiprocessing_hook = _MultiprocessingHook()
_multiprocessing_hook.register()
multiprocessing.util.register_after_fork(_multiprocessing_hook, _multiprocessing_hook)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork()
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
atexit.register(_at_exit)
