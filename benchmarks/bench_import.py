"""Start-up: ``import sqlalchemy_tickets`` against ``import sqlalchemy.orm``, in fresh interpreters.

Every run is a new ``python -c`` process (``sys.executable``), and the time compared is the one
the child measures around its import statement (``time.perf_counter``), so interpreter start-up
is in neither; the parent's wall time of the whole process is reported beside it. The package
imports ``sqlalchemy.orm`` itself, so the ratio is total / total. Three groups, each interleaved
on its own (the order rotates every round), 30 rounds (``--smoke``: 3, without the variants
marked *):

* ``import``: ``import sqlalchemy.orm`` (the baseline) and ``import sqlalchemy_tickets``; the same
  two again with the cyclic garbage collector off in the child (``gc off`` *), which separates the
  work of the import from a full collection that more allocations happen to set off.
  **Target: sqlalchemy_tickets / sqlalchemy.orm <= 1.1.**
* ``app``: what an application does at start: the imports, then a declarative ``Base`` and a
  model ``Photo`` (a ``String`` column and an ``id`` primary key), then ``configure_mappers()``.
  ``tickets + TicketId`` (``mapped_column(TicketId("Photos"), primary_key=True)``) against
  ``orm + BigInteger`` (the same model with ``BigInteger``, without the library) and against
  ``tickets + BigInteger`` * (the library imported, the plain key): the library's whole start-up
  cost, and the column's own share of it.
* ``alembic``: ``import alembic`` with the package's Alembic plugin (the ``alembic.plugins``
  entry point, which makes every ``import alembic`` import part of the package) against the same
  import with that entry point filtered out of ``importlib.metadata.entry_points`` in the child
  (both children import ``importlib.metadata`` before the clock starts).

Then ``-X importtime`` of each import (the collector off; per figure the least of 7 runs,
``--smoke``: 1): the modules ``import sqlalchemy_tickets`` loads beyond what ``import
sqlalchemy.orm`` loads — the package's own and everything they pull in — with their self and
cumulative microseconds, and the microseconds of each one's subtree that are beyond
``sqlalchemy.orm`` (its cumulative time without the modules of ``sqlalchemy.orm`` it imports
first); the top 20 by that figure are in the PNG.

The children import the package from this checkout's ``src/`` (prepended to ``PYTHONPATH``; the
file they imported is recorded and checked) and read and write bytecode in a private
``PYTHONPYCACHEPREFIX`` (with ``PYTHONDONTWRITEBYTECODE`` unset): one untimed child compiles
everything first, timed runs load ``.pyc`` files, as from an installed package. The load average
is recorded at the start and at the end.

    .venv/bin/python benchmarks/bench_import.py [--smoke] [--rounds 30] [--strict]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import _common as h

NAME = "bench_import"
TARGET = 1.1
PACKAGE = "sqlalchemy_tickets"
SRC_DIR = h.REPO_DIR / "src"
TOP = 20

#: A child: the clock runs around ``body`` only; ``prelude`` (builtin modules, or what both
#: variants of a pair share) and the report after it are outside the measurement.
CHILD = """\
import sys, time
{prelude}
_wall, _cpu = time.perf_counter(), time.process_time()
{body}
_cpu, _wall = time.process_time() - _cpu, time.perf_counter() - _wall
import json
_mod = sys.modules.get({package!r})
print(json.dumps({{"seconds": _wall, "cpu_seconds": _cpu, "file": getattr(_mod, "__file__", None),
                  "modules": len(sys.modules)}}))
"""

GC_OFF = "import gc; gc.disable()"

MODEL = """\
from sqlalchemy.orm import DeclarativeBase, Mapped, configure_mappers, mapped_column
class Base(DeclarativeBase):
    pass
