"""Nothing optional is imported at import time.

A plain ``pip install sqlalchemy-tickets`` brings SQLAlchemy and Alembic only: no greenlet (so no
``sqlalchemy.ext.asyncio``), no drivers, no uuid_utils, pymongo/bson, OpenTelemetry or kazoo. In a
fresh interpreter those modules are made unimportable, and any attempt the package's own modules
make to import one while being imported is recorded: importing the package and every public
submodule must succeed and attempt none of them. (SQLAlchemy's own probes, e.g. for greenlet, are
its business and are not counted.) The same holds as installed: see ``test_as_installed.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

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
    "kazoo",
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


#: What ``import sqlalchemy_tickets`` must not import: the sources and the dialect modules (with
#: leases, and SQLAlchemy's compiler extension and multiprocessing's queues they bring), retrying,
#: timeouts, metrics, the test helper, the command line and the Alembic support. Each is imported
#: by what needs it: ``configure``/``TicketServer``/... and the first ids a ``TicketId`` draws
#: (the sources), ``retry_session``, ``apply_timeouts``, ``drop_ticket_tables``, a lease.
NOT_ON_BARE_IMPORT = (
    "sqlalchemy_tickets.sources",
    "sqlalchemy_tickets.dialects",
    "sqlalchemy_tickets.retry",
    "sqlalchemy_tickets.timeouts",
    "sqlalchemy_tickets.metrics",
    "sqlalchemy_tickets._reset",
    "sqlalchemy_tickets.admin",
    "sqlalchemy_tickets.cli",
    "sqlalchemy_tickets.alembic",
    "sqlalchemy_tickets._demo",
)
#: Not imported beyond what ``import sqlalchemy.orm`` imported before it (SQLAlchemy itself may
#: import some of these in another release; what matters is that the package adds none).
NOT_ADDED_BY_BARE_IMPORT = (
    "importlib.metadata",
    "sqlalchemy.dialects.mysql",
    "sqlalchemy.ext.compiler",
    "alembic",
    "secrets",
    "socket",
    "queue",
)

BARE = """
import json, sys
import sqlalchemy.orm
before = set(sys.modules)
import sqlalchemy_tickets
loaded = sorted(set(sys.modules))
added = sorted(set(sys.modules) - before)
{after}
print(json.dumps({{"loaded": loaded, "added": added, **extra}}))
"""


def _probe(after: str = "extra = {}") -> dict[str, Any]:
    code = textwrap.dedent(BARE).format(after=textwrap.dedent(after))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return report


def _under(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_the_bare_import_leaves_the_sources_dialects_and_features_to_their_first_use() -> None:
    """``import sqlalchemy_tickets`` is the column types, the errors and ``lookup`` (whose
    mapper listeners must be in place before models are mapped): a regression here is what made
    the import cost ~1.2x ``import sqlalchemy.orm`` (bench_import.py measures it)."""
    report = _probe()
    assert _under(report["loaded"], NOT_ON_BARE_IMPORT) == []
    assert _under(report["added"], NOT_ADDED_BY_BARE_IMPORT) == []
    assert "sqlalchemy_tickets.columns" in report["loaded"]  # the probe saw the package


def test_a_model_with_every_id_type_is_defined_without_the_sources() -> None:
    """Defining models (what an application does at start) loads no source or dialect module;
    the first flush of a ``TicketId`` model does, and draws its ids."""
    report = _probe("""
        import sqlalchemy as sa
        from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
        from sqlalchemy_tickets import UUID7, ObjectId, PrefixedId, SnowflakeId, TicketId

        class Base(DeclarativeBase):
            pass

        class Photo(Base):
            __tablename__ = "photos"
            id: Mapped[int] = mapped_column(TicketId("Photos"), primary_key=True)
            flake: Mapped[int] = mapped_column(SnowflakeId(worker_id=1))
            uuid: Mapped[object] = mapped_column(UUID7())
            slug: Mapped[str] = mapped_column(PrefixedId("pho"))
            oid: Mapped[str] = mapped_column(ObjectId())

        sa.orm.configure_mappers()
        defined = sorted(sys.modules)
        engine = sa.create_engine("sqlite://")
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            session.add_all([Photo(), Photo()])
            session.commit()
            ids = sorted(session.scalars(sa.select(Photo.id)))
        engine.dispose()
        extra = {"defined": defined, "ids": ids,
                 "flushed": sorted(m for m in sys.modules if m.startswith("sqlalchemy_tickets"))}
    """)
    assert _under(report["defined"], NOT_ON_BARE_IMPORT) == []
    assert report["ids"] == [1, 2]
    assert "sqlalchemy_tickets.sources.default" in report["flushed"]


def test_every_public_name_is_listed_and_resolves() -> None:
    """Names imported when first asked for are still in ``__all__`` and ``dir()``, resolve to
    the objects of their modules, and ``from sqlalchemy_tickets import *`` gets them all; the
    same for the lease names ``sqlalchemy_tickets.generators`` re-exports."""
    report = _probe("""
        import importlib
        import sqlalchemy_tickets.generators as generators
        names = {"package": sqlalchemy_tickets, "generators": generators}
        listed = {k: sorted(set(m.__all__) - set(dir(m))) for k, m in names.items()}
        star = {}
        for key, module in names.items():
            namespace = {}
            exec(f"from {module.__name__} import *", namespace)
            star[key] = sorted(set(module.__all__) - set(namespace))
        homes = {
            "configure": "sqlalchemy_tickets.sources.default",
            "TicketServer": "sqlalchemy_tickets.sources.server",
            "CachedSource": "sqlalchemy_tickets.sources.cache",
            "retry_session": "sqlalchemy_tickets.retry",
            "apply_timeouts": "sqlalchemy_tickets.timeouts",
            "drop_ticket_tables": "sqlalchemy_tickets._reset",
        }
        same = {n: getattr(sqlalchemy_tickets, n) is getattr(importlib.import_module(m), n)
                for n, m in homes.items()}
        lease = importlib.import_module("sqlalchemy_tickets.sources.lease")
        same["WorkerLease"] = generators.WorkerLease is lease.WorkerLease
        try:
            sqlalchemy_tickets.no_such_name
            missing = "no error"
        except AttributeError as error:
            missing = str(error)
        extra = {"listed": listed, "star": star, "same": same, "missing": missing}
    """)
    assert report["listed"] == {"package": [], "generators": []}
    assert report["star"] == {"package": [], "generators": []}
    assert all(report["same"].values()), report["same"]
    assert "no attribute 'no_such_name'" in report["missing"]


def test_the_alembic_support_registers_without_the_sources() -> None:
    """Every ``import alembic`` (>= 1.18) loads the package's plugin through its entry point, so
    the Alembic support registers its operations, implementations and renderers without the
    sources or the dialect modules, which only running an operation or autogenerate needs.
    (``import sqlalchemy_tickets.alembic`` after it: what Alembic < 1.18 needs, a no-op after
    the plugin.)"""
    code = textwrap.dedent("""
        import json, sys
        import alembic
        import sqlalchemy_tickets.alembic
        from alembic.operations import Operations
        registered = [n for n in ("create_ticket_table", "sync_ticket_sequence",
                                  "create_datacenter_tables", "create_worker_lease_table")
                      if hasattr(Operations, n)]
        print(json.dumps({"loaded": sorted(sys.modules), "registered": registered}))
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert len(report["registered"]) == 4
    alembic_support = ("sqlalchemy_tickets.alembic",)
    others = tuple(m for m in NOT_ON_BARE_IMPORT if m not in alembic_support)
    assert _under(report["loaded"], others) == []


