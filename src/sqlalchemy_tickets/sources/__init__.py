"""Where ticket ids come from: single servers, interleaved servers, caches, datacenter tiers, a
ZooKeeper ensemble, and the default source."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import TicketSource
    from .cache import CachedSource
    from .datacenter import DatacenterTier
    from .default import configure
    from .server import TicketServer
    from .servers import TicketServers
    from .zookeeper import ZooKeeperSource

# Each loaded when first asked for: most applications use one or two kinds of source, and the
# datacenter tier alone is a handful of modules.
_WHERE = {
    "CachedSource": ".cache",
    "DatacenterTier": ".datacenter",
    "TicketServer": ".server",
    "TicketServers": ".servers",
    "TicketSource": ".base",
    "configure": ".default",
    "ZooKeeperSource": ".zookeeper",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value: object = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "CachedSource",
    "DatacenterTier",
    "TicketServer",
    "TicketServers",
    "TicketSource",
    "ZooKeeperSource",
    "configure",
]
