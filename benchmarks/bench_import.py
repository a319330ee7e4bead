"""Start-up: ``import sqlalchemy_tickets`` against ``import sqlalchemy.orm``, in fresh interpreters.

Each run a new ``python -c`` on this checkout's ``src/``, timed around its statements (the whole
process beside it), 30 rounds: ``import`` (**target <= 1.1**; also with the collector off),
``app`` (a model with a ``TicketId`` key vs ``BigInteger``), ``alembic`` (with and without the
package's plugin). Smoke: 3 rounds, without the collector-off pair and tickets + BigInteger.

    .venv/bin/python benchmarks/bench_import.py [--smoke] [--rounds 30] [--strict]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import _harness as h

NAME, TARGET, PACKAGE = "bench_import", 1.1, "sqlalchemy_tickets"
SRC_DIR = h.REPO_DIR / "src"
#: A child: the clock runs around ``body`` only; ``prelude`` and the report are outside it.
CHILD = """\
import sys, time
{prelude}
_wall, _cpu = time.perf_counter(), time.process_time()
{body}
_cpu, _wall = time.process_time() - _cpu, time.perf_counter() - _wall
import json
print(json.dumps({{"seconds": _wall, "cpu_seconds": _cpu,
                  "file": getattr(sys.modules.get({package!r}), "__file__", None)}}))
"""
GC_OFF = "import gc; gc.disable()"
MODEL = """\
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, configure_mappers, mapped_column
class Base(DeclarativeBase):
    pass
class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column({key}, primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
configure_mappers()
"""
NO_PLUGIN = """\
import importlib.metadata as metadata
entry_points = metadata.entry_points
def without_ours(**kw):
    found = entry_points(**kw)
    if kw.get("group") != "alembic.plugins":
        return found
    return metadata.EntryPoints(e for e in found if not e.value.startswith({package!r}))
metadata.entry_points = without_ours
"""
#: ``group -> variant -> (prelude, body)``.
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "import": {
        "sqlalchemy.orm": ("", "import sqlalchemy.orm"),
        PACKAGE: ("", f"import {PACKAGE}"),
        "sqlalchemy.orm, gc off": (GC_OFF, "import sqlalchemy.orm"),
        f"{PACKAGE}, gc off": (GC_OFF, f"import {PACKAGE}"),
    },
    "app": {
        "orm + BigInteger": ("", MODEL.format(key="sa.BigInteger")),
        "tickets + BigInteger": ("", f"import {PACKAGE}\n" + MODEL.format(key="sa.BigInteger")),
        "tickets + TicketId": ("", f"import {PACKAGE}\n"
                               + MODEL.format(key=f'{PACKAGE}.TicketId("Photos")')),
    },
    "alembic": {
        "alembic without our plugin": (NO_PLUGIN.format(package=PACKAGE), "import alembic"),
        "alembic with our plugin": ("import importlib.metadata", "import alembic"),
    },
}
#: ``group -> [(numerator, denominator, target)]``.
RATIOS: dict[str, list[tuple[str, str, float | None]]] = {
    "import": [(PACKAGE, "sqlalchemy.orm", TARGET),
               (f"{PACKAGE}, gc off", "sqlalchemy.orm, gc off", None)],
    "app": [("tickets + TicketId", "orm + BigInteger", None),
            ("tickets + TicketId", "tickets + BigInteger", None)],
    "alembic": [("alembic with our plugin", "alembic without our plugin", None)],
}
SMOKE_LEAVES_OUT = {"sqlalchemy.orm, gc off", f"{PACKAGE}, gc off", "tickets + BigInteger"}


def run_child(code: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", code], env=dict(env), text=True,
                          cwd=tempfile.gettempdir(),  # nothing on the path by accident
                          capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{code}\n{done.stderr[-3000:]}")
    return done


def measure_group(variants: Mapping[str, tuple[str, str]], rounds: int, env: Mapping[str, str],
                  label: str) -> tuple[h.Timings, h.Timings, set[str]]:
    """The group's timings by the children, by the parent (the whole child), the files imported."""
    inner, files = h.Timings.of(dict.fromkeys(variants, 1)), set()

    def runner(name: str, prelude: str, body: str) -> h.Variant:
        code = CHILD.format(prelude=prelude, body=body, package=PACKAGE)

        def run(_: Any) -> None:
            said = json.loads(run_child(code, env).stdout.splitlines()[-1])
            files.add(said["file"])
            inner.seconds[name].append(said["seconds"])
            inner.cpu_seconds[name].append(said["cpu_seconds"])

        return h.Variant(name, run)

    outer = h.interleave([runner(name, *parts) for name, parts in variants.items()], rounds,
                         warmup=0, label=label)  # warmup=0: the compiling child ran them all
    inner.orders = outer.orders
    return inner, outer, files - {None}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, peers=("alembic",))
    rounds = int(args.rounds or (3 if args.smoke else 30))
    children = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    children["PYTHONPATH"] = os.pathsep.join(filter(None, (str(SRC_DIR),
                                                           os.environ.get("PYTHONPATH"))))
    results: dict[str, Any] = {}
    imported: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="bench_import_pycache_") as pycache:
        children["PYTHONPYCACHEPREFIX"] = pycache
        run_child(f"import sqlalchemy.orm, {PACKAGE}, alembic", children)  # writes the bytecode
        for group, variants in GROUPS.items():
            if args.smoke:  # seconds, not a minute: the pairs with a verdict or a headline
                variants = {n: v for n, v in variants.items() if n not in SMOKE_LEAVES_OUT}
            pairs = [p for p in RATIOS[group] if {p[0], p[1]} <= set(variants)]
            inner, outer, files = measure_group(variants, rounds, children, f"{group}: ")
            imported |= files
            results[group] = {
                "ratios": {f"{a} / {b}": h.ratio_summary(inner, a, b, t) for a, b, t in pairs},
                "whole_process_ratios": {f"{a} / {b}": h.ratio_summary(outer, a, b)
                                         for a, b, _ in pairs},
                "median_whole_process_ms": {n: outer.median(n) * 1e3 for n in outer.seconds},
                **inner.to_json("median_ms", 1e3),
                "whole_process_seconds_per_round": outer.seconds}
    expected = str(SRC_DIR / PACKAGE / "__init__.py")
    if imported != {expected}:
        raise RuntimeError(f"the children imported {sorted(imported)}, not {expected}")
    return h.report(args, NAME, results, title="Start-up: sqlalchemy_tickets vs sqlalchemy.orm "
                    "(the timed statements; whole_process: the whole child)", height=6,
                    parameters={"rounds": rounds, "child_pythonpath": children["PYTHONPATH"],
                                "child_code": CHILD, "variants": GROUPS,
                                "bytecode": "PYTHONPYCACHEPREFIX in a temporary directory"})


if __name__ == "__main__":
    raise SystemExit(main())
