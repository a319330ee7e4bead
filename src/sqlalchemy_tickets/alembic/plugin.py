"""The package's Alembic plugin (Alembic ≥ 1.18), loaded through the ``alembic.plugins`` entry
point that ``pyproject.toml`` publishes::

    [project.entry-points."alembic.plugins"]
    "alembic.autogenerate.sqlalchemy_tickets" = "sqlalchemy_tickets.alembic.plugin"

Alembic imports every such module when it is itself imported and calls its :func:`setup`, so a
project made with a plain ``alembic init`` gets the operations (``op.create_ticket_table`` and
the others), their renderers and the autogenerate comparator, with no edit to ``env.py`` or
``script.py.mako``.

Why that name: Alembic runs a plugin's comparators only when the plugin's name matches
``context.configure(autogenerate_plugins=[...])``, whose default, ``["alembic.autogenerate.*"]``,
matches Alembic's own plugins and this one — any other name would need that edit to ``env.py``.
A project that wants the comparator off leaves it out of that list
(``"~alembic.autogenerate.sqlalchemy_tickets"``) or passes
``sqlalchemy_tickets_autogenerate=False``.

Alembic < 1.18 has no plugins: ``import sqlalchemy_tickets.alembic`` in ``env.py`` registers the
same things, the comparator in Alembic's global registry (see :func:`register`).

The plugin's first comparator runs ahead of Alembic's table comparison and leaves the library's
own tables out of it (ticket tables, the stamp table, a tier's and the lease table, when the
models do not declare them): a second autogenerate neither proposes nor logs their removal.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Plugin and PriorityDispatchResult: Alembic >= 1.18 only
    from alembic.autogenerate.api import AutogenContext
    from alembic.operations import ops
    from alembic.runtime.plugins import Plugin
    from alembic.util import PriorityDispatchResult

__all__ = ["NAME", "register", "setup"]

#: The plugin's name: the entry point's, and what ``autogenerate_plugins`` patterns match.
NAME = "alembic.autogenerate.sqlalchemy_tickets"


def setup(plugin: Plugin) -> None:
    """Register the operations, their implementations and renderers, and the autogenerate
    comparator on ``plugin``. Alembic calls it while it is still importing
    ``alembic.autogenerate``, so nothing here or in the modules it imports may import from that
    package's ``__init__``, its ``api`` or its ``compare`` at import time (the ``render``
    submodule, ``alembic.operations`` and ``alembic.util`` are fine)."""
    from alembic.util import DispatchPriority

    from . import ops, render, toimpl  # noqa: F401  (they register on import)

    # Before Alembic's own table comparison: the library's tables are left out of it.
    plugin.add_autogenerate_comparator(_hide, "schema", priority=DispatchPriority.FIRST)
    # After it: the library's operations, from the tables Alembic proposes and the models.
    plugin.add_autogenerate_comparator(_compare, "schema", priority=DispatchPriority.LAST)


def _hide(
    autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps, schemas: Any
) -> PriorityDispatchResult:
    from alembic.util import PriorityDispatchResult

    from .compare import hide_library_tables

    hide_library_tables(autogen_context)
    return PriorityDispatchResult.CONTINUE


def _compare(
    autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps, schemas: Any
) -> PriorityDispatchResult:
    from alembic.util import PriorityDispatchResult

    from .compare import compare_ticket_tables

    compare_ticket_tables(autogen_context, upgrade_ops, schemas)
    return PriorityDispatchResult.CONTINUE


def register() -> None:
    """What ``import sqlalchemy_tickets.alembic`` runs: make sure the comparator takes part in
    autogenerate, exactly once, on any supported Alembic.

    - Alembic < 1.18: into the global registry (the only one there is), and the library's
      tables left out of every comparison (``hide_library_tables_globally``).
    - Alembic ≥ 1.18 with the package installed: nothing; Alembic loads the entry point.
    - Alembic ≥ 1.18 without the entry point (the source tree on ``sys.path``, not installed):
      set the plugin up by hand, as the entry point would.
    """
    try:
        from alembic.runtime.plugins import Plugin
    except ImportError:
        from .compare import hide_library_tables_globally, register_globally

        register_globally()
        hide_library_tables_globally()
        return
    if _published():
        return
    try:
        Plugin.setup_plugin_from_module(sys.modules[__name__], NAME)
    except ValueError:  # "already registered": set up by hand before
        pass


class _PluginModule(types.ModuleType):
    """This module's class: a module that is also a collection of one module, itself.

    Alembic 1.18.0 to 1.19.1 iterate what an entry point names (``for mod in entry.load()``),
    so a plain module there would make every ``import alembic`` fail; later versions take the
    module itself, and warn about a collection. Both get what they expect."""

    def __iter__(self) -> Iterator[types.ModuleType]:
        yield self


sys.modules[__name__].__class__ = _PluginModule


def _published() -> bool:
    """Whether the installed distribution publishes this module as an Alembic plugin."""
    # This runs on every `import alembic` (which loads the plugin): read the entry points of
    # this distribution alone, not those of every installed one (tens of milliseconds).
    try:
        entries = metadata.distribution("sqlalchemy-tickets").entry_points
    except metadata.PackageNotFoundError:
        return False
    return any(e.group == "alembic.plugins" and e.value == __name__ for e in entries)
