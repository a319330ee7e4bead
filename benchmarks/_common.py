"""Helpers shared by the benchmark scripts: throwaway databases, interleaved timing, reports.

Speed is only ever reported as a ratio of two variants timed side by side in one process: the
variants run in interleaved rounds (the order rotates each round, so none always runs first or
last), every round's ratio is taken between timings made seconds apart, and the reported figure
is the median of those per-round ratios. Nothing here compares an absolute time with a limit.
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
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_DIR = BENCH_DIR.parent

BACKENDS = ("sqlite", "postgresql", "mysql")
URL_ENV = {
    "postgresql": "TICKETS_BENCH_POSTGRESQL_URL",
    "mysql": "TICKETS_BENCH_MYSQL_URL",
}
DEFAULT_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/",
}


# -- command line ------------------------------------------------------------------------------


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The options every benchmark takes: ``--quick``, ``--backends``, ``--rounds``, ``--strict``
    (``extra`` adds a script's own)."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few rounds: a smoke test"
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated subset of %(default)s",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per variant (default: per script)"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 when a target is missed (default: report only)",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.backends.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown or not chosen:
        parser.error(f"--backends takes names from {','.join(BACKENDS)}; got {args.backends!r}")
    args.backends = chosen
    return args


def log(message: str) -> None:
    print(message, flush=True)


# -- throwaway databases -----------------------------------------------------------------------


def admin_url(backend: str) -> URL:
    """The server URL a benchmark connects to in order to create its database."""
    return make_url(os.environ.get(URL_ENV[backend], DEFAULT_URLS[backend]))


@contextlib.contextmanager
def throwaway_database(backend: str) -> Iterator[URL]:
    """Yield the URL of a new empty database ``tickets_bench_<hex>``; drop it afterwards.

    SQLite: a file in a new temporary directory (the embedded default puts its ticket file
    beside it), removed with the directory. PostgreSQL/MySQL: ``CREATE DATABASE`` on the server
    named by ``TICKETS_BENCH_<BACKEND>_URL``; callers dispose their engines before leaving.
    """
    name = f"tickets_bench_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="tickets_bench_")
        try:
            yield URL.create("sqlite", database=os.path.join(directory, f"{name}.db"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    server = admin_url(backend)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        try:
            yield server.set(database=name)
        finally:
            with admin.connect() as conn:
                if backend == "postgresql":
                    # FORCE: a connection a failed run left open must not keep the database.
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                else:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    finally:
        admin.dispose()


def server_info(backend: str, url: URL) -> dict[str, Any]:
    """The server's version and the settings that decide what a commit costs."""
    if backend == "sqlite":
        import sqlite3

        probe = sqlite3.connect(str(url.database))
        try:
            journal = probe.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = probe.execute("PRAGMA synchronous").fetchone()[0]
        finally:
            probe.close()
        return {
            "version": sqlite3.sqlite_version,
            "journal_mode": journal,
            "synchronous": synchronous,
            "database_directory": os.path.dirname(str(url.database)),
        }
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if backend == "postgresql":
                names = ("server_version", "fsync", "synchronous_commit", "shared_buffers")
                query = sa.text("SELECT name, setting FROM pg_settings WHERE name IN :names")
                query = query.bindparams(sa.bindparam("names", expanding=True))
                rows = conn.execute(query, {"names": list(names)}).all()
                info = {name: setting for name, setting in rows}
                info["version"] = conn.exec_driver_sql("SELECT version()").scalar()
                return info
            row = conn.exec_driver_sql(
                "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, "
                "@@innodb_buffer_pool_size"
            ).one()
            return {
                "version": row[0],
                "innodb_flush_log_at_trx_commit": row[1],
                "sync_binlog": row[2],
                "log_bin": row[3],
                "innodb_buffer_pool_size": row[4],
            }
    finally:
        engine.dispose()


def redact(url: URL) -> str:
    return url.render_as_string(hide_password=True)


# -- environment -------------------------------------------------------------------------------


def _version(distribution: str) -> str | None:
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


