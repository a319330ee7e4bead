"""What ``retry_session`` costs when nothing fails: a 1,000-row insert unit with and without it.

The model is keyed by ``mapped_column(TicketId("bench"), primary_key=True)`` with the embedded
default (nothing configured), plus a ``String(50)`` and an ``Integer``. The unit of work is

    def work(session):
        session.add_all([Row(title=..., n=i) for i in range(1000)])

timed as

* ``retry``: ``retry_session(sessionmaker(engine), work)`` (defaults: 5 attempts, back-off 0.1 s);
* ``plain``: ``with Session() as s: work(s); s.commit()``;
* ``plain A/A``: the same plain code again, under another name: the ratio plain A/A / plain shows
  how far two identical variants drift apart on this machine (the noise floor).

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
    RatioBar,
    Timings,
    Variant,
    environment,
    interleave,
    load_text,
    log,
    parse_args,
    plot,
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

    return [
        Variant("retry", run_retry, setup, check("retry")),
        Variant("plain", run_plain, setup, check("plain")),
        Variant("plain A/A", run_plain, setup, check("plain A/A")),
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
    }
    cpu_ratios = [
        r / p for r, p in zip(timings.cpu_seconds["retry"], timings.cpu_seconds["plain"], strict=True)
    ]
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
        "client_cpu_ratio_retry/plain": {
            "per_round": cpu_ratios,
            "median": statistics.median(cpu_ratios),
        },
        "ratios": ratios,
        "library_warnings_during_run": warnings.records,
        "ticket_cache_stats_at_end": ticket_stats,
    }


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
            "plain_call": "with sessionmaker(engine)() as s: work(s); s.commit()",
            "reported_ratio": "median over rounds of (retry seconds / plain seconds), both "
            "timed in the same round",
        },
        "target": {"ratio": "retry/plain", "max": TARGET, "on": "every backend"},
        "backends": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)
    bars = []
    for backend, r in results.items():
        bars.append(RatioBar(backend, "retry_session / plain", r["ratios"]["retry/plain"]["per_round"], TARGET))
        bars.append(RatioBar(backend, "plain A/A / plain (noise floor)", r["ratios"]["plain A/A/plain"]["per_round"]))
        bars.append(RatioBar(backend, "retry / plain, client CPU", r["client_cpu_ratio_retry/plain"]["per_round"]))
    png_path = plot(
        NAME,
        title=f"retry_session around a {ROWS:,}-row insert unit (nothing fails): time relative to "
        "a plain session",
        bars=bars,
        ratio_ylabel="time ratio (1.0 = plain Session + commit)",
        target=TARGET,
        target_label=f"target: retry_session <= {TARGET} x plain",
        side_title="median wall ms per unit (1,000 rows)",
        side_ylabel="ms per unit",
        side_values={b: r["median_ms_per_unit"] for b, r in results.items()},
        footnote=(
            f"{rounds} interleaved rounds (order rotated) after 1 warm-up; {units} units per run; "
            "table emptied before each run (untimed). TicketId('bench'), embedded default. "
            f"{load_text(env)} at start"
        ),
    )
    log("")
    log(f"{NAME}: {units} units of {ROWS:,} rows per run, {rounds} rounds")
    for backend, r in results.items():
        ms = r["median_ms_per_unit"]
        log(
            f"  {backend}: per unit retry {ms['retry']:.2f} ms, plain {ms['plain']:.2f} ms "
            f"(overhead {r['overhead_us_per_unit']:.0f} us); plain A/A/plain "
            f"{r['ratios']['plain A/A/plain']['median']:.3f}; client CPU retry/plain "
            f"{r['client_cpu_ratio_retry/plain']['median']:.3f}; library warnings "
            f"{len(r['library_warnings_during_run'])}"
        )
    for line in verdict_lines(checks):
        log(line)
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    return 1 if (args.strict and not passed) else 0


if __name__ == "__main__":
    sys.exit(main())
