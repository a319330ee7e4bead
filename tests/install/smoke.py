"""What a new user does first, run with the ``python`` of a fresh venv where only the built wheel
was installed, without extras (``make test`` does this; see the Makefile's ``installed`` target).

Checks: the package and every public module import from site-packages (not the source tree) with
none of the optional packages present; ``py.typed`` ships; a ``TicketId`` model flushes on a SQLite
file and gets increasing ids; ``uuid7()`` works without ``uuid_utils``; the console script runs
``demo`` in an empty directory and ``--help``; a bad argument exits 2 with a usage line and no
traceback. Prints one line per check; any failure exits non-zero with the reason.
"""

# No ``from __future__ import annotations``: the models below are declared inside a function, and
# SQLAlchemy resolves string annotations in the module namespace, where ``Mapped`` is not.
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: Packages that come only with an extra (or the dev tools); none may be installed here.
OPTIONAL = ("greenlet", "uuid_utils", "psycopg", "pymysql", "opentelemetry", "pymongo",
            "bson", "tenacity", "aiomysql", "asyncpg", "kazoo")


def check(label: str, condition: bool, detail: object = "") -> None:
    if not condition:
        raise SystemExit(f"FAIL {label}: {detail}")
    print(f"ok   {label}")


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    present = [name for name in OPTIONAL if importlib.util.find_spec(name) is not None]
    check("no optional package installed", present == [], present)

    import sqlalchemy

    import sqlalchemy_tickets

    where = Path(sqlalchemy_tickets.__file__).resolve()
    check("imported from site-packages", site in where.parents, where)
    check("py.typed ships", (where.parent / "py.typed").is_file())
    check("__version__ from the installed metadata",
          sqlalchemy_tickets.__version__ not in ("", "0.0.0"), sqlalchemy_tickets.__version__)
    print(f"     sqlalchemy-tickets {sqlalchemy_tickets.__version__}, SQLAlchemy "
          f"{sqlalchemy.__version__}, Python {sys.version.split()[0]}")

    public = [info.name for info in pkgutil.walk_packages(
        sqlalchemy_tickets.__path__, "sqlalchemy_tickets.")
        if not any(part.startswith("_") for part in info.name.split(".")[1:])]
    for name in public:
        importlib.import_module(name)
    loaded = sorted({n.split(".")[0] for n in sys.modules} & set(OPTIONAL))
    check(f"{len(public)} public modules import", loaded == [], loaded)
    check("sqlalchemy.ext.asyncio not imported", "sqlalchemy.ext.asyncio" not in sys.modules)

    zookeeper_without_kazoo()
    with tempfile.TemporaryDirectory() as tmp:
        flush_on_sqlite(Path(tmp) / "app.db")
        console_script(Path(tmp))


def zookeeper_without_kazoo() -> None:
    from sqlalchemy_tickets import DriverNotInstalledError, TicketsError, ZooKeeperSource

    try:
        ZooKeeperSource("127.0.0.1:2181")
    except TicketsError as error:
        check("ZooKeeperSource without kazoo names the extra",
              isinstance(error, DriverNotInstalledError)
              and "sqlalchemy-tickets[zookeeper]" in str(error), error)
    else:
        check("ZooKeeperSource without kazoo names the extra", False, "no error")


def flush_on_sqlite(path: Path) -> None:
    from sqlalchemy import String, create_engine, select
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    from sqlalchemy_tickets import UUID7, TicketId
    from sqlalchemy_tickets.generators import uuid7

    class Base(DeclarativeBase):
        pass

    class Post(Base):
        __tablename__ = "posts"
        id: Mapped[int] = mapped_column(TicketId(), primary_key=True)
        title: Mapped[str] = mapped_column(String(50))

    class Event(Base):
        __tablename__ = "events"
        id = mapped_column(UUID7(), primary_key=True)

    engine = create_engine(f"sqlite:///{path}")
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            posts = [Post(title=f"post {i}") for i in range(3)]
            session.add_all(posts)
            session.add(Event())
            session.flush()
            ids = [p.id for p in posts]
            session.commit()
        check("TicketId flush on a SQLite file", ids == sorted(ids) and len(set(ids)) == 3, ids)
        with Session(engine) as session:
            stored = session.scalars(select(Post.id).order_by(Post.id)).all()
            event = session.scalars(select(Event.id)).one()
        check("ids stored", list(stored) == ids, stored)
        check("UUID7 column default without uuid_utils", event.version == 7, event)
        check("uuid7() increases", uuid7() < uuid7())
    finally:
        engine.dispose()


def console_script(tmp: Path) -> None:
    suffix = ".exe" if os.name == "nt" else ""
    script = Path(sys.executable).parent / f"sqlalchemy-tickets{suffix}"
    check("console script installed", script.is_file(), script)
    demo_dir = tmp / "demo"
    demo_dir.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], cwd=demo_dir, capture_output=True,
                              text=True, timeout=120)

    demo = run("demo")
    check("sqlalchemy-tickets demo", demo.returncode == 0, demo.stdout + demo.stderr)
    help_ = run("--help")
    check("sqlalchemy-tickets --help", help_.returncode == 0 and "usage:" in help_.stdout,
          help_.stdout + help_.stderr)
    for bad in (["--no-such-option"], ["next", "--count", "many"]):
        result = run(*bad)
        check(f"sqlalchemy-tickets {' '.join(bad)} exits 2 without a traceback",
              result.returncode == 2 and "Traceback" not in result.stderr
              and "usage:" in result.stderr,
              f"exit {result.returncode}: {result.stderr}")
    zk = run("next", "--url", "zookeeper://127.0.0.1:2181/tickets", "photos")
    check("sqlalchemy-tickets next --url zookeeper://... without kazoo names the extra",
          zk.returncode == 1 and "sqlalchemy-tickets[zookeeper]" in zk.stderr
          and zk.stderr.count("\n") == 1 and "Traceback" not in zk.stderr,
          f"exit {zk.returncode}: {zk.stderr}")
    module = subprocess.run([sys.executable, "-m", "sqlalchemy_tickets", "--help"],
                            cwd=demo_dir, capture_output=True, text=True, timeout=60)
    check("python -m sqlalchemy_tickets --help", module.returncode == 0, module.stderr)


if __name__ == "__main__":
    main()
