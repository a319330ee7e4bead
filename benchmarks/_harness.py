"""The benchmarks' one harness: command line, throwaway databases, side-by-side timing, worker
processes, JSON and plots. A script is ``main(argv)``, a short declaration of what it compares:

    args = h.parse_args(__doc__, argv)          # --smoke --out --backends --rounds --seed --strict
    with h.throwaway_database(backend) as url:  # a new database, dropped afterwards
        h.first_contact(url, ["bench"])         # ticket tables made before any clock starts
        timings = h.interleave(variants, h.rounds(args, 21))
    return h.report(args, NAME, {"x": h.ratio_summary(timings, "a", "b", 1.2)}, title="...")

Speed is only ever the **median of per-round ratios** of variants timed side by side in one
process, order rotated each round, collector off (``benchmarks/README.md``). Only the library's
public API is used (``tests/unit/test_benchmarks_public.py`` checks every file here).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import distributions
from itertools import repeat
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import DeclarativeBase

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
BACKENDS = ("sqlite", "postgresql", "mysql")
SERVERS = {  # backend -> (environment variable, default): where throwaway databases are made
    "postgresql": ("TICKETS_BENCH_POSTGRESQL_URL",
                   "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    "mysql": ("TICKETS_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/")}
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}
SETTINGS = {  # what decides what a commit costs; in every JSON's environment["servers"]
    "postgresql": "SELECT version(), current_setting('fsync'), current_setting("
                  "'synchronous_commit'), current_setting('shared_buffers')",
    "mysql": "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, "
             "@@innodb_buffer_pool_size"}
SERVERS_SEEN: dict[str, list[str]] = {}
#: Seconds a source may take for set-up (first contact: DDL on a fresh database), which no
#: script times. The library's 2 s default bounds round trips; on a loaded two-core machine a
#: fresh database's first CREATE TABLE can outlast it, and a benchmark must not fail for that.
SETUP_TIMEOUT = 30.0
RATIO_NOTE = "medians of per-round ratios; variants interleaved, order rotated each round"


def log(message: str) -> None:
    print(message, flush=True)


def parse_args(doc: str | None, argv: Sequence[str] | None = None,
               options: Mapping[str, Any] | None = None, *, backends: Sequence[str] = BACKENDS,
               peers: Sequence[str] = ()) -> argparse.Namespace:
    """The options every script takes, and its own (``options``: flag -> ``add_argument``
    keywords); ``doc``'s first paragraph is the help; ``peers``: packages compared."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    add = parser.add_argument
    for flag, keywords in (options or {}).items():
        add(flag, **keywords)
    add("--smoke", "--quick", action="store_true", help="tiny sizes, 1 round: checks it runs")
    add("--backends", default=",".join(backends), help="comma-separated: " + ",".join(BACKENDS))
    add("--rounds", type=int, default=None, help="timed rounds (default per script)")
    add("--seed", type=int, default=1, help="seed of every random choice a script makes")
    add("--out", type=Path, default=BENCH_DIR / "results", help="where the JSON and PNG go")
    add("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.backends.split(",") if name.strip()]
    if not chosen or set(chosen) - set(BACKENDS):
        parser.error(f"--backends takes names from {','.join(BACKENDS)}; got {args.backends!r}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.backends, args.doc, args.env = chosen, doc or "", environment(*peers)
    return args


def ints(text: str) -> list[int]:
    """An option's comma-separated whole numbers (``--procs 2,8,24``)."""
    return [int(x) for x in text.split(",") if x.strip()]


def rounds(args: argparse.Namespace, full: int) -> int:
    """``--rounds``, else 1 in smoke mode, else the script's ``full``."""
    return int(args.rounds or (1 if args.smoke else full))


@contextlib.contextmanager
def throwaway_database(backend: str) -> Iterator[URL]:
    """A new empty database ``tickets_bench_<hex>``, dropped afterwards whatever happens: SQLite,
    a file in a temporary directory; servers, on the one ``$TICKETS_BENCH_<BACKEND>_URL`` names
    (PostgreSQL ``DROP ... WITH (FORCE)``: a connection a failed run left must not keep it)."""
    name = f"tickets_bench_{uuid.uuid4().hex[:12]}"
    log(f"[{backend}] a throwaway database, {name}")
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tickets_bench_", ignore_cleanup_errors=True) as d:
            yield URL.create("sqlite", database=os.path.join(d, f"{name}.db"))
        return
    server_url = make_url(os.environ.get(*SERVERS[backend]))
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    quoted = admin.dialect.identifier_preparer.quote(name)
    force = " WITH (FORCE)" if backend == "postgresql" else ""
    with admin.connect() as conn:  # NullPool: no connection outlives its block
        conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        SERVERS_SEEN[backend] = [str(x) for x in conn.exec_driver_sql(SETTINGS[backend]).one()]
    try:
        yield server_url.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")


def databases(stack: contextlib.ExitStack, *backends: str) -> list[str]:
    """A throwaway database per backend, as URL strings (passwords kept), dropped by ``stack``."""
    return [stack.enter_context(throwaway_database(b)).render_as_string(hide_password=False)
            for b in backends]


def first_contact(bind: Any, sequences: Sequence[str], *, embedded: bool = False) -> None:
    """The sequences' ticket tables, stamps and identities made with :data:`SETUP_TIMEOUT` before
    any clock starts (``embedded``: those of the engine ``bind``'s embedded default)."""
    from sqlalchemy_tickets import TicketServer

    server = TicketServer(bind, timeout=SETUP_TIMEOUT, embedded=embedded)
    with contextlib.closing(server):
        for sequence in sequences:
            server.next_block(sequence, 1)


def tier_contact(dc: str, upstream: Any, sequences: Sequence[str], **settings: Any) -> None:
    """A datacenter's tier tables and the sequences' first stock, through ``upstream`` by a tier at
    ``settings`` (those timed afterwards), with :data:`SETUP_TIMEOUT`, before any clock starts."""
    from sqlalchemy_tickets import DatacenterTier
    from sqlalchemy_tickets.sources.datacenter import create_datacenter_tables

    create_datacenter_tables(dc, timeout=SETUP_TIMEOUT)
    with DatacenterTier(dc, upstream=upstream, **{**settings, "timeout": SETUP_TIMEOUT}) as tier:
        for sequence in sequences:
            tier.next_id(sequence)
        tier.wait_idle(30.0)


def pair_contact(pair: Sequence[str], sequence: str,
                 tiers: Mapping[str, Mapping[str, Any]]) -> None:
    """The sequence's rows on both servers of ``pair``, its first stock in each of ``tiers``."""
    from sqlalchemy_tickets import TicketServers

    with contextlib.closing(TicketServers(pair, timeout=SETUP_TIMEOUT)) as servers:
        servers.next_id(sequence)
        servers.next_id(sequence)
        for dc, settings in tiers.items():
            tier_contact(dc, servers, [sequence], **settings)


def stock(dc: str, sequence: str) -> dict[str, Any]:
    """The datacenter's stock of ``sequence`` (``describe_datacenter``), as a dict."""
    from sqlalchemy_tickets.sources.datacenter import describe_datacenter

    found = [s for s in describe_datacenter(dc, timeout=10.0) if s.sequence == sequence]
    return found[0].as_dict() if found else {"stock": 0, "rate": 0.0, "runway": None}


class Base(DeclarativeBase):
    """The declarative base of the scripts' ORM models (a script's process holds its own)."""


@contextlib.contextmanager
def throwaway_engine(backend: str, metadata: sa.MetaData | None = None) -> Iterator[sa.Engine]:
    """An engine on a :func:`throwaway_database` with ``metadata``'s tables, disposed at exit."""
    with throwaway_database(backend) as url:
        engine = sa.create_engine(url)
        try:
            if metadata is not None:
                metadata.create_all(engine)
            yield engine
        finally:
            engine.dispose()


def empty_table(engine: sa.Engine, table: sa.Table) -> None:
    """Untimed, between runs: ``TRUNCATE`` (no dead rows left behind), SQLite ``DELETE``."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(table.delete())
        else:
            quoted = conn.dialect.identifier_preparer.quote(table.name)
            conn.exec_driver_sql(f"TRUNCATE TABLE {quoted}")


def count_rows(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


def git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def environment(*peers: str) -> dict[str, Any]:
    """Versions on the measured path (``peers``: packages compared), commit, src digest, load."""
    digest = hashlib.sha256()
    for path in sorted((REPO_DIR / "src").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_DIR)).encode() + b"\0" + path.read_bytes())
    key = lambda name: name.lower().replace("_", "-")  # noqa: E731 - as distributions spell it
    names = {key(n) for n in ("sqlalchemy-tickets", "SQLAlchemy", "psycopg", "PyMySQL",
                              "matplotlib", *peers)}
    return {"python": sys.version, "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
            "load_average_at_start": load(),
            "packages": {d.metadata["Name"]: d.version for d in distributions()
                         if key(d.metadata["Name"]) in names},
            "git_commit": git("rev-parse", "HEAD"),
            "git_src_dirty": bool(git("status", "--porcelain", "--", "src")),
            "src_sha256": digest.hexdigest(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def loop(call: Callable[..., Any], n: int, *args: Any,
         nones: list[int] | None = None) -> Callable[[Any], None]:
    """A variant's ``run``: ``call(*args)`` ``n`` times, in the cheapest Python loop there is.
    With ``nones`` (a generator returning ``None``: snowflake-id), each run appends its misses."""

    def run(_: Any = None) -> None:
        for _ in repeat(None, n):
            call(*args)

    def counting(_: Any = None) -> None:
        missed = 0
        for _ in repeat(None, n):
            if call() is None:
                missed += 1
        nones.append(missed)  # type: ignore[union-attr]

    return run if nones is None else counting


@dataclass
class Variant:
    """One thing to time: ``setup()`` (untimed) returns what ``run(state)`` (timed) takes, then
    ``teardown(state)`` (untimed). ``per``: units (ids, calls) a run makes, compared per unit."""

    name: str
    run: Callable[[Any], Any]
    setup: Callable[[], Any] = lambda: None
    teardown: Callable[[Any], None] = lambda state: None
    per: int = 1


def watched(variant: Variant, source: Any, into: list[int], key: str = "blocking_waits"
            ) -> Variant:
    """``variant`` with ``source``'s refills awaited before each run and the growth of
    ``source.stats()[key]`` over each run (the warm-up round's first) appended to ``into``."""

    def setup() -> Any:
        source.wait_idle(30.0)
        into.append(-source.stats()[key])
        return variant.setup()

    def teardown(state: Any) -> None:
        into[-1] += source.stats()[key]
        variant.teardown(state)

    return Variant(variant.name, variant.run, setup, teardown, variant.per)


@dataclass
class Timings:
    """Seconds per run of each variant, index ``i`` = round ``i``: wall-clock time (what is
    compared) and this process's CPU time (the client's share, which other load barely touches)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu_seconds: dict[str, list[float]] = field(default_factory=dict)
    per: dict[str, int] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)

    @classmethod
    def of(cls, per: Mapping[str, int]) -> Timings:
        """No runs yet of the variants ``per`` names, with their units per run."""
        return cls({n: [] for n in per}, {n: [] for n in per}, dict(per))

    def unit(self, name: str, cpu: bool = False) -> list[float]:
        """Seconds per unit (id, call) of each round."""
        return [s / self.per[name] for s in (self.cpu_seconds if cpu else self.seconds)[name]]

    def median(self, name: str, cpu: bool = False) -> float:
        return statistics.median(self.unit(name, cpu))

    def ratios(self, numerator: str, denominator: str, cpu: bool = False) -> list[float]:
        """Per-round ratios of time per unit: each compares two runs of the same round."""
        pairs = zip(self.unit(numerator, cpu), self.unit(denominator, cpu), strict=True)
        return [a / b for a, b in pairs]

    def to_json(self, per_unit: str | None = None, scale: float = 1.0) -> dict[str, Any]:
        """Every raw timing, after the median time per unit times ``scale`` under ``per_unit``."""
        medians = {per_unit: {n: self.median(n) * scale for n in self.seconds}} if per_unit else {}
        return {**medians, "run_orders": self.orders, "units_per_run": self.per,
                "seconds_per_round": self.seconds, "cpu_seconds_per_round": self.cpu_seconds,
                "median_seconds_per_unit": {n: self.median(n) for n in self.seconds}}


def interleave(variants: Sequence[Variant], rounds: int, *, warmup: int = 1,
               label: str = "") -> Timings:
    """Every variant once per round, order rotated (ABC, BCA, CAB...), after ``warmup`` rounds."""
    timings = Timings.of({v.name: v.per for v in variants})
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
            state = None  # this run's objects go before the next variant's setup
            if index >= 0:
                timings.seconds[variant.name].append(elapsed)
                timings.cpu_seconds[variant.name].append(cpu)
        if index >= 0:
            timings.orders.append([v.name for v in order])
            log(f"  {label}round {index + 1}/{rounds}: " + "  ".join(
                f"{v.name}={timings.seconds[v.name][-1] * 1e3:.1f}ms" for v in variants))
    return timings


def ratio_summary(timings: Timings, numerator: str, denominator: str,
                  target: float | None = None) -> dict[str, Any]:
    """Median of the per-round ratios (the reported figure), its spread, the client-CPU ratio
    over the same runs, and the verdict when there is a ``target`` (a most)."""
    ratios = timings.ratios(numerator, denominator)
    summary = {"numerator": numerator, "denominator": denominator, "per_round": ratios,
               "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
               "ratio_of_medians": timings.median(numerator) / timings.median(denominator),
               "cpu_median": statistics.median(timings.ratios(numerator, denominator, True))}
    return summary if target is None else {**summary, "target": target,
                                           "passed": summary["median"] <= target}


def check(value: float, target: float, passed: bool | None = None) -> dict[str, Any]:
    """A check that is not a ratio: passed if ``value`` <= ``target``, or as ``passed`` says."""
    return {"median": value, "target": target,
            "passed": value <= target if passed is None else passed}


def distribution(samples: Sequence[float]) -> dict[str, float]:
    """Count, mean, p50/p90/p99 (nearest rank) and max of ``samples`` (latencies, say)."""
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"count": len(ordered), "mean": statistics.fmean(ordered), "p50": pick(0.5),
            "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1]}


def timed(call: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """``call(*args)`` once: the seconds it took (``perf_counter``) and what it returned."""
    start = time.perf_counter()
    result = call(*args)
    return time.perf_counter() - start, result


def window(call: Callable[[], Any], start: float, seconds: float,
           catch: type[BaseException] | tuple[type[BaseException], ...] = ()
           ) -> tuple[list[float], list[Any], list[str]]:
    """``call()`` back to back from the monotonic instant ``start`` (:meth:`Fleet.go`) for
    ``seconds``, collector off: latencies, results, and ``repr`` of errors of types ``catch``."""
    latencies, results, errors, clock, now = [], [], [], time.perf_counter, time.monotonic
    gc.collect()
    gc.disable()
    try:
        time.sleep(max(0.0, start - now()))
        while now() < start + seconds:
            began = clock()
            try:
                result = call()
            except catch as error:
                errors.append(repr(error))
                continue
            latencies.append(clock() - began)
            results.append(result)
    finally:
        gc.enable()
    return latencies, results, errors


class Fleet(contextlib.AbstractContextManager):  # type: ignore[type-arg]
    """Worker processes (``method`` spawn or fork) running the module-level ``target(spec, conn)``,
    each with a pipe: :meth:`tell` sends, :meth:`hear` receives one message from each (an error or
    silence raises). At the exit, ``grace`` seconds to end, then what still runs is killed."""

    def __init__(self, target: Callable[[Any, Any], None], specs: Sequence[Any] = (), *,
                 method: str = "spawn", grace: float = 0.0) -> None:
        import multiprocessing

        self.target, self.grace = target, grace
        self.ctx = multiprocessing.get_context(method)
        self.workers: list[tuple[Any, Any]] = []
        self.start(specs)

    def start(self, specs: Sequence[Any]) -> list[int]:
        """One worker per spec; their indexes."""
        for spec in specs:
            mine, theirs = self.ctx.Pipe()
            process = self.ctx.Process(target=work, args=(self.target, spec, theirs),
                                       daemon=True)
            process.start()
            theirs.close()
            self.workers.append((process, mine))
        return list(range(len(self.workers) - len(specs), len(self.workers)))

    def tell(self, message: Any, indexes: Sequence[int] | None = None) -> None:
        for i in range(len(self.workers)) if indexes is None else indexes:
            self.workers[i][1].send(message)

    def hear(self, indexes: Sequence[int] | None = None, timeout: float = 180.0) -> list[Any]:
        answers = []
        for i in range(len(self.workers)) if indexes is None else indexes:
            process, pipe = self.workers[i]
            try:
                answers.append(pipe.recv() if pipe.poll(timeout) else {
                    "error": f"no answer within {timeout:.0f} s"})
            except EOFError:
                answers.append({"error": f"exited ({process.exitcode}) without answering"})
            if isinstance(answers[-1], dict) and "error" in answers[-1]:
                raise RuntimeError(f"worker {i} failed:\n{answers[-1]['error']}")
        return answers

    def go(self, indexes: Sequence[int] | None = None, delay: float = 0.5) -> None:
        """Once each of the workers chosen said it is ready (one message each), send them one
        instant to start at, ``delay`` s from now on the monotonic clock they share."""
        self.hear(indexes)
        self.tell(time.monotonic() + delay, indexes)

    def ask(self, message: Any, indexes: Sequence[int] | None = None) -> list[Any]:
        self.tell(message, indexes)
        return self.hear(indexes)

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + (self.grace if exc[0] is None else 0.0)
        for process, pipe in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(10)
            pipe.close()


def work(target: Callable[[Any, Any], None], spec: Any, conn: Any) -> None:
    """A :class:`Fleet` worker: what ``target`` raises goes to the parent, and to stderr (some
    parents, the campaign's, hear nothing from their workers)."""
    try:
        target(spec, conn)
    except BaseException:
        traceback.print_exc()
        conn.send({"error": traceback.format_exc()})
        raise SystemExit(1) from None


@contextlib.contextmanager
def source_tree(ref: str, *, missing_ok: bool = False) -> Iterator[tuple[Path, str]]:
    """``src/`` at git ``ref``, exported into a temporary directory, and the commit. A ref this
    clone lacks (shallow, an export) is an error, unless ``missing_ok``: this tree stands in."""
    commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if not commit:
        if not missing_ok:
            raise SystemExit(f"{ref!r} names no commit here (a clone with its history needed)")
        log(f"{ref!r} is not here: this tree stands in for it")
        yield REPO_DIR / "src", "this tree"
        return
    with tempfile.TemporaryDirectory(prefix="tickets_bench_src_", ignore_cleanup_errors=True) as d:
        archive = subprocess.run(["git", "-C", str(REPO_DIR), "archive", commit, "src"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", d], input=archive, check=True)
        yield Path(d) / "src", commit


def report(args: argparse.Namespace, name: str, results: Mapping[str, Any], *,
           parameters: Mapping[str, Any] | None = None,
           checks: Mapping[str, Mapping[str, Any]] | None = None, figure: Any = None,
           title: str | None = None, **drawing: Any) -> int:
    """Write ``<out>/<name>.json`` and ``.png`` (``figure``, or with a ``title`` the
    :func:`ratio_figure`), print the verdicts; exit status 1 only if one failed and --strict."""
    checks = {**{k: v for k, v in found(results, "ratios").items() if "target" in v},
              **(checks or {})}
    if figure is None and title is not None:
        figure = ratio_figure(title, args.env, results, **drawing)
    passed = all(bool(c.get("passed", True)) for c in checks.values())
    payload = {"benchmark": name, "description": args.doc,
               "environment": {**args.env, "servers": SERVERS_SEEN, "load_average_at_end": load(),
                               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
               "parameters": {**(parameters or {}), "smoke": args.smoke, "backends": args.backends,
                              "seed": args.seed},
               "results": results, "checks": checks, "passed": passed}
    args.out.mkdir(parents=True, exist_ok=True)
    written = [args.out / f"{name}.json"]
    written[0].write_text(json.dumps(payload, indent=2, default=str) + "\n")
    if figure is not None:
        written.append(args.out / f"{name}.png")
        figure.savefig(written[-1], dpi=40 if args.smoke else 105)  # smoke: drawn, not read
        pyplot().close(figure)
    for key, c in checks.items():
        spread = f" (rounds {c['min']:.3f}-{c['max']:.3f})" if "min" in c else ""
        spread += f", client CPU-time ratio {c['cpu_median']:.3g}" if "cpu_median" in c else ""
        log(f"  {key}: {c['median']:.3g}{spread}, target <= {c['target']:.3g}: "
            + ("PASS" if c.get("passed") else "FAIL"))
    log(f"overall: {'PASS' if passed else 'FAIL'}; wrote " + ", ".join(map(str, written)))
    return 1 if args.strict and not passed else 0


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(panels: int, title: str, env: Mapping[str, Any], note: str = RATIO_NOTE, *,
           width: float = 6.0, height: float = 5.0, **adjust: float) -> tuple[Any, list[Any]]:
    """``panels`` axes side by side, a title, a footnote with the load; ``adjust``: layout."""
    fig, axes = pyplot().subplots(1, panels, figsize=(width * panels + 1, height), squeeze=False)
    fig.suptitle(title, fontsize=12)
    fig.text(0.01, 0.01, f"{note}; load avg {env.get('load_average_at_start')} at start",
             fontsize=7.5, color="dimgray")
    fig.subplots_adjust(**{"left": 0.3 / panels + 0.08, "right": 0.97, "wspace": 0.8,
                           "bottom": 0.14, "top": 0.86, **adjust})
    return fig, list(axes[0])


def found(results: Mapping[str, Any], key: str, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every value under ``key`` (a name, or ``"ratios"``: every ratio summary, wherever it is)
    in ``results``, labelled by its path: ``{"PostgreSQL: next_id / raw": ...}``."""
    rows = {}
    for name, value in results.items():
        here = (*path, LABELS.get(str(name), str(name)))
        if key == "ratios" and isinstance(value, Mapping) and "per_round" in value:
            rows[": ".join(p for p in here if not p.startswith("ratio"))] = value
        elif name == key and isinstance(value, Mapping):
            rows |= {": ".join((*path, str(k))): v for k, v in value.items()}
        elif isinstance(value, Mapping):
            rows |= found(value, key, here)
    return rows


def ratio_figure(title: str, env: Mapping[str, Any], results: Mapping[str, Any], *,
                 values: tuple[str, str, str] | None = None, log_scale: bool = False,
                 height: float = 5.0) -> Any:
    """Every ratio in ``results`` as a bar; with ``values = (key, title, unit)``, ``key``'s too."""
    fig, axes = figure(2 if values else 1, title, env, height=height)
    ratio_panel(axes[0], found(results, "ratios"), "time ratio per round", log_scale=log_scale)
    if values:
        value_panel(axes[1], found(results, values[0]), values[1], values[2], log_scale=True)
    return fig


def ratio_panel(ax: Any, rows: Mapping[str, Mapping[str, Any]], title: str, *,
                log_scale: bool = False) -> None:
    """A bar per ratio summary (its median, written), its rounds as dots, its target a red tick."""
    for y, summary in enumerate(rows.values()):
        target, median = summary.get("target"), summary["median"]
        ax.barh(y, median, alpha=0.7, color="tab:red" if target is not None and median > target
                else "tab:blue")
        ax.scatter(summary["per_round"], [y] * len(summary["per_round"]), s=8, color="black",
                   zorder=3)
        ax.annotate(f"{median:.2f}×" if median < 100 else f"{median:,.0f}×", (median, y),
                    xytext=(4, 4), textcoords="offset points", fontsize=8, fontweight="bold")
        if target is not None:
            ax.plot([target, target], [y - 0.4, y + 0.4], color="red", linewidth=2.5)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    finish(ax, list(rows), title, log_scale)
    ax.set_xlabel("time ratio (lower is faster; red tick: target)", fontsize=9)


def value_panel(ax: Any, values: Mapping[str, float], title: str, unit: str, *,
                log_scale: bool = False) -> None:
    """One horizontal bar per value, labelled with it."""
    ax.barh(range(len(values)), list(values.values()), color="tab:green", alpha=0.7)
    for y, value in enumerate(values.values()):
        ax.annotate(f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}", (value, y),
                    xytext=(3, -3), textcoords="offset points", fontsize=8)
    finish(ax, list(values), title, log_scale)


def line_panel(ax: Any, series: Mapping[str, Sequence[tuple[float, float]]], title: str,
               unit: str, xlabel: str, *, goal: float | None = None, base: int = 10) -> None:
    """One line per series of ``(x, y)`` points (every other one dashed), the values written
    beside the points, x on a log scale, ``goal`` a red dotted line."""
    for i, (label, points) in enumerate(series.items()):
        if points:
            ax.plot(*zip(*sorted(points), strict=True), "o--" if i % 2 == 0 else "s-", label=label)
            for x, y in points:
                ax.annotate(f"{y:,.3g}", (x, y), xytext=(3, 3), textcoords="offset points",
                            fontsize=7)
    if goal:
        ax.axhline(goal, color="red", linestyle=":", linewidth=1.2, label="goal")
    ax.set_xscale("log", base=base)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(unit, fontsize=9)
    ax.legend(fontsize=7)


def finish(ax: Any, labels: list[str], title: str, log_scale: bool) -> None:
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    if log_scale:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