def _src_digest() -> str:
    """SHA-256 over the library's source files: which code was measured, committed or not."""
    digest = hashlib.sha256()
    for path in sorted((REPO_DIR / "src").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_DIR)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def environment() -> dict[str, Any]:
    """Versions of everything on the measured path, and how busy the machine was."""
    import sqlite3

    dirty = _git("status", "--porcelain", "--", "src")
    return {
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": {
            name: _version(name)
            for name in (
                "sqlalchemy-tickets",
                "SQLAlchemy",
                "psycopg",
                "psycopg-binary",
                "PyMySQL",
                "matplotlib",
            )
        },
        "sqlite_library": sqlite3.sqlite_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_src_dirty": None if dirty is None else bool(dirty),
        "src_sha256": _src_digest(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# -- interleaved timing ------------------------------------------------------------------------


@dataclass
class Variant:
    """One thing to time. ``setup()`` (untimed) returns what ``run(state)`` (timed) takes;
    ``teardown(state)`` (untimed) runs after it."""

    name: str
    run: Callable[[Any], Any]
    setup: Callable[[], Any] = lambda: None
    teardown: Callable[[Any], None] = lambda state: None


@dataclass
class Timings:
    """Seconds per round for each variant; index ``i`` of every list is round ``i``.

    ``seconds`` is wall-clock time (what is compared); ``cpu_seconds`` is this process's CPU
    time over the same run: the client-side share, which the server and other load barely touch.
    """

    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu_seconds: dict[str, list[float]] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def cpu_median(self, name: str) -> float:
        return statistics.median(self.cpu_seconds[name])

    def ratios(self, numerator: str, denominator: str) -> list[float]:
        """Per-round ratios: each compares two timings made in the same round."""
        pairs = zip(self.seconds[numerator], self.seconds[denominator], strict=True)
        return [a / b for a, b in pairs]


def interleave(
    variants: Sequence[Variant], rounds: int, *, warmup: int = 1, label: str = ""
) -> Timings:
    """Time every variant once per round, rotating their order each round (ABC, BCA, CAB, ...).

    ``warmup`` untimed rounds come first (connection pools, statement caches, first-contact
    work such as creating ticket tables). Each timed run starts after a full garbage collection
    and runs with the collector off, as ``timeit`` does, so one variant does not pay for
    another's garbage.
    """
    timings = Timings(
        seconds={v.name: [] for v in variants}, cpu_seconds={v.name: [] for v in variants}
    )
    for index in range(-warmup, rounds):
        shift = index % len(variants)
        order = list(variants[shift:]) + list(variants[:shift])
        for variant in order:
            state = variant.setup()
            gc.collect()
            gc.disable()
            try:
                cpu_start = time.process_time()
                start = time.perf_counter()
                variant.run(state)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu_start
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
    timings: Timings, numerator: str, denominator: str, target: float | None
) -> dict[str, Any]:
    """Median of the per-round ratios (the reported figure), with its spread and the verdict."""
    ratios = timings.ratios(numerator, denominator)
    median = statistics.median(ratios)
    summary: dict[str, Any] = {
        "numerator": numerator,
        "denominator": denominator,
        "per_round": ratios,
        "median": median,
        "min": min(ratios),
        "max": max(ratios),
        "ratio_of_medians": timings.median(numerator) / timings.median(denominator),
    }
    if target is not None:
        summary["target"] = target
        summary["passed"] = median <= target
    return summary


# -- reports -----------------------------------------------------------------------------------


