"""Every benchmark script runs: each ``benchmarks/*.py`` with ``--smoke`` (tiny sizes, one
round) in a subprocess, against throwaway databases on the suite's servers, writing its JSON to a
temporary directory. Speed is not asserted here; that the scripts still run against today's
library is: a benchmark that drifted from the code it measures fails here first.

The scripts run three at a time: they mostly wait on their databases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_"))
#: Seconds one smoke run may take on a loaded two-core machine.
TIMEOUT = 240
#: Scripts run at once: they mostly wait on their databases, but too many at once on two cores
#: would push first-contact DDL past the library's 2 s timeout.
AT_ONCE = 3


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest,
    backend_admin_url: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[tuple[subprocess.CompletedProcess[str], Path]]]]:
    """Every selected script's run, a few at a time, each with its own output directory.

    Only the scripts whose ``test_smoke`` was selected run (``-k bench_import`` runs that one):
    the module's teardown waits for every run it started."""
    selected = sorted(
        {
            item.callspec.params["name"]
            for item in request.session.items
            if getattr(item, "originalname", None) == "test_smoke" and hasattr(item, "callspec")
        }
    )
    env = {
        **os.environ,
        "TICKETS_BENCH_POSTGRESQL_URL": backend_admin_url("postgresql"),
        "TICKETS_BENCH_MYSQL_URL": backend_admin_url("mysql"),
    }

    def run(name: str, out: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
        command = [sys.executable, str(BENCH_DIR / f"{name}.py"), "--smoke", "--out", str(out)]
        for _ in range(2):
            done = subprocess.run(
                command,
                cwd=BENCH_DIR.parent,
                env=env,
                text=True,
                timeout=TIMEOUT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
            # On a heavily loaded machine a fresh database's first contact (CREATE TABLE) can
            # outlast the embedded default's 2 s wait: that is load, not a script that rotted,
            # so such a run gets one second chance; any other failure counts at once.
            if done.returncode == 0 or "TicketServerUnavailable" not in done.stdout:
                break
        return done, out

    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {name: pool.submit(run, name, tmp_path_factory.mktemp(name)) for name in selected}


def test_scripts_found() -> None:
    assert {"bench_flush", "bench_roundtrip", "bench_alloc"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke(
    name: str, smoke_runs: dict[str, Future[tuple[subprocess.CompletedProcess[str], Path]]]
) -> None:
    done, out = smoke_runs[name].result()
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode}:\n{done.stdout[-4000:]}"
    written = json.loads((out / f"{name}.json").read_text())
    assert written["benchmark"] == name
    assert written["parameters"]["smoke"] is True
    assert written["results"], f"{name} wrote no results"
