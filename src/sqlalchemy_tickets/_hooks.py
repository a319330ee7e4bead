"""Hooks for moments of the library's life that the package wires together without the modules
involved importing each other: the first cache a process opens switches metrics on
(``__init__.py`` registers that), so that the caches never import the metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("sqlalchemy_tickets")

_lock = threading.Lock()
_first_cache: list[Callable[[], None]] = []
_opened = False


def when_first_cache_opens(hook: Callable[[], None]) -> None:
    """Call ``hook()`` when the process's first cache opens (at once if one has)."""
    with _lock:
        _first_cache.append(hook)
        already = _opened
    if already:
        _run(hook)


def cache_opened() -> None:
    """A cache opened: the hooks run the first time."""
    global _opened
    with _lock:
        if _opened:
            return
        _opened = True
        hooks = list(_first_cache)
    for hook in hooks:
        _run(hook)


def _run(hook: Callable[[], None]) -> None:
    try:
        hook()
    except Exception:  # a hook must never stop a cache from working
        logger.exception("a hook run when the first cache opened failed")
