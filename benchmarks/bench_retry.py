"""What ``retry_session`` costs when nothing fails: a 1,000-row insert unit with and without it.

The model is keyed by ``mapped_column(TicketId("bench"), primary_key=True)`` with the embedded
default (nothing configured), plus a ``String(50)`` and an ``Integer``. The unit of work is

    def work(session):
        session.add_all([Row(title=..., n=i) for i in range(1000)])
        return 1000

timed as

* ``retry``: ``retry_session(sessionmaker(engine), work)`` (defaults: 5 attempts, back-off 0.1 s);
* ``plain``: ``with Session() as s: work(s); s.commit()``;
* ``plain A/A``: the same plain code again, under another name: the ratio plain A/A / plain shows
  how far two identical variants drift apart on this machine (the noise floor);
* ``retry, objs`` / ``plain, objs``: the same two with a ``work`` that returns its 1,000 objects
  (which the caller keeps, as one does to read the new ids). ``retry_session`` must hold the
  unit's objects until COMMIT has an answer (to replay them), so with ``work`` above the plain
  session lets them go at the flush while ``retry_session`` keeps them alive through COMMIT,
  whose ``expire_on_commit`` then expires 1,000 live states: ``plain, objs / plain`` measures
  that lifetime effect alone, ``retry, objs / plain, objs`` what remains (the bookkeeping);
* ``retry, no expire`` / ``plain, no expire``: the first two with
  ``sessionmaker(engine, expire_on_commit=False)``, where keeping the objects costs ~nothing.

Each timed run performs ``K`` units back to back (K = 5; ``--quick``: 2), on a table emptied
before the run (``TRUNCATE``, SQLite ``DELETE``; untimed); the variants run in interleaved rounds
(order rotated). Overhead = retry / plain, the median of per-round ratios. The client CPU time
ratio over the same runs is reported too (less sensitive to the server and other load). Every
run's rows are counted afterwards, and any warning the library logs (a retry) is counted: none
is expected.

Target: retry / plain <= 1.05 on every backend.

    .venv/bin/python benchmarks/bench_retry.py [--quick] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import logging
import statistics
import sys
from typing import Any

import sqlalchemy as sa
from _common import (
    RESULTS_DIR,
    Timings,
    Variant,
    environment,
    interleave,
    load_text,
    log,
    parse_args,
    ratio_summary,
    redact,
    server_info,
    throwaway_database,
    verdict_lines,
    write_json,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqlalchemy_tickets import TicketId, TicketServer, retry_session
from sqlalchemy_tickets.sources.default import embedded_source

NAME = "bench_retry"
TARGET = 1.05  # retry_session time / plain session time
ROWS = 1_000


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "bench_retry"
    id: Mapped[int] = mapped_column(TicketId("bench"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


def work(session: Session) -> int:
    session.add_all([Row(title=f"title {i:08d}", n=i) for i in range(ROWS)])
    return ROWS


def work_objs(session: Session) -> list[Row]:
    objs = [Row(title=f"title {i:08d}", n=i) for i in range(ROWS)]
    session.add_all(objs)
    return objs


class WarningCounter(logging.Handler):
    """Counts the library's warnings (``retry_session`` logs one per retry)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def empty_table(engine: sa.Engine, backend: str) -> None:
    with engine.begin() as conn:
        if backend == "sqlite":
            conn.exec_driver_sql(f"DELETE FROM {Row.__tablename__}")
        else:
            conn.exec_driver_sql(f"TRUNCATE TABLE {Row.__tablename__}")


def count_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(sa.select(sa.func.count()).select_from(Row.__table__)) or 0)


def make_variants(engine: sa.Engine, backend: str, units: int) -> list[Variant]:
    factory = sessionmaker(engine)
    no_expire = sessionmaker(engine, expire_on_commit=False)

    def setup() -> None:
        empty_table(engine, backend)

    def check(name: str) -> Any:
        def teardown(_: Any) -> None:
            written = count_rows(engine)
            assert written == units * ROWS, f"{name}: {written} rows, expected {units * ROWS}"

        return teardown

    def run_retry(_: Any) -> None:
        for _ in range(units):
            retry_session(factory, work)

    def run_plain(_: Any) -> None:
        for _ in range(units):
            with factory() as session:
                work(session)
                session.commit()

    def run_retry_objs(_: Any) -> None:
        kept = []
        for _ in range(units):
            kept.append(retry_session(factory, work_objs))

    def run_plain_objs(_: Any) -> None:
        kept = []
        for _ in range(units):
            with factory() as session:
                result = work_objs(session)
                session.commit()
            kept.append(result)

    def run_retry_no_expire(_: Any) -> None:
        for _ in range(units):
            retry_session(no_expire, work)

    def run_plain_no_expire(_: Any) -> None:
        for _ in range(units):
            with no_expire() as session:
                work(session)
                session.commit()

    return [
        Variant("retry", run_retry, setup, check("retry")),
        Variant("plain", run_plain, setup, check("plain")),
        Variant("plain A/A", run_plain, setup, check("plain A/A")),
        Variant("retry, objs", run_retry_objs, setup, check("retry, objs")),
        Variant("plain, objs", run_plain_objs, setup, check("plain, objs")),
        Variant("retry, no expire", run_retry_no_expire, setup, check("retry, no expire")),
        Variant("plain, no expire", run_plain_no_expire, setup, check("plain, no expire")),
    ]


