"""The project's command lines run as real processes, without paying an interpreter's start-up
for each: the suites run ``sqlalchemy-tickets`` and ``python -m alembic`` hundreds of times, and
most of each run was spent importing SQLAlchemy, the drivers and Alembic (about 1.5 s of CPU a
run on this two-core machine).

A helper process (``_zygote.py``) imports them once; each run is a child forked from it: a real
process with its own working directory, environment, arguments, standard streams and exit
status, whose interpreter exits as any does (``atexit``, output flushed, anything printed at
exit captured). A helper is started with the environment variables the interpreter reads at
start-up (``PYTHON*``) of the runs it serves and serves one run at a time: runs with other such
variables, or at the same time from several threads, get helpers of their own.

``TICKETS_TEST_FORKED=0`` runs every command in a fresh interpreter instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["run_module", "run_path", "run_script"]

ZYGOTE = Path(__file__).with_name("_zygote.py")
#: What each command imports anyway: imported once, by the helper.
PRELOAD = (
    "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.mysql", "sqlalchemy.dialects.sqlite", "psycopg", "pymysql",
    "sqlalchemy_tickets", "sqlalchemy_tickets.cli", "alembic", "alembic.config",
    "alembic.command", "alembic.autogenerate", "sqlalchemy_tickets.alembic",
)
ENABLED = os.environ.get("TICKETS_TEST_FORKED", "1") != "0"


class _Zygote:
    def __init__(self, startup: tuple[tuple[str, str], ...], preload: tuple[str, ...]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(startup)
        self.process = subprocess.Popen(
            [sys.executable, str(ZYGOTE), *preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, text=True,
        )
        self.busy = False  # serving a run (under _zygotes_lock): another run takes another
        self._read = b""  # answers read from the pipe, not yet taken

    def _answer(self, timeout: float | None) -> dict[str, int] | None:
        """The next answer line, or ``None`` after ``timeout`` seconds (read from the file
        descriptor: a buffered reader could hold the next line where select cannot see it)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._read:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the command runner (tests/support/_zygote.py) died")
            self._read += chunk
        line, self._read = self._read.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self, request: dict[str, object], timeout: float) -> int:
        """The child's exit status; kills it and raises ``TimeoutExpired`` after ``timeout``."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        started = self._answer(30)
        assert started is not None, "the command runner did not fork"
        done = self._answer(timeout)
        if done is None:
            os.kill(started["pid"], signal.SIGKILL)
            self._answer(None)
            raise subprocess.TimeoutExpired(str(request["args"]), timeout)
        return done["status"]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)


_zygotes: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], list[_Zygote]] = {}
_zygotes_lock = threading.Lock()


@contextlib.contextmanager
def _zygote(env: Mapping[str, str], preload: tuple[str, ...]) -> Iterator[_Zygote]:
    """A helper started with ``env``'s start-up variables that imported ``preload``, serving
    this run alone (runs at once from several threads each get one: more are started)."""
    startup = tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON")))
    with _zygotes_lock:
        pool = _zygotes.setdefault((startup, preload), [])
        pool[:] = [z for z in pool if z.process.poll() is None]
        found = next((z for z in pool if not z.busy), None)
        if found is None:
            found = _Zygote(startup, preload)
            pool.append(found)
        found.busy = True
    try:
        yield found
    finally:
        with _zygotes_lock:
            found.busy = False


@atexit.register
def _close_all() -> None:
    with _zygotes_lock:
        for pool in _zygotes.values():
            for zygote in pool:
                zygote.close()
        _zygotes.clear()


def _run(
    kind: str, name: str, argv: list[str], args: Sequence[str], *, cwd: str | Path | None,
    env: Mapping[str, str] | None, timeout: float, script: str | None = None,
    preload: tuple[str, ...] = PRELOAD,
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ if env is None else env)
    if not ENABLED:
        return subprocess.run(
            [*argv, *args], capture_output=True, text=True, cwd=cwd, env=env,
            timeout=timeout, check=False,
        )
    with tempfile.TemporaryDirectory(prefix="tickets-run-") as where:
        out, err = os.path.join(where, "out"), os.path.join(where, "err")
        with _zygote(env, preload) as zygote:
            status = zygote.run({
                "kind": kind, "name": name, "script": script, "args": list(args),
                "cwd": str(cwd or os.getcwd()), "env": env, "out": out, "err": err,
            }, timeout)
        with open(out, encoding="utf-8") as o, open(err, encoding="utf-8") as e:
            return subprocess.CompletedProcess([*argv, *args], status, o.read(), e.read())


def run_script(
    name: str, *args: str, cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None, timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """The console script ``name`` of this environment with ``args``: its exit status and
    output (never raises on a non-zero status)."""
    script = shutil.which(name, path=os.path.dirname(sys.executable))
    assert script is not None, f"the {name} console script is not installed"
    return _run("script", name, [script], args, cwd=cwd, env=env, timeout=timeout,
                script=script)


def run_module(
    name: str, *args: str, cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None, timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m name args``: its exit status and output (never raises on a non-zero
    status)."""
    return _run("module", name, [sys.executable, "-m", name], args, cwd=cwd, env=env,
                timeout=timeout)


def run_path(
    path: str | Path, *args: str, cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None, timeout: float = 120,
    preload: tuple[str, ...] = PRELOAD,
) -> subprocess.CompletedProcess[str]:
    """``python path args``: its exit status and output (never raises on a non-zero status);
    ``preload``: what the helper imports for it."""
    return _run("path", str(path), [sys.executable, str(path)], args, cwd=cwd, env=env,
                timeout=timeout, preload=preload)
