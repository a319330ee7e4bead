"""The benchmarks' harness: command line, throwaway databases, interleaved timing, reports.

Speed is only ever reported as a ratio of two variants timed side by side in one process: the
variants run in interleaved rounds (the order rotates each round, so none always runs first or
last), every round's ratio is taken between timings made seconds apart, and the reported figure
is the median of those per-round ratios. Nothing here compares an absolute time with a limit.

A script is ``main(argv)``: ``args = parse_args(__doc__, argv)``, sizes chosen with
``args.smoke``, variants timed with :func:`interleave`, ratios from :func:`ratio_summary`, and
one :func:`report` call that writes ``<out>/<name>.json`` and (given a figure) ``<name>.png``.
``--smoke`` (tiny sizes, seconds) and ``--out DIR`` let the test suite run every script.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from itertools import repeat
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_DIR = BENCH_DIR.parent
BACKENDS = ("sqlite", "postgresql", "mysql")
URL_ENV = {"postgresql": "TICKETS_BENCH_POSTGRESQL_URL", "mysql": "TICKETS_BENCH_MYSQL_URL"}
DEFAULT_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/",
}
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}


def log(message: str) -> None:
    print(message, flush=True)


# -- command line ------------------------------------------------------------------------------


def parse_args(
    doc: str | None,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    *,
    backends: Sequence[str] = BACKENDS,
) -> argparse.Namespace:
    """Options every script takes (``extra`` adds its own); ``doc`` is the script's docstring,
    whose first paragraph is the help text and whose whole text goes into the JSON."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if extra is not None:
        extra(parser)
    parser.add_argument(
        "--smoke", "--quick", action="store_true", help="tiny sizes, 1 round: checks it runs"
    )
    parser.add_argument("--backends", default=",".join(backends), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (per script)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results directory")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.backends.split(",") if name.strip()]
    if not chosen or set(chosen) - set(BACKENDS):
        parser.error(f"--backends takes names from {','.join(BACKENDS)}; got {args.backends!r}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.backends, args.doc = chosen, doc or ""
    return args


def rounds(args: argparse.Namespace, full: int) -> int:
    """``--rounds``, else 1 in smoke mode, else the script's ``full``."""
    return int(args.rounds or (1 if args.smoke else full))


# -- databases ---------------------------------------------------------------------------------


def admin_url(backend: str) -> URL:
    """The server a benchmark creates its database on: ``$TICKETS_BENCH_<BACKEND>_URL``."""
    return make_url(os.environ.get(URL_ENV[backend], DEFAULT_URLS[backend]))


@contextlib.contextmanager
def throwaway_database(
    backend: str, server: URL | str | None = None, *, prefix: str = "tickets_bench_"
) -> Iterator[URL]:
    """Yield the URL of a new empty database ``<prefix><hex>``; drop it afterwards.

    SQLite: a file in a new temporary directory (the embedded default puts its ticket file
    beside it), removed with it. Servers (``server``, else :func:`admin_url`):
    ``CREATE DATABASE``; callers dispose their engines.
    """
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="tickets_bench_")
        try:
            yield URL.create("sqlite", database=os.path.join(directory, f"{name}.db"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    server = admin_url(backend) if server is None else make_url(server)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    quoted = admin.dialect.identifier_preparer.quote(name)
    # FORCE: a connection a failed run left open must not keep the database.
    force = " WITH (FORCE)" if backend == "postgresql" else ""
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        try:
            yield server.set(database=name)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")
    finally:
        admin.dispose()


def empty_table(engine: sa.Engine, table: sa.Table) -> None:
    """Untimed, between runs: ``TRUNCATE`` (no dead rows left behind), SQLite ``DELETE``."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(table.delete())
        else:
            conn.exec_driver_sql(
                f"TRUNCATE TABLE {engine.dialect.identifier_preparer.quote(table.name)}"
            )


def count_rows(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


def close_embedded(engine: sa.Engine) -> dict[str, Any]:
    """Close the embedded default of ``engine`` (a cache over a ticket server); its stats."""
    from sqlalchemy_tickets.sources.default import embedded_source

    cache = embedded_source(engine)
    stats = cache.stats()
    cache.close()
    cache.source.close()  # type: ignore[attr-defined]
    return stats


def server_info(backend: str, url: URL) -> dict[str, Any]:
    """The server's version and the settings that decide what a commit costs."""
    if backend == "sqlite":
        import sqlite3

        probe = sqlite3.connect(str(url.database))
        try:
            pragmas = {
                p: probe.execute(f"PRAGMA {p}").fetchone()[0]
                for p in ("journal_mode", "synchronous")
            }
        finally:
            probe.close()
        return {"version": sqlite3.sqlite_version, **pragmas}
    queries = {
        "postgresql": "SELECT version(), current_setting('fsync'), "
        "current_setting('synchronous_commit'), current_setting('shared_buffers')",
        "mysql": "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, "
        "@@innodb_buffer_pool_size",
    }
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(queries[backend]).one()
    finally:
        engine.dispose()
    names = {
        "postgresql": ("version", "fsync", "synchronous_commit", "shared_buffers"),
        "mysql": ("version", "innodb_flush_log_at_trx_commit", "sync_binlog", "buffer_pool"),
    }[backend]
    return {name: str(value) for name, value in zip(names, row, strict=True)}


def redact(url: URL) -> str:
    return url.render_as_string(hide_password=True)


# -- other source trees ------------------------------------------------------------------------


@contextlib.contextmanager
def exported_source(ref: str, paths: Sequence[str] = ("src",)) -> Iterator[tuple[Path, str]]:
    """``paths`` of this repository as they were at git ``ref`` (``git archive <ref> <paths> |
    tar -x``) in a new temporary directory, removed afterwards. Yields the directory and the
    commit ``ref`` names (the full id)."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"{ref!r} names no commit of {REPO_DIR} (a clone with its history "
                         "is needed to compare with it)")
    directory = Path(tempfile.mkdtemp(prefix="tickets_bench_src_"))
    try:
        archive = subprocess.Popen(
            ["git", "-C", str(REPO_DIR), "archive", commit, *paths], stdout=subprocess.PIPE
        )
        subprocess.run(["tar", "-x", "-C", str(directory)], stdin=archive.stdout, check=True)
        assert archive.stdout is not None
        archive.stdout.close()
        if archive.wait() != 0:
            raise SystemExit(f"git archive {commit} failed")
        yield directory, commit
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def has_commit(ref: str) -> bool:
    """Whether git ``ref`` names a commit here (not in an export, nor a shallow clone)."""
    return bool(_git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))


def env_with_source(src: Path | str) -> dict[str, str]:
    """``os.environ`` with ``src`` first on ``PYTHONPATH``: a child interpreter started with it
    imports the package from that tree, ahead of the installed (or editable) one. (A
    ``multiprocessing`` spawn child would not: it copies the parent's ``sys.path``.)"""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *rest])}


class Children:
    """Fresh interpreters running ``script --worker``, with ``src`` (a source tree) first on
    ``PYTHONPATH`` when given, spoken to in JSON lines: :meth:`tell` writes a line to each
    one's stdin, :meth:`hear` reads a line from each one's stdout (the child writes them with
    :func:`say`). An answer ``{"error": ...}`` or a child gone raises here. As a context
    manager, kills whatever still runs when it exits."""

    def __init__(self, script: Path | str, n: int, src: Path | str | None = None) -> None:
        env = None if src is None else env_with_source(src)
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(script), "--worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_DIR,
            )
            for _ in range(n)
        ]

    def tell(self, messages: Sequence[Any], *, close: bool = False) -> None:
        """``messages[i]`` to child ``i``; ``close``: their stdin too (nothing more to say)."""
        for process, message in zip(self.processes, messages, strict=True):
            assert process.stdin is not None
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.close() if close else process.stdin.flush()

    def hear(self) -> list[Any]:
        """The next answer of every child, in order."""
        answers = []
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a child exited ({process.wait()}) without answering")
            answer = json.loads(line)
            if isinstance(answer, dict) and "error" in answer:
                raise RuntimeError(f"a child failed:\n{answer['error']}")
            answers.append(answer)
        return answers

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            if exc[0] is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(60)
            if process.poll() is None:
                process.kill()
                process.wait()


def say(message: Any) -> None:
    """In a :class:`Children` child: one answer to the parent."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# -- environment -------------------------------------------------------------------------------


def package_version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def environment(*peers: str) -> dict[str, Any]:
    """Versions of everything on the measured path (``peers``: other packages compared), the
    commit and a digest of ``src/`` (which code was measured), and how busy the machine was."""
    digest = hashlib.sha256()
    for path in sorted((REPO_DIR / "src").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_DIR)).encode() + b"\0" + path.read_bytes())
    names = ("sqlalchemy-tickets", "SQLAlchemy", "psycopg", "PyMySQL", "matplotlib", *peers)
    return {
        "python": sys.version,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": {name: package_version(name) for name in names},
        "git_commit": _git("rev-parse", "HEAD"),
        "git_src_dirty": bool(_git("status", "--porcelain", "--", "src")),
        "src_sha256": digest.hexdigest(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def load_text(env: Mapping[str, Any]) -> str:
    """``load avg 0.34 0.38 0.21`` (1, 5, 15 min) at the start of the run, for footnotes."""
    load = env.get("load_average_at_start")
    return "load avg n/a" if not load else "load avg " + " ".join(f"{x:.2f}" for x in load)


# -- interleaved timing ------------------------------------------------------------------------


def loop(call: Callable[..., Any], n: int, *args: Any) -> Callable[[Any], None]:
    """A variant's ``run``: ``call(*args)`` ``n`` times, in the cheapest Python loop there is."""

    def run(_: Any = None) -> None:
        for _ in repeat(None, n):
            call(*args)

    return run


def none_counting_loop(call: Callable[[], Any], n: int, counts: list[int]) -> Callable[[Any], None]:
    """:func:`loop` for a generator that may return ``None`` (snowflake-id does when a
    millisecond's ids are spent): each run appends how many it got to ``counts``."""

    def run(_: Any = None) -> None:
        missed = 0
        for _ in repeat(None, n):
            if call() is None:
                missed += 1
        counts.append(missed)

    return run


@dataclass
class Variant:
    """One thing to time. ``setup()`` (untimed) returns what ``run(state)`` (timed) takes;
    ``teardown(state)`` (untimed) runs after it. ``per``: units (ids, calls) one run makes, so
    variants making different numbers of them compare per unit."""

    name: str
    run: Callable[[Any], Any]
    setup: Callable[[], Any] = lambda: None
    teardown: Callable[[Any], None] = lambda state: None
    per: int = 1


@dataclass
class Timings:
    """Seconds per run for each variant, index ``i`` = round ``i``: wall-clock time (what is
    compared) and this process's CPU time (the client's share, which other load barely touches)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu_seconds: dict[str, list[float]] = field(default_factory=dict)
    per: dict[str, int] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)

    def unit(self, name: str, cpu: bool = False) -> list[float]:
        """Seconds per unit (id, call) of each round."""
        series = (self.cpu_seconds if cpu else self.seconds)[name]
        return [s / self.per[name] for s in series]

    def median(self, name: str, cpu: bool = False) -> float:
        """Median seconds per unit."""
        return statistics.median(self.unit(name, cpu))

    def ratios(self, numerator: str, denominator: str, cpu: bool = False) -> list[float]:
        """Per-round ratios of time per unit: each compares two runs of the same round."""
        pairs = zip(self.unit(numerator, cpu), self.unit(denominator, cpu), strict=True)
        return [a / b for a, b in pairs]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_orders": self.orders,
            "units_per_run": self.per,
            "seconds_per_round": self.seconds,
            "cpu_seconds_per_round": self.cpu_seconds,
            "median_seconds_per_unit": {n: self.median(n) for n in self.seconds},
            "median_cpu_seconds_per_unit": {n: self.median(n, True) for n in self.seconds},
        }


def interleave(
    variants: Sequence[Variant], rounds: int, *, warmup: int = 1, label: str = ""
) -> Timings:
    """Time every variant once per round, rotating their order each round (ABC, BCA, CAB, ...).

    ``warmup`` untimed rounds come first (pools, statement caches, creating ticket tables).
    Each timed run starts after a full garbage collection and runs with the collector off, as
    ``timeit`` does, so one variant does not pay for another's garbage.
    """
    timings = Timings(per={v.name: v.per for v in variants})
    for v in variants:
        timings.seconds[v.name], timings.cpu_seconds[v.name] = [], []
    for index in range(-warmup, rounds):
        shift = index % len(variants)
        order = list(variants[shift:]) + list(variants[:shift])
        for variant in order:
            state = variant.setup()
            gc.collect()
            gc.disable()
            try:
                cpu, start = time.process_time(), time.perf_counter()
                variant.run(state)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            finally:
                gc.enable()
            variant.teardown(state)
            state = None  # let this run's objects go before the next variant's setup
            if index >= 0:
                timings.seconds[variant.name].append(elapsed)
                timings.cpu_seconds[variant.name].append(cpu)
        if index >= 0:
            timings.orders.append([v.name for v in order])
            shown = "  ".join(
                f"{v.name}={timings.seconds[v.name][-1] * 1e3:.1f}ms" for v in variants
            )
            log(f"  {label}round {index + 1}/{rounds}: {shown}")
    return timings


def ratio_summary(
    timings: Timings, numerator: str, denominator: str, target: float | None = None
) -> dict[str, Any]:
    """Median of the per-round ratios (the reported figure), its spread, the client-CPU ratio
    over the same runs, and the verdict when there is a ``target`` (a most)."""
    ratios = timings.ratios(numerator, denominator)
    summary: dict[str, Any] = {
        "numerator": numerator,
        "denominator": denominator,
        "per_round": ratios,
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "ratio_of_medians": timings.median(numerator) / timings.median(denominator),
        "cpu_median": statistics.median(timings.ratios(numerator, denominator, cpu=True)),
    }
    if target is not None:
        summary["target"] = target
        summary["passed"] = summary["median"] <= target
    return summary


def distribution(samples: Sequence[float]) -> dict[str, float]:
    """Count, mean, p50/p90/p99 (nearest rank) and max of ``samples`` (latencies, say)."""
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "count": len(ordered),
        "mean": statistics.fmean(ordered),
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "max": ordered[-1],
    }


# -- reports -----------------------------------------------------------------------------------


def report(
    args: argparse.Namespace,
    name: str,
    *,
    env: Mapping[str, Any],
    parameters: Mapping[str, Any],
    results: Mapping[str, Any],
    checks: Mapping[str, Mapping[str, Any]] | None = None,
    figure: Any = None,
) -> int:
    """Write ``<out>/<name>.json`` (and ``.png`` from a matplotlib ``figure``), print the
    verdicts, and return the exit status: 1 only with ``--strict`` and a check that failed."""
    checks = checks or {}
    passed = all(bool(c.get("passed", True)) for c in checks.values())
    payload = {
        "benchmark": name,
        "description": args.doc,
        "environment": {**env, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "parameters": {**parameters, "smoke": args.smoke, "backends": args.backends},
        "results": results,
        "checks": checks,
        "passed": passed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    written = [path]
    if figure is not None:
        written.append(args.out / f"{name}.png")
        figure.savefig(written[-1], dpi=40 if args.smoke else 105)  # smoke: drawn, not read
        pyplot().close(figure)
    for key, check in checks.items():
        verdict = "PASS" if check.get("passed") else "FAIL"
        spread = f" (rounds {check['min']:.3f}-{check['max']:.3f})" if "min" in check else ""
        log(f"  {key}: {check['median']:.3f}{spread}, target <= {check['target']:.3g}: {verdict}")
    log(f"overall: {'PASS' if passed else 'FAIL'}; wrote " + ", ".join(map(str, written)))
    return 1 if args.strict and not passed else 0


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


RATIO_NOTE = "medians of per-round ratios; variants interleaved, order rotated each round"


def figure(
    panels: int,
    title: str,
    env: Mapping[str, Any],
    note: str = RATIO_NOTE,
    *,
    width: float = 6.0,
    height: float = 5.0,
) -> tuple[Any, Any]:
    """A figure of ``panels`` side-by-side axes, a title, and a footnote ending in the load."""
    plt = pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(width * panels + 1, height), squeeze=False)
    fig.suptitle(title, fontsize=12)
    fig.text(0.01, 0.01, f"{note}; {load_text(env)} at start", fontsize=7.5, color="dimgray")
    fig.subplots_adjust(left=0.2 / panels + 0.08, right=0.97, wspace=0.8, bottom=0.14, top=0.86)
    return fig, list(axes[0])


def flatten(results: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``{"<group>: <name>": value}`` from ``results[group][key][name]``: one chart row each."""
    return {
        f"{LABELS.get(group, group)}: {name}": value
        for group, result in results.items()
        if isinstance(result, Mapping) and key in result
        for name, value in result[key].items()
    }


def ratio_panel(
    ax: Any, rows: Mapping[str, Mapping[str, Any]], title: str, *, log_scale: bool = False
) -> None:
    """One horizontal bar per ratio summary: the median, each round as a dot, the target as a
    red tick (a red bar missed it), the median written beside the bar."""
    for y, (_label, summary) in enumerate(rows.items()):
        target = summary.get("target")
        missed = target is not None and summary["median"] > target
        ax.barh(y, summary["median"], color="tab:red" if missed else "tab:blue", alpha=0.7)
        ax.scatter(
            summary["per_round"], [y] * len(summary["per_round"]), s=8, color="black", zorder=3
        )
        ax.annotate(
            f"{summary['median']:.2f}×"
            if summary["median"] < 100
            else f"{summary['median']:,.0f}×",
            (summary["median"], y),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=8,
            fontweight="bold",
        )
        if target is not None:
            ax.plot([target, target], [y - 0.4, y + 0.4], color="red", linewidth=2.5)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.invert_yaxis()
    if log_scale:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("time ratio (lower is faster; red tick: target)", fontsize=9)


def value_panel(
    ax: Any, values: Mapping[str, float], title: str, unit: str, *, log_scale: bool = False
) -> None:
    """One horizontal bar per value, labelled with it."""
    ax.barh(range(len(values)), list(values.values()), color="tab:green", alpha=0.7)
    for y, value in enumerate(values.values()):
        ax.annotate(
            f"{value:,.3g} {unit}",
            (value, y),
            xytext=(3, -3),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_yticks(range(len(values)), list(values), fontsize=8)
    ax.invert_yaxis()
    if log_scale:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