def close_ticket_source(engine: sa.Engine) -> dict[str, Any]:
    source = embedded_source(engine)
    stats = source.stats()
    server = source.source
    source.close()
    if isinstance(server, TicketServer):
        server.dispose()
    return stats


def run_backend(backend: str, units: int, rounds: int) -> dict[str, Any]:
    with throwaway_database(backend) as url:
        log(f"[{backend}] {redact(url)}: {units} units of {ROWS:,} rows per run, {rounds} rounds")
        engine = sa.create_engine(url)
        warnings = WarningCounter()
        library_logger = logging.getLogger("sqlalchemy_tickets")
        library_logger.addHandler(warnings)
        try:
            Base.metadata.create_all(engine)
            timings: Timings = interleave(
                make_variants(engine, backend, units), rounds, warmup=1, label=f"{backend} "
            )
            info = server_info(backend, url)
        finally:
            library_logger.removeHandler(warnings)
            ticket_stats = close_ticket_source(engine)
            engine.dispose()
    ratios = {
        "retry/plain": ratio_summary(timings, "retry", "plain", TARGET),
        "plain A/A/plain": ratio_summary(timings, "plain A/A", "plain", None),
        "retry, objs/plain, objs": ratio_summary(timings, "retry, objs", "plain, objs", None),
        "plain, objs/plain": ratio_summary(timings, "plain, objs", "plain", None),
        "retry, no expire/plain, no expire": ratio_summary(
            timings, "retry, no expire", "plain, no expire", None
        ),
    }

    def cpu(a: str, b: str) -> dict[str, Any]:
        pairs = zip(timings.cpu_seconds[a], timings.cpu_seconds[b], strict=True)
        per_round = [x / y for x, y in pairs]
        return {"per_round": per_round, "median": statistics.median(per_round)}

    cpu_ratios = {
        "retry/plain": cpu("retry", "plain"),
        "plain A/A/plain": cpu("plain A/A", "plain"),
        "retry, objs/plain, objs": cpu("retry, objs", "plain, objs"),
        "plain, objs/plain": cpu("plain, objs", "plain"),
        "retry, no expire/plain, no expire": cpu("retry, no expire", "plain, no expire"),
    }
    per_unit = {name: timings.median(name) / units for name in timings.seconds}
    return {
        "url": redact(url),
        "server": info,
        "round_orders": timings.orders,
        "seconds_per_round": timings.seconds,
        "median_seconds": {name: timings.median(name) for name in timings.seconds},
        "median_ms_per_unit": {name: s * 1e3 for name, s in per_unit.items()},
        "overhead_us_per_unit": (per_unit["retry"] - per_unit["plain"]) * 1e6,
        "cpu_seconds_per_round": timings.cpu_seconds,
        "median_client_cpu_ms_per_unit": {
            name: timings.cpu_median(name) / units * 1e3 for name in timings.cpu_seconds
        },
        "client_cpu_ratios": cpu_ratios,
        "ratios": ratios,
        "library_warnings_during_run": warnings.records,
        "ticket_cache_stats_at_end": ticket_stats,
    }


LABELS = {
    "retry/plain": "retry_session / plain\n(the target)",
    "plain A/A/plain": "plain A/A / plain\n(noise floor)",
    "plain, objs/plain": "plain holding its\nobjects / plain",
    "retry, objs/plain, objs": "retry / plain,\nboth holding objects",
    "retry, no expire/plain, no expire": "retry / plain,\nexpire_on_commit=False",
}
BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}


