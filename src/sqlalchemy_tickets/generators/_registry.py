"""Generators (and worker leases) shared per configuration within a process.

Two ``SnowflakeId(worker_id=3)`` columns must draw from one generator, or they could issue the
same id in the same millisecond; two ``PrefixedId("post")`` columns share one so that a column's
ids stay in one increasing sequence. The column types in :mod:`sqlalchemy_tickets.columns` look
their generator up here.

Bounded, and how:

* An entry whose key holds a callable the caller injected (``SnowflakeId(time_ns=...)``, in
  tests) is held weakly: it lives as long as a column uses it. Keyed strongly by callables, the
  registry would grow with every test that builds a column around a fresh fake clock.
* Worker leases are held weakly: a lease lives as long as a generator uses it.
* Every other entry is held for the life of the process. There are as many as distinct
  configurations the program declares (worker ids, layouts, prefixes), and dropping one would
  be unsafe: a new ``SnowflakeGenerator`` for worker 3 made in the millisecond an old one last
  issued in would repeat its ids.
* After ``fork()`` the lock is replaced (a parent thread may have held it); the entries are kept,
  since each generator resets itself for the child (a leased one drops its lease, random state
  is reseeded), and a second generator for a fixed worker id in the child would repeat ids.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import _process
from .objectid import ObjectIdGenerator
from .prefixed import PrefixedIdGenerator
from .snowflake import SnowflakeGenerator

if TYPE_CHECKING:
    from ..sources.lease import WorkerLease

__all__ = ["Shared", "leases", "object_ids", "prefixed", "snowflakes"]

_V = TypeVar("_V")

# One lock for every registry, re-entrant: making a leased Snowflake generator looks its lease
# up in ``leases`` while ``snowflakes`` is being filled.
_lock = threading.RLock()


class Shared(Generic[_V]):
    """Values made once per key, each held strongly or weakly (see the module documentation)."""

    def __init__(self) -> None:
        self._strong: dict[Hashable, _V] = {}
        self._weak: weakref.WeakValueDictionary[Hashable, _V] = weakref.WeakValueDictionary()

    def get(self, key: Hashable, make: Callable[[], _V], *, weak: bool = False) -> _V:
        """The value for ``key``, made by ``make()`` the first time (under the registry lock)."""
        with _lock:
            found = self._strong.get(key)
            if found is None:
                found = self._weak.get(key)
            if found is None:
                found = make()
                if weak:
                    self._weak[key] = found
                else:
                    self._strong[key] = found
            return found

    def __len__(self) -> int:
        with _lock:
            return len(self._strong) + len(self._weak)


snowflakes: Shared[SnowflakeGenerator] = Shared()
leases: Shared[WorkerLease] = Shared()
prefixed: Shared[PrefixedIdGenerator] = Shared()
object_ids: Shared[ObjectIdGenerator] = Shared()


@_process.after_fork_in_child
def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.RLock()
