"""Nothing optional is imported at import time.

A plain ``pip install sqlalchemy-tickets`` brings SQLAlchemy and Alembic only: no greenlet (so no
``sqlalchemy.ext.asyncio``), no drivers, no uuid_utils, pymongo/bson or OpenTelemetry. In a fresh
interpreter those modules are made unimportable, and any attempt the package's own modules make to
import one while being imported is recorded: importing the package and every public submodule
must succeed and attempt none of them. (SQLAlchemy's own probes, e.g. for greenlet, are its
business and are not counted.) The same holds as installed: see ``test_as_installed.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: Importable only through an extra, or not a dependency at all.
OPTIONAL = (
    "greenlet",
    "sqlalchemy.ext.asyncio",
    "uuid_utils",
    "pymongo",
    "bson",
    "opentelemetry",
    "psycopg",
    "pymysql",
    "aiomysql",
    "asyncpg",
    "tenacity",
)

PROBE = """
import importlib, importlib.abc, json, pkgutil, sys

OPTIONAL = {optional!r}
attempts = []

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not any(name == o or name.startswith(o + ".") for o in OPTIONAL):
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(
                ("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        if importer.split(".")[0] == "sqlalchemy_tickets":
            attempts.append([importer, name])
        raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)

for name in list(sys.modules):
    if any(name == o or name.startswith(o + ".") for o in OPTIONAL):
        del sys.modules[name]
sys.meta_path.insert(0, Blocker())

import sqlalchemy_tickets
imported = ["sqlalchemy_tickets"]
for info in pkgutil.walk_packages(sqlalchemy_tickets.__path__, "sqlalchemy_tickets."):
    if any(part.startswith("_") for part in info.name.split(".")[1:]):
        continue  # private modules: reached through the public ones that use them
    importlib.import_module(info.name)
    imported.append(info.name)
loaded = sorted(n for n in sys.modules
                if any(n == o or n.startswith(o + ".") for o in OPTIONAL))
print(json.dumps({{"imported": imported, "attempts": attempts, "loaded": loaded}}))
"""


def test_package_and_every_public_submodule_import_without_optional_modules() -> None:
    code = textwrap.dedent(PROBE.format(optional=OPTIONAL))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"import failed without the optional modules:\n{result.stderr}"
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["attempts"] == [], "modules import optional packages at import time"
    assert report["loaded"] == []
    # The walk found the package's modules, not just the top level.
    assert {"sqlalchemy_tickets.cli", "sqlalchemy_tickets.retry",
            "sqlalchemy_tickets.alembic"} <= set(report["imported"])


def test_the_bare_import_leaves_what_only_some_columns_and_callers_need() -> None:
    """``import sqlalchemy_tickets`` stays close to ``import sqlalchemy.orm``: SQLAlchemy's MySQL
    dialect package is loaded when a string id column is defined, the installed metadata when
    ``__version__`` is read."""
    code = textwrap.dedent("""
        import json, sys
        import sqlalchemy.orm
        before = set(sys.modules)
        import sqlalchemy_tickets
        after = set(sys.modules)
        sqlalchemy_tickets.PrefixedId("post")
        print(json.dumps({
            "mysql": "sqlalchemy.dialects.mysql" in after,
            "metadata_added": "importlib.metadata" in after - before,
            "mysql_after_column": "sqlalchemy.dialects.mysql" in sys.modules,
            "version": sqlalchemy_tickets.__version__,
        }))
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["mysql"] is False
    assert report["metadata_added"] is False
    assert report["mysql_after_column"] is True
    assert report["version"] not in ("", "0.0.0")
