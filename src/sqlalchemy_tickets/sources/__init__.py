"""Where ticket ids come from: single servers, interleaved servers, and the default source."""

from __future__ import annotations

from .base import TicketSource
from .cache import CachedSource
from .default import configure
from .server import TicketServer
from .servers import TicketServers

__all__ = ["CachedSource", "TicketServer", "TicketServers", "TicketSource", "configure"]