class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column({key}, primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
configure_mappers()
"""

#: The package's plugin left out of what Alembic finds: the same import, without it.
NO_PLUGIN = """\
import importlib.metadata as _metadata
_entry_points = _metadata.entry_points
def _without_ours(**kw):
    found = _entry_points(**kw)
    if kw.get("group") != "alembic.plugins":
        return found
    return _metadata.EntryPoints(e for e in found if not e.value.startswith({package!r}))
_metadata.entry_points = _without_ours
"""

#: ``group -> variant -> (prelude, body)``; the first variant of a group is its baseline.
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "import": {
        "sqlalchemy.orm": ("", "import sqlalchemy.orm"),
        PACKAGE: ("", f"import {PACKAGE}"),
        "sqlalchemy.orm, gc off": (GC_OFF, "import sqlalchemy.orm"),  # not with --smoke
        f"{PACKAGE}, gc off": (GC_OFF, f"import {PACKAGE}"),  # not with --smoke
    },
    "app": {
        "orm + BigInteger": ("", "import sqlalchemy as sa\n" + MODEL.format(key="sa.BigInteger")),
        "tickets + BigInteger": (  # not with --smoke
            "",
            f"import sqlalchemy as sa\nimport {PACKAGE}\n" + MODEL.format(key="sa.BigInteger"),
        ),
        "tickets + TicketId": (
            "",
            f"import sqlalchemy as sa\nimport {PACKAGE}\n"
            + MODEL.format(key=f'{PACKAGE}.TicketId("Photos")'),
        ),
    },
    "alembic": {
        "alembic without our plugin": (NO_PLUGIN.format(package=PACKAGE), "import alembic"),
        "alembic with our plugin": ("import importlib.metadata", "import alembic"),
    },
}

#: ``group -> (numerator, denominator, target)``.
RATIOS: dict[str, list[tuple[str, str, float | None]]] = {
    "import": [
        (PACKAGE, "sqlalchemy.orm", TARGET),
        (f"{PACKAGE}, gc off", "sqlalchemy.orm, gc off", None),
    ],
    "app": [
        ("tickets + TicketId", "orm + BigInteger", None),
        ("tickets + TicketId", "tickets + BigInteger", None),
    ],
    "alembic": [("alembic with our plugin", "alembic without our plugin", None)],
}


#: The figure's row labels.
SHORT = {
    f"import: {PACKAGE} / sqlalchemy.orm": "import: tickets / orm",
    f"import: {PACKAGE}, gc off / sqlalchemy.orm, gc off": "import, gc off: tickets / orm",
    "app: tickets + TicketId / orm + BigInteger": "app: tickets+TicketId / orm+BigInteger",
    "app: tickets + TicketId / tickets + BigInteger": "app: tickets+TicketId / tickets+BigInt.",
    "alembic: alembic with our plugin / alembic without our plugin": "alembic: plugin / none",
}

SMOKE_LEAVES_OUT = {"sqlalchemy.orm, gc off", f"{PACKAGE}, gc off", "tickets + BigInteger"}


def child_env(pycache: Path) -> dict[str, str]:
    """The children's environment: this checkout's ``src/`` first on the path, bytecode read and
    written under ``pycache`` only (never beside the sources or in the virtualenv)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SRC_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def run_child(code: str, env: Mapping[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *flags, "-c", code],
        env=dict(env),
        cwd=tempfile.gettempdir(),  # not the repository root: nothing on the path by accident
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{code}\n{done.stderr[-3000:]}")
    return done


def measure_group(
    group: str, variants: Mapping[str, tuple[str, str]], rounds: int, env: Mapping[str, str]
) -> tuple[h.Timings, h.Timings, dict[str, Any]]:
    """The group's timings as the children measured them (the import alone), the parent's
    (the whole process), and what each child reported besides (file imported, modules)."""
    inner = h.Timings(per={name: 1 for name in variants})
    seen: dict[str, Any] = {}
    for name in variants:
        inner.seconds[name], inner.cpu_seconds[name] = [], []

    def runner(name: str, prelude: str, body: str) -> h.Variant:
        code = CHILD.format(prelude=prelude, body=body, package=PACKAGE)

        def run(_: Any) -> None:
            report = json.loads(run_child(code, env).stdout.splitlines()[-1])
            seen[name] = {"file": report["file"], "modules": report["modules"]}
            inner.seconds[name].append(report["seconds"])
            inner.cpu_seconds[name].append(report["cpu_seconds"])

        return h.Variant(name, run)

    outer = h.interleave(
        [runner(name, *parts) for name, parts in variants.items()],
        rounds,
        warmup=0,  # compile() ran every import once already
        label=f"{group}: ",
    )
    inner.orders = outer.orders
    return inner, outer, seen


def compile_all(env: Mapping[str, str]) -> None:
    """One untimed child importing everything the variants import: the bytecode is written to
    the private prefix here, and every timed child loads it."""
    run_child(f"import sqlalchemy.orm, {PACKAGE}, alembic", env)


# -- -X importtime -----------------------------------------------------------------------------


def importtime(statement: str, env: Mapping[str, str]) -> list[tuple[str, int, int, int]]:
    """``(module, depth, self µs, cumulative µs)`` of one run, the collector off, in the order
    ``-X importtime`` prints them: a module after the modules it imported (one level deeper)."""
    done = run_child(f"{GC_OFF}\n{statement}", env, "-X", "importtime")
    found = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, module = line.split(":", 1)[1].split("|")
        depth = (len(module) - len(module.lstrip()) - 1) // 2
        found.append((module.strip(), depth, int(own), int(cumulative)))
    return found


def beyond(lines: list[tuple[str, int, int, int]], known: set[str]) -> dict[str, list[int]]:
    """``module -> [self µs, cumulative µs, cumulative µs beyond known]`` for the modules not
    in ``known``: the last figure counts only those modules in the module's subtree (the
    package's ``cumulative`` includes all of ``sqlalchemy.orm``, which it imports first)."""
    result: dict[str, list[int]] = {}
    pending: list[tuple[int, int]] = []  # (depth, beyond µs) of subtrees waiting for a parent
    for module, depth, own, cumulative in lines:
        extra = own if module not in known else 0
        while pending and pending[-1][0] > depth:
            extra += pending.pop()[1]
        pending.append((depth, extra))
        if module not in known:
            result.setdefault(module, [own, cumulative, extra])
    return result


def beyond_orm(env: Mapping[str, str], runs: int) -> dict[str, Any]:
    """What ``import sqlalchemy_tickets`` loads that ``import sqlalchemy.orm`` does not: per
    module, the least over ``runs`` runs of its self, cumulative and beyond-orm µs."""
    orm_runs, our_runs = [], []
    for _ in range(runs):  # alternated, so that a busy minute does not fall on one of them
        orm_runs.append(importtime("import sqlalchemy.orm", env))
        our_runs.append(importtime(f"import {PACKAGE}", env))
    known = {line[0] for run in orm_runs for line in run}
    samples = [beyond(run, known) for run in our_runs]
    # The least of the runs, per figure: on a shared machine noise only ever adds time.
    extra = {m: [min(s[m][i] for s in samples if m in s) for i in (0, 1, 2)] for m in samples[-1]}

    def rows(names: Sequence[str]) -> list[dict[str, Any]]:
        ordered = sorted(names, key=lambda m: (-extra[m][2], -extra[m][1]))
        return [
            {
                "module": m,
                "self_us": extra[m][0],
                "cumulative_us": extra[m][1],
                "cumulative_beyond_orm_us": extra[m][2],
            }
            for m in ordered
        ]

    def total(run: list[tuple[str, int, int, int]], module: str) -> int:
        return next(cumulative for name, _, _, cumulative in run if name == module)

    own = [m for m in extra if m == PACKAGE or m.startswith(PACKAGE + ".")]
    return {
        "runs": runs,
        "note": "µs per module, the least of the runs (each figure on its own), collector off. "
        "cumulative_us includes every module imported under it (the package's includes "
        "sqlalchemy.orm, which its modules import first); cumulative_beyond_orm_us counts "
        "only the modules that import sqlalchemy.orm does not load",
        "total_us": {
            "sqlalchemy.orm": min(total(r, "sqlalchemy.orm") for r in orm_runs),
            PACKAGE: min(total(r, PACKAGE) for r in our_runs),
        },
        "modules_loaded": {"sqlalchemy.orm": len(orm_runs[-1]), PACKAGE: len(our_runs[-1])},
        "modules_beyond_orm": len(extra),
        "beyond_orm_self_us": sum(v[0] for v in extra.values()),
        "top_by_cumulative_beyond_orm": rows(list(extra))[:TOP],
        "package_modules": rows(own),
        "other_modules": rows([m for m in extra if m not in own]),
    }


# -- report ------------------------------------------------------------------------------------


def draw(results: Mapping[str, Any], env: Mapping[str, Any]) -> Any:
    """The ratios, each round a dot; the top modules beyond ``sqlalchemy.orm``."""
    fig, (left, right) = h.figure(
        2, "Start-up: sqlalchemy_tickets vs sqlalchemy.orm", env, height=6
    )
    rows = {SHORT.get(k, k): v for k, v in h.flatten(results, "ratios").items()}
    h.ratio_panel(left, rows, "time of the timed statements, ratio per round")
    fig.subplots_adjust(left=0.2, wspace=0.9)
    top = results["importtime"]["top_by_cumulative_beyond_orm"]
    h.value_panel(
        right,
        {row["module"]: row["cumulative_beyond_orm_us"] / 1e3 for row in top},
        f"-X importtime, gc off: top {len(top)} beyond sqlalchemy.orm\n"
        "(ms in each subtree, orm's modules left out)",
        "ms",
    )
    right.tick_params(axis="y", labelsize=7)
    return fig


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    rounds = int(args.rounds or (3 if args.smoke else 30))
    env = h.environment("alembic")
    pycache = Path(tempfile.mkdtemp(prefix="bench_import_pycache_"))
    try:
        children = child_env(pycache)
        results: dict[str, Any] = {}
        checks: dict[str, Any] = {}
        imported: set[str] = set()
        compile_all(children)
        for group, variants in GROUPS.items():
            if args.smoke:  # seconds, not a minute: the pairs that carry a verdict or a headline
                variants = {n: v for n, v in variants.items() if n not in SMOKE_LEAVES_OUT}
            pairs = [p for p in RATIOS[group] if {p[0], p[1]} <= set(variants)]
            inner, outer, seen = measure_group(group, variants, rounds, children)
            ratios = {
                f"{num} / {den}": h.ratio_summary(inner, num, den, target)
                for num, den, target in pairs
            }
            process = {f"{num} / {den}": h.ratio_summary(outer, num, den) for num, den, _ in pairs}
            checks.update({f"{group}: {k}": v for k, v in ratios.items() if "target" in v})
            imported.update(s["file"] for s in seen.values() if s["file"])
            results[group] = {
                "ratios": ratios,
                "whole_process_ratios": process,
                "median_ms": {n: inner.median(n) * 1e3 for n in inner.seconds},
                "median_whole_process_ms": {n: outer.median(n) * 1e3 for n in outer.seconds},
                "children": seen,
                **inner.to_json(),
                "whole_process_seconds_per_round": outer.seconds,
            }
        results["importtime"] = beyond_orm(children, 1 if args.smoke else 7)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
    expected = str(SRC_DIR / PACKAGE / "__init__.py")
    results["measured_package_file"] = sorted(imported)
    if imported != {expected}:
        raise RuntimeError(f"the children imported {sorted(imported)}, not {expected}")
    results["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    plugin = results["alembic"]["children"]
    results["alembic"]["plugin_loaded"] = {
        name: s["file"] is not None for name, s in plugin.items()
    }

    return h.report(
        args,
        NAME,
        env=env,
        parameters={
            "rounds": rounds,
            "python": sys.executable,
            "child_pythonpath": children["PYTHONPATH"],
            "bytecode": "PYTHONPYCACHEPREFIX in a temporary directory, compiled by one child",
            "child_code": CHILD,
            "variants": {
                g: {n: {"prelude": p, "timed": b} for n, (p, b) in v.items()}
                for g, v in GROUPS.items()
            },
        },
        results=results,
        checks=checks,
        figure=draw(results, env),
    )


if __name__ == "__main__":
    sys.exit(main())