def write_json(name: str, payload: Mapping[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    body = {**payload}
    body.setdefault("environment", {})["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if hasattr(os, "getloadavg"):
        body["environment"]["load_average_at_end"] = list(os.getloadavg())
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return path


@dataclass
class RatioBar:
    """One bar of the ratio chart: the median of ``per_round``, whose points are drawn on it."""

    group: str
    label: str
    per_round: list[float]
    target: float | None = None


def plot(
    name: str,
    *,
    title: str,
    bars: Sequence[RatioBar],
    ratio_ylabel: str,
    target: float,
    target_label: str,
    side_title: str,
    side_ylabel: str,
    side_values: Mapping[str, Mapping[str, float]],
    side_log: bool = False,
    footnote: str = "",
) -> Path:
    """Two panels: ratio bars (median, per-round points, target line) and a side panel of
    medians per group and variant, for context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    groups = list(dict.fromkeys(bar.group for bar in bars))
    labels = list(dict.fromkeys(bar.label for bar in bars))
    colors = plt.get_cmap("tab10").colors
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6.2), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(1, len(labels))
    top = target
    for j, label in enumerate(labels):
        for i, group in enumerate(groups):
            found = [b for b in bars if b.group == group and b.label == label]
            if not found:
                continue
            bar = found[0]
            median = statistics.median(bar.per_round)
            x = i + (j - (len(labels) - 1) / 2) * width
            passed = bar.target is None or median <= bar.target
            left.bar(
                x,
                median,
                width * 0.9,
                color=colors[j % len(colors)],
                edgecolor="black" if passed else "red",
                linewidth=0.8 if passed else 2.2,
            )
            left.scatter([x] * len(bar.per_round), bar.per_round, s=9, color="black", zorder=3)
            # The median is written at the foot of its bar, clear of the dots near its top.
            left.annotate(
                f"{median:.2f}×",
                (x, 0),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                va="bottom",
                fontsize=10,
                fontweight="bold",
                color="white",
                zorder=4,
            )
            top = max(top, median, *bar.per_round)
    left.axhline(target, color="red", linestyle="--", linewidth=1.3)
    left.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    left.set_xticks(range(len(groups)), groups)
    left.set_ylim(0, top * 1.18)
    left.set_ylabel(ratio_ylabel)
    left.set_xlabel("backend")
    left.set_title(
        "median of per-round ratios (dots: each round; red edge: target missed)", fontsize=10
    )
    # Legends go under the axes, where they cannot hide a bar, a dot or a label.
    handles: list[Any] = [
        Patch(facecolor=colors[j % len(colors)], edgecolor="black", label=label)
        for j, label in enumerate(labels)
    ]
    handles.append(Line2D([], [], color="red", linestyle="--", label=target_label))
    left.legend(
        handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3
    )

    variants = list(dict.fromkeys(v for values in side_values.values() for v in values))
    side_groups = list(side_values)
    side_width = 0.8 / max(1, len(variants))
    for j, variant in enumerate(variants):
        xs = [i + (j - (len(variants) - 1) / 2) * side_width for i in range(len(side_groups))]
        ys = [side_values[g].get(variant, float("nan")) for g in side_groups]
        right.bar(xs, ys, side_width * 0.9, label=variant, color=colors[(j + 3) % len(colors)])
    right.set_xticks(range(len(side_groups)), side_groups)
    right.set_xlabel("backend")
    right.set_ylabel(side_ylabel)
    right.set_title(side_title, fontsize=10)
    if side_log:
        right.set_yscale("log")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.suptitle(title, fontsize=12)
    if footnote:
        fig.text(0.01, 0.01, footnote, fontsize=7.5, color="dimgray", va="bottom")
    fig.tight_layout(rect=(0, 0.06 if footnote else 0, 1, 0.95))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_text(env: Mapping[str, Any]) -> str:
    """``load avg 0.34 0.38 0.21`` (1, 5, 15 min) at the start of the run, for footnotes."""
    load = env.get("load_average_at_start")
    return "load avg n/a" if not load else "load avg " + " ".join(f"{x:.2f}" for x in load)


def verdict_lines(checks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``backend: ratio=… target ≤ … PASS/FAIL`` lines for the console."""
    lines = []
    for key, summary in checks.items():
        state = "PASS" if summary.get("passed") else "FAIL"
        lines.append(
            f"  {key}: median ratio {summary['median']:.3f} (rounds {summary['min']:.3f}"
            f"-{summary['max']:.3f}), target <= {summary['target']}: {state}"
        )
    return lines
