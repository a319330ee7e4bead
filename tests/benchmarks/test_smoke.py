"""Every benchmark script runs: each ``benchmarks/*.py`` with ``--smoke`` (tiny sizes, one
round) in a subprocess, against throwaway databases on the suite's servers, writing its JSON to
a temporary directory. Speed is not asserted here; that the scripts still run against today's
library is: a benchmark that drifted from the code it measures fails here first.

The scripts run three at a time (they mostly wait on their databases and worker processes), and
share one bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary directory, whatever
``PYTHONDONTWRITEBYTECODE`` says): without it every interpreter — a script and each of its
workers — compiles SQLAlchemy, matplotlib and the library from source again. A run has one
chance: a script that fails is a bug found (first contact on a fresh database, which a loaded
machine can make slow, happens with a set-up timeout: ``_harness.first_contact``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from support import forked

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_"))
#: Seconds one smoke run may take on a loaded two-core machine.
TIMEOUT = 240
AT_ONCE = 3
#: The longest smoke runs (30-90 s on a loaded machine), started first: the others fill in.
LONGEST = ("campaign", "bench_shortlived", "bench_scale", "bench_tier_take", "bench_datacenter")
Run = tuple[subprocess.CompletedProcess[str], Path, float]


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest,
    backend_admin_url: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[Run]]]:
    """Every selected script's run, a few at a time, each with its own output directory.

    Only the scripts whose ``test_smoke`` was selected run (``-k bench_import`` runs that one):
    the module's teardown waits for every run it started."""
    selected = sorted(
        {
            item.callspec.params["name"]
            for item in request.session.items
            if getattr(item, "originalname", None) == "test_smoke" and hasattr(item, "callspec")
        },
        key=lambda name: (name not in LONGEST, LONGEST.index(name) if name in LONGEST else 0),
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {
        "TICKETS_BENCH_POSTGRESQL_URL": backend_admin_url("postgresql"),
        "TICKETS_BENCH_MYSQL_URL": backend_admin_url("mysql"),
        "PYTHONPYCACHEPREFIX": str(tmp_path_factory.mktemp("pycache")),
    }

    def run(name: str, out: Path) -> Run:
        started = time.monotonic()
        done = forked.run_path(
            BENCH_DIR / f"{name}.py", "--smoke", "--out", str(out), cwd=BENCH_DIR.parent,
            env=env, timeout=TIMEOUT, preload=(*forked.PRELOAD, "matplotlib", "numpy"),
        )
        done.stdout += done.stderr
        return done, out, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {name: pool.submit(run, name, tmp_path_factory.mktemp(name)) for name in selected}


def test_scripts_found() -> None:
    assert {"bench_flush", "bench_roundtrip", "bench_alloc", "campaign"} <= set(SCRIPTS)


@pytest.mark.slow  # run once per make test (see the marker)
@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke(name: str, smoke_runs: dict[str, Future[Run]]) -> None:
    done, out, seconds = smoke_runs[name].result()
    print(f"{name} --smoke: {seconds:.1f} s")
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode}:\n{done.stdout[-4000:]}"
    written = json.loads((out / f"{name}.json").read_text())
    assert written["benchmark"] == name
    assert written["parameters"]["smoke"] is True
    assert written["results"], f"{name} wrote no results"
    assert (out / f"{name}.png").exists(), f"{name} drew no plot"


def campaign() -> Any:
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import campaign as module
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def test_a_seed_names_one_campaign() -> None:
    """The seeded schedule is the one the committed run of ``--seed 1`` ran, fault by fault:
    anyone rerunning the campaign meets the same faults."""
    committed = json.loads((BENCH_DIR / "results" / "campaign.json").read_text())
    seed, duration = committed["parameters"]["seed"], committed["parameters"]["duration"]
    faults = campaign().schedule(random.Random(seed), duration, False, 4)
    ran = committed["results"]["faults"]
    assert len(faults) == len(ran) == 79
    for fault, record in zip(faults, ran, strict=True):
        assert (fault.at, fault.kind) == (record["planned"], record["kind"])
        assert all(record[key] == value for key, value in fault.params.items())


def test_the_soak_schedule_overlaps_kills_with_cut_links() -> None:
    faults = campaign().schedule(random.Random(1), 300.0, False, 8, "soak")
    kinds = [f.kind for f in faults]
    assert kinds.count("kill_worker") == 11 and kinds.count("kill_server") == 1
    cuts = [(f.at, f.at + f.params["seconds"]) for f in faults if f.kind.endswith("_link")]
    kills = [f.at for f in faults if f.kind == "kill_worker"]
    assert any(start <= at < end for at in kills for start, end in cuts)
