"""The registry that picks a backend by SQLAlchemy dialect name: shared code asks it for the
backend of a dialect and calls its methods; it never tests ``dialect.name`` itself."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from ..errors import TicketsError
from .base import TicketBackend

# Backend modules are imported lazily: a SQLite user need not have psycopg installed.
_MODULES = {
    "sqlite": "sqlalchemy_tickets.dialects.sqlite",
    "postgresql": "sqlalchemy_tickets.dialects.postgresql",
    "mysql": "sqlalchemy_tickets.dialects.mysql",
    "mariadb": "sqlalchemy_tickets.dialects.mysql",
}
_registry: dict[str, TicketBackend] = {}
_registry_lock = threading.Lock()


def register_backend(*names: str) -> Any:
    """Class decorator: register a :class:`TicketBackend` subclass for these dialect names."""

    def decorate(cls: type[TicketBackend]) -> type[TicketBackend]:
        instance = cls()
        with _registry_lock:
            for name in names:
                _registry[name] = instance
        return cls

    return decorate


def loaded_backends() -> list[TicketBackend]:
    """The backends imported so far (one instance each, whatever its number of names)."""
    with _registry_lock:
        return list({id(b): b for b in _registry.values()}.values())


def every_backend() -> list[TicketBackend]:
    """Every backend, importing the modules not loaded yet (none imports a driver): to classify
    an error whose dialect is not known, as ``is_retryable`` must."""
    for module in set(_MODULES.values()):
        importlib.import_module(module)
    return loaded_backends()


def backend_for(dialect_name: str) -> TicketBackend:
    """The backend for a SQLAlchemy dialect name (``"postgresql"``, ``"mysql"``, ...)."""
    backend = _registry.get(dialect_name)
    if backend is None:
        module = _MODULES.get(dialect_name)
        if module is None:
            supported = ", ".join(sorted(_MODULES))
            raise TicketsError(
                f"no ticket backend for the {dialect_name!r} dialect; supported: {supported}"
            )
        importlib.import_module(module)
        backend = _registry[dialect_name]
    return backend
