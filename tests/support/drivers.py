"""Fresh virtualenvs holding the package and a chosen set of database drivers, nothing else, so
a test sees what a user with only those drivers installed sees.

Each is built once per test session with uv (``tests/install/uv_pip.py``: the indexes pip is
configured with) and the interpreter running the tests. SQLAlchemy, alembic, greenlet and any
driver the running environment has too are pinned to the versions installed here: the
lowest-versions run then checks the lowest versions in its fresh venvs as well. The package is
installed editable, so a venv sees the working tree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV_PIP = ROOT / "tests" / "install" / "uv_pip.py"
#: Seconds a venv may take to build (uv, with its cache, takes a few).
BUILD_TIMEOUT = 600
#: Distributions pinned to the running environment's versions when a venv gets them.
_PINNED = ("sqlalchemy", "alembic", "greenlet", "typing-extensions", "mako", "markupsafe")


def _has_pip_and_uv(python: Path) -> bool:
    probe = subprocess.run(
        [str(python), "-c", "import pip, uv"], capture_output=True, timeout=60
    )
    return probe.returncode == 0


def installer() -> Path | None:
    """An interpreter that can run ``uv_pip.py`` (it needs pip and uv): this one, else the
    project's ``.venv`` (the lowest-versions venv has no pip)."""
    for python in (Path(sys.executable), ROOT / ".venv" / "bin" / "python"):
        if python.exists() and _has_pip_and_uv(python):
            return python
    return None


def _clean_env() -> dict[str, str]:
    # Nothing of the running interpreter's: no PYTHONPATH reaching this tree's tests.
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_normalize(name), dist.version)
    return found


#: What the tests run in a fresh venv: ``python probe.py COMMAND URL``. Prints one JSON object
#: last: what it got, or ``{"error": class name, "message": ...}`` for a ``TicketsError``.
#:
#: * ``flush-async``: TicketId rows flushed twice through an ``AsyncSession`` with nothing
#:   configured (the embedded default), then ``TicketServer(URL).next_block``;
#: * ``flush-sync``: the same through a ``Session`` on a synchronous engine;
#: * ``server``: ``TicketServer(URL).next_block`` alone;
#: * ``timeouts``: ``apply_timeouts(create_engine(URL), 1.0)``, nothing else;
#: * ``hang``: ``TicketServer(URL, timeout=1.0)`` takes an id, prints ``ready``, and for each
#:   line on stdin times one more ``next_id`` and prints the outcome.
PROBE = r"""
import asyncio, json, sys, time

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketServer, TicketsError, apply_timeouts
from sqlalchemy_tickets.sources.default import embedded_source


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(TicketId("notes"), primary_key=True)


def server_block(url):
    server = TicketServer(url)
    try:
        return list(server.next_block("other", 3)), server.url.get_driver_name()
    finally:
        server.close()


async def flush_async(url):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        ids = []
        async with AsyncSession(engine) as session:
            for _ in range(2):
                notes = [Note() for _ in range(3)]
                session.add_all(notes)
                await session.flush()
                ids += [n.id for n in notes]
            await session.commit()
        own = embedded_source(engine.sync_engine).source.url.get_driver_name()
    finally:
        await engine.dispose()
    block, server = server_block(url)
    return {"ids": ids, "driver": own, "block": block, "server": server}


def flush_sync(url):
    engine = sa.create_engine(url)
    try:
        Base.metadata.create_all(engine)
        ids = []
        with Session(engine) as session:
            for _ in range(2):
                notes = [Note() for _ in range(3)]
                session.add_all(notes)
                session.flush()
                ids += [n.id for n in notes]
            session.commit()
        own = embedded_source(engine).source.url.get_driver_name()
    finally:
        engine.dispose()
    block, server = server_block(url)
    return {"ids": ids, "driver": own, "block": block, "server": server}


def server(url):
    block, driver = server_block(url)
    return {"block": block, "server": driver}


def timeouts(url):
    apply_timeouts(sa.create_engine(url), 1.0)
    return {"applied": True}


def hang(url):
    server = TicketServer(url, timeout=1.0)
    print(json.dumps({"first": server.next_id("hang"), "driver": server.url.get_driver_name()}))
    sys.stdout.flush()
    for _ in sys.stdin:
        started = time.monotonic()
        try:
            outcome = {"id": server.next_id("hang")}
        except Exception as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
        outcome["elapsed"] = time.monotonic() - started
        print(json.dumps(outcome))
        sys.stdout.flush()
    server.close()
    return {"done": True}


command, url = sys.argv[1], sys.argv[2]
run = {"flush-async": lambda: asyncio.run(flush_async(url)), "flush-sync": lambda: flush_sync(url),
       "server": lambda: server(url), "timeouts": lambda: timeouts(url),
       "hang": lambda: hang(url)}[command]
try:
    result = run()
except TicketsError as error:
    result = {"error": type(error).__name__, "message": str(error)}
print(json.dumps(result))
"""


