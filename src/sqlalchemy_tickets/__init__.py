"""sqlalchemy-tickets: globally unique, compact, time-ordered primary keys for SQLAlchemy.

Ids are given to objects before the INSERT — from Flickr-style ticket servers, or computed in the
application — so a unit of work that timed out can be retried with the same keys.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .errors import (
    ExhaustedError,
    StrideMismatchError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from .sources import CachedSource, TicketServer, TicketServers, TicketSource, configure
from .types import TicketId

try:
    __version__ = version("sqlalchemy-tickets")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "CachedSource",
    "ExhaustedError",
    "StrideMismatchError",
    "TicketId",
    "TicketServer",
    "TicketServerUnavailable",
    "TicketServers",
    "TicketSource",
    "TicketsError",
    "UnknownSequenceError",
    "__version__",
    "configure",
]
