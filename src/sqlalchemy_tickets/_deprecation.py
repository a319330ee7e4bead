"""Old spellings of public names, kept working with a :class:`DeprecationWarning` that names the
new one. Every alias made here is listed in the CHANGELOG under "Deprecated"."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated_alias", "renamed_keyword", "time_ns_keyword", "warn_renamed"]

_T = TypeVar("_T")


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is a deprecated spelling of ``new``."""
    warnings.warn(
        f"{old} is deprecated; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def deprecated_alias(new: Callable[..., _T], old_name: str) -> Callable[..., _T]:
    """A method named ``old_name`` that warns and calls ``new`` (a method of the same class)."""
    new_name = new.__name__

    def alias(self: Any, *args: Any, **kwargs: Any) -> _T:
        warn_renamed(f"{type(self).__name__}.{old_name}()", f"{new_name}()")
        return getattr(self, new_name)(*args, **kwargs)  # type: ignore[no-any-return]

    alias.__name__ = alias.__qualname__ = old_name
    alias.__doc__ = f"Deprecated alias of :meth:`{new_name}`."
    return alias


def renamed_keyword(
    where: str,
    old: str,
    new: str,
    old_value: _T | None,
    new_value: _T | None,
    *,
    stacklevel: int = 4,
) -> _T | None:
    """The value of keyword ``new``, taking a deprecated ``old`` spelling (with a warning);
    both given is a ``TypeError``."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where} takes {new}= (or the deprecated {old}=), not both")
    warn_renamed(f"{where}({old}=...)", f"{new}=", stacklevel=stacklevel)
    return old_value


def time_ns_keyword(
    where: str, time_ns: Callable[[], int] | None, clock: Callable[[], int] | None
) -> Callable[[], int]:
    """A generator's time source: ``time_ns=``, or its deprecated spelling ``clock=`` (which
    sources use for float monotonic seconds), or ``time.time_ns``."""
    return renamed_keyword(where, "clock", "time_ns", clock, time_ns, stacklevel=5) or time.time_ns