@dataclass(frozen=True)
class Run:
    """What a script printed, and how it ended."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, object]:
        """The last line of stdout, as JSON (the scripts print one object last)."""
        lines = self.stdout.strip().splitlines()
        assert lines, f"no output; stderr:\n{self.stderr}"
        value = json.loads(lines[-1])
        assert isinstance(value, dict)
        return value


class FreshVenvs:
    """Builds, on demand and once each, venvs under ``root`` named by the drivers they hold."""

    def __init__(self, root: Path, installer: Path) -> None:
        self.root = root
        self.installer = installer
        self._built: dict[tuple[str, ...], Path] = {}
        self._lock = threading.Lock()

    def python(self, *packages: str) -> Path:
        """The interpreter of a venv with the package, SQLAlchemy's asyncio extra and
        ``packages`` (pip requirement names), and no other driver."""
        key = tuple(sorted(packages))
        with self._lock:
            if key not in self._built:
                self._built[key] = self._build(key)
            return self._built[key]

    def _build(self, packages: tuple[str, ...]) -> Path:
        # Not named like a module: a script's directory is on sys.path, and a directory
        # "asyncpg" beside it would import as the driver.
        venv = self.root / ("venv-" + "-".join(_normalize(p) for p in packages))
        python = venv / "bin" / "python"
        here = _installed_versions()
        subprocess.run(
            [str(self.installer), "-m", "uv", "venv", "--quiet", "--python", sys.executable,
             str(venv)],
            check=True, timeout=BUILD_TIMEOUT,
        )
        pins = [f"{p}=={here[p]}" for p in _PINNED if p in here]
        pins += [f"{p}=={here[_normalize(p)]}" for p in packages if _normalize(p) in here]
        constraints = venv / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        result = subprocess.run(
            [str(self.installer), str(UV_PIP), "install", "--quiet", "--python", str(python),
             "--constraint", str(constraints), "-e", f"{ROOT}[asyncio]", *packages],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the venv {venv} failed:\n{result.stderr}")
        return python

    def run(self, python: Path, *args: str, timeout: float = 120) -> Run:
        """``python args...`` in a directory of its own, with a clean environment (no
        PYTHONPATH)."""
        result = subprocess.run(
            [str(python), *args], capture_output=True, text=True, timeout=timeout,
            cwd=self._workdir(), env=_clean_env(),
        )
        return Run(result.returncode, result.stdout, result.stderr)

    def probe(self, python: Path, command: str, url: str) -> Run:
        """Run :data:`PROBE` ``command`` on ``url`` in that venv."""
        return self.run(python, str(self._probe_file()), command, url)

    def start_probe(self, python: Path, command: str, url: str) -> subprocess.Popen[str]:
        """Start :data:`PROBE` ``command`` on ``url``, with pipes for stdin and stdout."""
        return subprocess.Popen(
            [str(python), str(self._probe_file()), command, url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=self._workdir(), env=_clean_env(),
        )

    def _workdir(self) -> Path:
        # Holds the probe and nothing else: the current directory and a script's own are on
        # sys.path.
        path = self.root / "work"
        path.mkdir(exist_ok=True)
        return path

    def _probe_file(self) -> Path:
        path = self._workdir() / "probe.py"
        with self._lock:
            if not path.exists():
                path.write_text(PROBE)
        return path

    def importable(self, python: Path, module: str) -> bool:
        """Whether ``module`` imports in that venv."""
        return self.run(python, "-c", f"import {module}").returncode == 0