def test_migrations_run_and_autogenerate_without_the_runtime_sources() -> None:
    """The Alembic support takes every statement from the schema module: running each
    operation (online on SQLite, offline for every dialect) and an autogenerate comparison of
    ``TicketId`` models loads no module of ``sqlalchemy_tickets.sources`` (the runtime: pools,
    threads, caches), which a migration does not need."""
    code = textwrap.dedent("""
        import io, json, sys
        import sqlalchemy as sa
        import sqlalchemy_tickets.alembic
        from alembic.autogenerate import produce_migrations
        from alembic.migration import MigrationContext
        from alembic.operations import Operations
        from sqlalchemy_tickets import TicketId

        def every_operation(op):
            op.create_ticket_table("photos")
            op.create_ticket_tables(["tags", None], bits=32)
            op.sync_ticket_sequence("photos", "photos", "id")
            op.create_worker_lease_table()
            op.create_datacenter_tables()
            op.drop_datacenter_tables()
            op.drop_worker_lease_table()
            op.drop_ticket_tables(["tags", None], bits=32)
            op.drop_ticket_table("photos")

        for dialect in ("sqlite", "postgresql", "mysql"):
            context = MigrationContext.configure(dialect_name=dialect, opts={
                "as_sql": True, "output_buffer": io.StringIO(), "literal_binds": True})
            every_operation(Operations(context))
        engine = sa.create_engine("sqlite://")
        metadata = sa.MetaData()
        sa.Table("photos", metadata, sa.Column("id", TicketId("photos"), primary_key=True))
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
            every_operation(Operations(MigrationContext.configure(conn)))
            produce_migrations(MigrationContext.configure(conn), metadata)
        print(json.dumps(sorted(n for n in sys.modules if n.startswith("sqlalchemy_tickets."))))
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert "sqlalchemy_tickets._schema" in loaded  # the statements' one home
    assert _under(loaded, ("sqlalchemy_tickets.sources",)) == []
