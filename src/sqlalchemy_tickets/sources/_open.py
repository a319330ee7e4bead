"""The caches open in this process, and the counters of those already closed.

Metrics read them at collection time; caches register here when made and fold their counters in
when closed. Its own module, so that neither :mod:`~sqlalchemy_tickets.metrics` nor
:mod:`~sqlalchemy_tickets.sources.cache` imports the other to reach it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from .. import _hooks, _process


class _Counted(Protocol):
    def stats(self) -> dict[str, Any]: ...


#: Counters of closed caches kept per ``name/bits``, so that counters read by metrics never go
#: back.
RETIRED_KEYS = ("issued", "burned", "given_back", "round_trips", "blocking_waits", "refills")

_open: weakref.WeakSet[Any] = weakref.WeakSet()
_retired: dict[str, dict[str, int]] = {}
# Guards both: metrics read them from a collector's thread.
_lock = threading.Lock()


def register(cache: _Counted) -> None:
    """``cache`` is open: metrics count it, and it closes at exit."""
    with _lock:
        _open.add(cache)
    _hooks.cache_opened()


def retire(cache: _Counted) -> None:
    """Fold a closed cache's counters into the retired ones and forget the cache, in one step."""
    final = cache.stats()["sequences"]
    with _lock:
        for key, figures in final.items():
            kept = _retired.setdefault(key, dict.fromkeys(RETIRED_KEYS, 0) | {"last_issued": 0})
            for name in RETIRED_KEYS:
                kept[name] += figures[name]
            kept["last_issued"] = max(kept["last_issued"], figures["last_issued"])
        _open.discard(cache)


def open_caches() -> tuple[list[Any], dict[str, dict[str, int]]]:
    """The open caches and the counters of closed ones (per ``name/bits``), read together."""
    with _lock:
        return list(_open), {key: dict(kept) for key, kept in _retired.items()}


def _forget_in_child() -> None:
    # The child's counters start from zero, as its caches do; the lock did not survive the fork.
    global _lock
    _lock = threading.Lock()
    _retired.clear()


_process.after_fork_in_child(_forget_in_child)
