"""One module per database backend, chosen from a registry by SQLAlchemy dialect name."""

from __future__ import annotations

from ..errors import DriverNotInstalledError
from .base import TicketBackend, backend_for, register_backend

__all__ = ["DriverNotInstalledError", "TicketBackend", "backend_for", "register_backend"]