def plot_results(results: dict[str, Any], rounds: int, units: int, env: dict[str, Any]) -> Any:
    """One panel per backend: horizontal bars of median wall ratios, each round as a dot (rounds
    outside the axis are drawn at its edge as triangles), the target as a red dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = 0.85, 1.2
    keys = list(LABELS)
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(
        1, len(results), figsize=(5.2 * len(results) + 1.6, 5.6), sharey=True, squeeze=False
    )
    for ax, (backend, r) in zip(axes[0], results.items(), strict=True):
        for i, key in enumerate(keys):
            y = len(keys) - 1 - i
            summary = r["ratios"][key]
            median = summary["median"]
            missed = key == "retry/plain" and median > TARGET
            ax.barh(
                y,
                median - low,
                left=low,
                height=0.6,
                color=colors[i],
                edgecolor="red" if missed else "black",
                linewidth=2.2 if missed else 0.6,
            )
            inside = [v for v in summary["per_round"] if low <= v <= high]
            ax.scatter(inside, [y] * len(inside), s=9, color="black", zorder=3)
            above = sum(v > high for v in summary["per_round"])
            below = sum(v < low for v in summary["per_round"])
            if above:
                ax.scatter(
                    [high - 0.004],
                    [y],
                    marker=">",
                    s=36,
                    color="black",
                    edgecolor="white",
                    zorder=4,
                )
                ax.annotate(f"{above}", (high - 0.012, y + 0.2), fontsize=7.5, ha="right")
            if below:
                ax.scatter(
                    [low + 0.004], [y], marker="<", s=36, color="black", edgecolor="white", zorder=4
                )
                ax.annotate(f"{below}", (low + 0.012, y + 0.2), fontsize=7.5, color="white")
            cpu = r["client_cpu_ratios"][key]["median"]
            ax.annotate(
                f"{median:.3f}  (CPU {cpu:.3f})",
                (high, y),
                xytext=(-4, -13),
                textcoords="offset points",
                ha="right",
                fontsize=8.5,
                fontweight="bold" if key == "retry/plain" else "normal",
            )
        ax.axvline(TARGET, color="red", linestyle="--", linewidth=1.2)
        ax.axvline(1.0, color="gray", linestyle=":", linewidth=1)
        ax.set_xlim(low, high)
        ax.set_yticks(range(len(keys)), [LABELS[k] for k in reversed(keys)], fontsize=8.5)
        ms = r["median_ms_per_unit"]
        verdict = "PASS" if r["ratios"]["retry/plain"]["passed"] else "FAIL"
        ax.set_title(
            f"{BACKEND_NAMES.get(backend, backend)}: "
            f"retry/plain {r['ratios']['retry/plain']['median']:.3f} "
            f"({verdict})\nplain {ms['plain']:.1f} ms, retry {ms['retry']:.1f} ms per unit",
            fontsize=10,
        )
        ax.set_xlabel("wall-time ratio (median of per-round ratios)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"retry_session around a {ROWS:,}-row insert unit, nothing failing: time relative to a "
        f"plain session (red dashed: target {TARGET})",
        fontsize=12,
    )
    fig.text(
        0.01,
        0.01,
        f"{rounds} interleaved rounds (order rotated) after 1 warm-up; {units} units per run; "
        "table "
        "emptied before each run (untimed). TicketId('bench'), embedded default. Dots: rounds; "
        f"triangles: rounds off the axis (count). {load_text(env)} at start",
        fontsize=7.5,
        color="dimgray",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.94))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=105)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    units = 2 if args.quick else 5
    rounds = args.rounds or (3 if args.quick else 21)
    env = environment()
    results = {backend: run_backend(backend, units, rounds) for backend in args.backends}
    checks = {f"{b} retry/plain": r["ratios"]["retry/plain"] for b, r in results.items()}
    passed = all(s["passed"] for s in checks.values()) and not any(
        r["library_warnings_during_run"] for r in results.values()
    )
    payload = {
        "benchmark": NAME,
        "description": __doc__,
        "environment": env,
        "parameters": {
            "rows_per_unit": ROWS,
            "units_per_run": units,
            "rounds": rounds,
            "warmup_rounds": 1,
            "quick": args.quick,
            "backends": args.backends,
            "retry_call": "retry_session(sessionmaker(engine), work) with its defaults",
            "work": "session.add_all([Row(...) for i in range(1000)]); return 1000 "
            "(', objs' variants: return the list, kept by the caller)",
            "plain_call": "with sessionmaker(engine)() as s: work(s); s.commit()",
            "reported_ratio": "median over rounds of (retry seconds / plain seconds), both "
            "timed in the same round",
        },
        "target": {"ratio": "retry/plain", "max": TARGET, "on": "every backend"},
        "backends": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)
    png_path = plot_results(results, rounds, units, env)
    log("")
    log(f"{NAME}: {units} units of {ROWS:,} rows per run, {rounds} rounds")
    for backend, r in results.items():
        ms = r["median_ms_per_unit"]
        log(
            f"  {backend}: per unit retry {ms['retry']:.2f} ms, plain {ms['plain']:.2f} ms "
            f"(overhead {r['overhead_us_per_unit']:.0f} us); library warnings "
            f"{len(r['library_warnings_during_run'])}"
        )
        for key in r["ratios"]:
            wall = r["ratios"][key]
            log(
                f"    {key:34s} wall {wall['median']:.3f} (rounds {wall['min']:.3f}-"
                f"{wall['max']:.3f}), client CPU {r['client_cpu_ratios'][key]['median']:.3f}"
            )
    for line in verdict_lines(checks):
        log(line)
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    return 1 if (args.strict and not passed) else 0


if __name__ == "__main__":
    sys.exit(main())
