"""URL schemes that name a source other than a database: ``zookeeper://h1:2181,h2:2181/path``.

Wherever the library takes a URL (``configure(url)``, the command line's ``--url``), a URL whose
scheme is registered here is handed to its scheme's module; any other is a database URL for
SQLAlchemy. A scheme is a name and the module that knows it, imported only when such a URL is
used, which must have:

* ``parse_url(text) -> dict`` — the keyword arguments of its source, checked with no I/O and
  without the scheme's client library (a bad URL is a :class:`TicketsError`);
* ``from_url(text, **options)`` — the source (an :class:`AdminTarget` too: the command line
  creates, reads, moves and draws from it).

Registering a scheme is one line in :data:`SCHEMES`; shared code asks :func:`scheme_of`, never
the text of a URL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Protocol, runtime_checkable

from ..errors import TicketsError

__all__ = ["SCHEMES", "AdminTarget", "SourceUrl", "parse", "scheme_of"]


@dataclass(frozen=True)
class Scheme:
    """One registered scheme: where its parser and builder live, and an example for messages."""

    name: str
    module: str
    example: str
    extra: str


#: Scheme name → what knows it. Modules are imported only when a URL of theirs is used.
SCHEMES: dict[str, Scheme] = {
    "zookeeper": Scheme(
        "zookeeper", "sqlalchemy_tickets.sources.zookeeper",
        "zookeeper://h1:2181,h2:2181,h3:2181/sqlalchemy-tickets", "zookeeper",
    ),
}


def scheme_of(text: object) -> Scheme | None:
    """The registered scheme of ``text`` (``None``: not a string, or a database URL)."""
    if not isinstance(text, str):
        return None
    name, sep, _ = text.partition("://")
    return SCHEMES.get(name.strip().lower()) if sep else None


@dataclass(frozen=True)
class SourceUrl:
    """A checked URL of a registered scheme (no I/O, no client library needed)."""

    scheme: Scheme
    text: str
    options: dict[str, Any]

    def __str__(self) -> str:
        return self.text

    def render_as_string(self, hide_password: bool = True) -> str:
        """As SQLAlchemy's ``URL`` says it (these URLs carry no password)."""
        return self.text

    def build(self, **options: Any) -> AdminTarget:
        """The source it names (``options`` added to the URL's)."""
        make: Callable[..., AdminTarget] = import_module(self.scheme.module).from_url
        return make(self.text, **options)


def parse(text: str) -> SourceUrl:
    """``text`` checked by its scheme's module; :class:`TicketsError` if it is not a URL of a
    registered scheme or is malformed."""
    scheme = scheme_of(text)
    if scheme is None:
        raise TicketsError(f"{text!r} is not a URL of a registered scheme ({', '.join(SCHEMES)})")
    options: dict[str, Any] = import_module(scheme.module).parse_url(text)
    return SourceUrl(scheme, text, options)


@runtime_checkable
class AdminTarget(Protocol):
    """What the command line does with a source named by a registered URL.

    ``describe`` answers an object with ``last`` (the highest id issued) or ``None`` for a
    sequence that does not exist; ``sync_above`` never lowers (a :class:`TicketsError` when
    asked to, nothing changed)."""

    url: str
    timeout: float

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int: ...

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range: ...

    def create(self, sequence: str | None, *, bits: int = 64, start: int = 1) -> bool: ...

    def describe(self, sequence: str | None, *, bits: int = 64) -> Any: ...

    def sequences(self) -> list[tuple[str | None, int]]: ...

    def sync_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> Any: ...

    def close(self) -> None: ...
