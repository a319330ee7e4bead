"""A record from its prefixed id alone: ``lookup(session, "post_01h455vb4pex5vsknk084sn02q")``.

A prefix such as ``post_`` or ``pay_`` tells "the entity type given just the ID": the mapped
class whose primary key is a single ``PrefixedId("post")`` column owns the prefix ``post``, and
:func:`lookup` loads the record with one ``session.get`` on that class — no SQL at all when the
object is already in the session's identity map.

How the prefix finds its class:

* When SQLAlchemy configures mappers, every mapper whose primary key is one ``PrefixedId``
  column claims that column's prefix (the ``before_mapper_configured`` event). Within one
  declarative registry a prefix has one owner: a second class claiming it fails the
  configuration with a :class:`~sqlalchemy_tickets.TicketsError` naming both classes (and
  every later attempt to configure that registry, until one of them gets another prefix).
* Subclasses (joined or single-table inheritance) share their base's primary key and so its
  prefix; ``session.get`` on the base returns the right subclass. A concrete subclass has its
  own table and may have its own prefix; a concrete hierarchy sharing one prefix is looked up
  through its topmost class with that prefix (map it polymorphically, e.g. ``ConcreteBase``).
* Several registries may claim one prefix (test suites often declare ``Post`` in several
  modules): :func:`lookup` then refuses to guess and raises, unless told which registry
  (``registry=`` a ``registry`` or a declarative base).
* The prefix → class map is kept from those events and rebuilt after each configuration, not
  per call. :func:`lookup` configures mappers first if any were declared since the last
  configuration (like ``sqlalchemy.orm.configure_mappers``), so a class declared but not yet
  used is found.

Values are checked before any SQL: a value that is not a string (or a ``typeid.TypeID``), a
malformed body or an unknown prefix raises :class:`~sqlalchemy_tickets.TicketsError` naming the
prefixes that are known.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.orm import Mapper, Session, configure_mappers, scoped_session
from sqlalchemy.orm import registry as Registry

from .columns import PrefixedId
from .errors import TicketsError
from .generators.prefixed import _pattern, show, split

if TYPE_CHECKING:  # never at run time: the asyncio extension may not be installed
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

__all__ = ["async_lookup", "lookup", "owner_of", "prefix_owners"]

log = logging.getLogger(__name__)


class _Owner:
    """The class that owns a prefix, as the fast path of :func:`lookup` needs it."""

    __slots__ = ("mapper", "match")

    def __init__(self, mapper: Mapper[Any], prefix: str) -> None:
        # Weakly held, like everything here: a registry's classes may be collected.
        self.mapper = weakref.ref(mapper)
        #: Matches whole well-formed ids of the prefix.
        self.match = _pattern(prefix).match


# Guards _claims and the swap of _owners. Mapper events already run under SQLAlchemy's own
# configure lock; this one also covers lookup's slow path, which runs outside it.
_lock = threading.RLock()
#: prefix -> mappers claiming it (each the topmost claimant of its hierarchy), weakly held so
#: a disposed registry's classes can be collected.
_claims: dict[str, list[weakref.ref[Mapper[Any]]]] = {}
#: prefix -> its single live owner, for the fast path. Replaced whole, never mutated in place.
_owners: dict[str, _Owner] = {}
#: Mappers constructed so far, and the count at the last configuration lookup asked for: when
#: they differ, some class may not have claimed its prefix yet.
_mappers_made = 0
_mappers_configured = -1


def _claimed_prefix(mapper: Mapper[Any]) -> str | None:
    """The prefix ``mapper`` claims, or None if its primary key is not one PrefixedId column."""
    if mapper.inherits is not None and not mapper.concrete:
        return None  # shares its base's primary key, so its base's prefix
    if getattr(mapper, "non_primary", False):  # SQLAlchemy 2.0's deprecated extra mappers
        return None
    key = mapper.primary_key
    if len(key) != 1:
        return None
    column_type = key[0].type
    return column_type.prefix if isinstance(column_type, PrefixedId) else None


def _alive(ref: weakref.ref[Mapper[Any]]) -> Mapper[Any] | None:
    mapper = ref()
    if mapper is None or getattr(mapper, "_dispose_called", False):
        return None
    return mapper


def _live(prefix: str) -> list[Mapper[Any]]:
    """The live claimants of ``prefix``, dropping those of disposed registries (lock held)."""
    refs = _claims.get(prefix)
    if not refs:
        return []
    live = [m for m in map(_alive, refs) if m is not None]
    if len(live) != len(refs):
        if live:
            _claims[prefix] = [weakref.ref(m) for m in live]
        else:
            del _claims[prefix]
    return live


def _name(mapper: Mapper[Any]) -> str:
    cls = mapper.class_
    return f"{cls.__module__}.{cls.__qualname__}"


def _on_instrument_class(mapper: Mapper[Any], class_: type[Any]) -> None:
    global _mappers_made
    # Runs inside Mapper() under SQLAlchemy's configure lock, so increments never interleave.
    _mappers_made += 1


def _before_mapper_configured(mapper: Mapper[Any], class_: type[Any]) -> None:
    # Before, not after: SQLAlchemy marks a mapper configured before "mapper_configured" runs,
    # so an error raised there would be forgotten on the next try. Raised here, it leaves the
    # mapper unconfigured, and every later configuration raises it again.
    prefix = _claimed_prefix(mapper)
    if prefix is None:
        return
    with _lock:
        live = _live(prefix)
        for other in live:
            if other is mapper:
                return
            if other.registry is not mapper.registry or other.base_mapper is mapper.base_mapper:
                continue  # another registry (refused at lookup), or one concrete hierarchy
            raise TicketsError(
                f"{_name(mapper)} and {_name(other)} both have a PrefixedId({prefix!r}) primary "
                f"key in one registry: the prefix {prefix!r} must name one class, so that "
                f"lookup() can load a {prefix}_… id. Give one of them another prefix"
            )
        # Within a concrete hierarchy keep only the topmost claimants.
        if any(mapper.isa(other) for other in live if other.base_mapper is mapper.base_mapper):
            return
        kept = [
            other
            for other in live
            if other.base_mapper is not mapper.base_mapper or not other.isa(mapper)
        ]
        _claims[prefix] = [weakref.ref(m) for m in (*kept, mapper)]
        log.debug("%s owns the id prefix %r", _name(mapper), prefix)


def _on_after_configured() -> None:
    with _lock:
        owners: dict[str, _Owner] = {}
        for prefix in list(_claims):
            live = _live(prefix)
            if len(live) == 1:
                owners[prefix] = _Owner(live[0], prefix)
        global _owners
        _owners = owners


event.listen(Mapper, "instrument_class", _on_instrument_class)
event.listen(Mapper, "before_mapper_configured", _before_mapper_configured)
event.listen(Mapper, "after_configured", _on_after_configured)


def _registry_of(where: object) -> Registry:
    if isinstance(where, Registry):
        return where
    found = getattr(where, "registry", None)
    if isinstance(found, Registry):
        return found
    raise TicketsError(
        f"registry= takes a sqlalchemy.orm.registry or a declarative base class, not {where!r}"
    )


def _configure(where: Registry | None) -> None:
    """Configure mappers declared since the last configuration, so they claim their prefixes."""
    global _mappers_configured
    made = _mappers_made
    if made == _mappers_configured:
        return
    if where is not None:
        where.configure(cascade=True)  # only its own claims matter; the others may wait
        return
    configure_mappers()
    with _lock:
        # Read before configuring: a mapper made meanwhile makes the next call configure again.
        _mappers_configured = max(made, _mappers_configured)


def _as_text(value: object) -> str:
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    if hasattr(value, "suffix") and hasattr(value, "prefix"):  # typeid.TypeID
        return str(value)
    raise TicketsError(
        f"lookup() takes an id string like post_01h455vb4pex5vsknk084sn02q, not "
        f"{type(value).__name__}; known prefixes: {_known(None)}"
    )


def _known(where: Registry | None) -> str:
    _configure(where)
    with _lock:
        prefixes = sorted(
            prefix
            for prefix in list(_claims)
            if any(where is None or m.registry is where for m in _live(prefix))
        )
    if not prefixes:
        return "none (no mapped class has a PrefixedId primary key)"
    return ", ".join(f"{p}_…" if p else "no prefix (bare TypeIDs)" for p in prefixes)


def owner_of(value: object, *, registry: object = None) -> type[Any]:
    """The mapped class whose ``PrefixedId`` primary key ``value`` belongs to.

    Raises :class:`TicketsError` (naming the known prefixes) for a value that is not a
    well-formed prefixed id of a known prefix, and when several registries claim the prefix
    and ``registry`` (a ``sqlalchemy.orm.registry`` or a declarative base) does not choose.
    """
    return _owner(_as_text(value), None if registry is None else _registry_of(registry))


def _owner(value: str, where: Registry | None) -> type[Any]:
    _configure(where)
    if where is None:
        owner = _owners.get(value.rpartition("_")[0])
        if owner is not None and owner.match(value):
            mapper = owner.mapper()
            if mapper is not None and not mapper._dispose_called:
                return mapper.class_
    return _owner_slow(value, where)


def _owner_slow(value: str, where: Registry | None) -> type[Any]:
    """Every refusal, lookups restricted to a registry, and owners not (or no longer) cached."""
    global _owners
    try:
        prefix, _ = split(value)
    except TicketsError as error:
        raise TicketsError(f"{error}; known prefixes: {_known(where)}") from None
    with _lock:
        live = [m for m in _live(prefix) if where is None or m.registry is where]
    if not live:
        what = f"the prefix {prefix!r}" if prefix else "a TypeID without a prefix"
        raise TicketsError(
            f"no mapped class has {what} ({show(value)}): no PrefixedId({prefix!r}) primary "
            f"key is mapped{'' if where is None else ' in that registry'}; known prefixes: "
            f"{_known(where)}"
        )
    registries = {id(m.registry) for m in live}
    if len(registries) > 1:
        names = ", ".join(sorted(_name(m) for m in live))
        raise TicketsError(
            f"the id prefix {prefix!r} is claimed in {len(registries)} registries ({names}): "
            "lookup() will not guess; pass registry= (the declarative base or registry of the "
            "class meant)"
        )
    top = [m for m in live if all(other.isa(m) for other in live)]
    if not top:
        names = ", ".join(sorted(_name(m) for m in live))
        raise TicketsError(
            f"the concrete classes {names} share the id prefix {prefix!r} without a mapped "
            "base class of that prefix: map their base polymorphically with the same "
            "PrefixedId primary key, or give each class its own prefix"
        )
    mapper = top[0]
    if where is None and len(live) == 1:
        owner = _Owner(mapper, prefix)
        with _lock:
            _owners = {**_owners, prefix: owner}
    return mapper.class_


def prefix_owners(*, registry: object = None) -> dict[str, list[type[Any]]]:
    """Every prefix claimed so far and the classes claiming it (one, unless the prefix is
    claimed in several registries), configuring pending mappers first."""
    where = None if registry is None else _registry_of(registry)
    _configure(where)
    with _lock:
        found: dict[str, list[type[Any]]] = {}
        for prefix in sorted(_claims):
            classes = [m.class_ for m in _live(prefix) if where is None or m.registry is where]
            if classes:
                found[prefix] = classes
    return found


_SESSIONS = (Session, scoped_session)


def lookup(
    session: Session | scoped_session[Any], value: object, *, registry: object = None
) -> Any:
    """The object whose ``PrefixedId`` primary key is ``value``, or ``None`` if no row has it.

    One ``session.get(owner_class, value)``: no SQL at all when the object is already in the
    session's identity map; with inheritance, the object is of its own subclass.

    Args:
        session: a ``Session`` (or ``scoped_session``); for an ``AsyncSession`` use
            :func:`async_lookup`.
        value: the id, e.g. ``"post_01h455vb4pex5vsknk084sn02q"`` (a ``typeid.TypeID`` too).
        registry: the ``sqlalchemy.orm.registry`` or declarative base to look in, when several
            registries map the same prefix (default: all of them, and such a prefix is an
            error).

    Raises:
        TicketsError: ``value`` is not a well-formed id of a known prefix, or its prefix is
            claimed in several registries — before any SQL is sent. The message names the known
            prefixes.
    """
    # The common case inline (a plain str, a cached owner, nothing new to configure): a lookup
    # is meant to cost little more than the session.get it ends in.
    if registry is None and type(value) is str and _mappers_made == _mappers_configured:
        owner = _owners.get(value.rpartition("_")[0])
        if owner is not None and owner.match(value) and isinstance(session, _SESSIONS):
            mapper = owner.mapper()
            if mapper is not None and not mapper._dispose_called:
                return session.get(mapper.class_, value)
    if not isinstance(session, _SESSIONS):
        raise TicketsError(
            f"lookup() takes a Session, not {type(session).__name__}; for an AsyncSession use "
            "await async_lookup(session, value)"
        )
    text = _as_text(value)
    return session.get(_owner(text, None if registry is None else _registry_of(registry)), text)


async def async_lookup(
    session: AsyncSession | async_scoped_session[Any], value: object, *, registry: object = None
) -> Any:
    """:func:`lookup` for an ``AsyncSession``: ``await async_lookup(session, "post_01h…")``.

    The checks run before the first ``await``; the load is one ``await session.get(...)``.
    """
    if isinstance(session, _SESSIONS):
        raise TicketsError(
            "async_lookup() takes an AsyncSession; for a Session use lookup(session, value)"
        )
    text = _as_text(value)
    owner = _owner(text, None if registry is None else _registry_of(registry))
    return await session.get(owner, text)
