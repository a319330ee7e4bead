"""One module per database backend, chosen from a registry by SQLAlchemy dialect name."""

from __future__ import annotations

from ..errors import DriverNotInstalledError
from ._registry import backend_for, register_backend
from .base import TicketBackend

__all__ = ["DriverNotInstalledError", "TicketBackend", "backend_for", "register_backend"]
