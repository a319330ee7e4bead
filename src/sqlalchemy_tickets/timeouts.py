"""Bound every round trip of an application engine, so a hung server becomes a retryable error.

``apply_timeouts(engine, 5.0)``: connects, statements, COMMITs and ROLLBACKs that take longer
fail with the driver's connection error, which :func:`~sqlalchemy_tickets.retry_session`
retries. PyMySQL gets its own connect/read/write timeouts; psycopg, which has no client-side read
timeout, gets connections whose calls are bounded by the library's watchdog (it shuts the
socket down when a call outlives its deadline). Each backend module says how.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from .dialects import backend_for
from .errors import TicketsError

__all__ = ["apply_timeouts"]


def apply_timeouts(engine: Engine, seconds: float) -> Engine:
    """Give every new connection of ``engine`` a ``seconds`` bound on each round trip.

    Connections already pooled are closed first, so the bound holds for all of them. Returns
    ``engine``.
    """
    if not seconds > 0:
        raise TicketsError(f"a timeout must be a positive number of seconds, not {seconds!r}")
    backend = backend_for(engine.dialect.name)

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return backend.connect_with_timeout(dialect, cargs, cparams, seconds)

    engine.dispose()
    return engine
