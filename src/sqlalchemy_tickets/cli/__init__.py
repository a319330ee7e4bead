"""The ``sqlalchemy-tickets`` command: ``demo``, ``init``, ``next``, ``status``, ``sync``,
``restride``, ``lookup``.

Ticket servers come from ``--url`` (repeatable), else ``--config FILE``, else the
``TICKETS_URL`` environment variable (URLs separated by spaces or commas), else
``sqlalchemy-tickets.ini`` in the current directory (``[tickets]`` section, ``urls =`` one per
line).

Every run has two phases. First the arguments are checked — URLs parsed and their backends
known, sequence and identifier names, strides, counts, the config file — with nothing read or
written; a bad argument exits 2. Then the command runs; a failure (a server that does not
answer, an unknown sequence, a stride that disagrees) prints one line on stderr and exits 1.
Never a traceback (``-v`` logs it).

Exit codes: 0 done; 1 the operation failed; 2 bad arguments; 3 ``status`` found something to
act on (a sequence past 80 % of an id space, an ``--upstream`` that does not answer, a datacenter
tier whose upstream is exhausted or whose runway is under ``--min-runway``); 4 ``lookup`` found
no row with the id.

``lookup --url URL --models MODULE ID`` is the one command about the application's own rows:
``--url`` is the application's database, not a ticket server.

Subcommands are entries of :data:`COMMANDS`, each registered with :func:`command`: a name, a
help line, a function adding its arguments, a ``check`` run in the first phase and a ``run``.
One module per command (``_init``, ``_next``, ``_status``, ``_sync``, ``_lookup``); what they
share is in ``_common``, the driver in ``_driver``. A ``--url`` of a registered scheme other than
a database (``zookeeper://h1:2181,h2:2181/path``: :mod:`sqlalchemy_tickets.sources._urls`)
names a source that ``init``, ``next``, ``status`` and ``sync`` reach through ``_sources``.
"""

from __future__ import annotations

from . import _init, _lookup, _next, _status, _sync  # noqa: F401 - registers the subcommands
from ._common import (
    BLOCK,
    COMMANDS,
    CONFIG_FILE,
    DEMO_FILE,
    MAX_COUNT,
    Command,
    command,
    resolve_urls,
)
from ._driver import main, parser
from ._lookup import NOT_FOUND
from ._status import _columns, _duration

__all__ = [
    "BLOCK",
    "COMMANDS",
    "CONFIG_FILE",
    "DEMO_FILE",
    "MAX_COUNT",
    "NOT_FOUND",
    "Command",
    "command",
    "main",
    "parser",
    "resolve_urls",
]

# --help lists the subcommands in this order (their modules are imported in another).
_ORDER = ("demo", "init", "next", "status", "sync", "restride", "lookup")
_registered = dict(COMMANDS)
COMMANDS.clear()
COMMANDS.update({name: _registered[name] for name in _ORDER if name in _registered})
COMMANDS.update(_registered)

# Private helpers some callers (the tests) import from here, as from the single module it was.
_ = (_columns, _duration)
