"""Where ticket ids come from: single servers, interleaved servers, caches, datacenter tiers, and
the default source."""

from __future__ import annotations

from .base import TicketSource
from .cache import CachedSource
from .datacenter import DatacenterTier
from .default import configure
from .server import TicketServer
from .servers import TicketServers

__all__ = [
    "CachedSource",
    "DatacenterTier",
    "TicketServer",
    "TicketServers",
    "TicketSource",
    "configure",
]
