"""What ``retry_session`` costs when nothing fails: a 1,000-row insert unit with and without it.

The model is keyed by ``mapped_column(TicketId("bench"), primary_key=True)`` (embedded default)
plus a ``String(50)`` and an ``Integer``; ``work(session)`` adds 1,000 new objects. Variants:

* ``retry``: ``retry_session(sessionmaker(engine), work)`` with its defaults;
* ``plain``: ``with Session() as s: work(s); s.commit()``; ``plain A/A``: the same again under
  another name, the noise floor;
* ``retry, objs`` / ``plain, objs``: ``work`` returns its objects and the caller keeps them.
  ``retry_session`` must keep the unit's objects until COMMIT has answered (to replay them), so
  where a plain session lets them go at the flush, it keeps 1,000 live objects through COMMIT;
  it commits them without expiring them (the session closes right after, and what ``work``
  returns must stay readable), where a plain ``expire_on_commit`` session expires them all:
  ``plain, objs / plain`` is that expiry alone;
* ``retry, no expire`` / ``plain, no expire``: the same with
  ``sessionmaker(engine, expire_on_commit=False)``.

Each run performs 5 units (``--smoke``: 1) on a table emptied beforehand (untimed); rows are
counted after every run and the library's warnings (a retry logs one) are recorded: none
expected. Target: retry / plain <= 1.05 on every backend.

    .venv/bin/python benchmarks/bench_retry.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import _common as h
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from sqlalchemy_tickets import TicketId, retry_session

NAME, TARGET, ROWS = "bench_retry", 1.05, 1_000
PAIRS = {  # ratio -> (numerator, denominator, target)
    "retry/plain": ("retry", "plain", TARGET),
    "plain A/A / plain": ("plain A/A", "plain", None),
    "plain, objs / plain": ("plain, objs", "plain", None),
    "retry, objs / plain, objs": ("retry, objs", "plain, objs", None),
    "retry / plain, no expire": ("retry, no expire", "plain, no expire", None),
}


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "bench_retry"
    id: Mapped[int] = mapped_column(TicketId("bench"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


def variants(engine: sa.Engine, units: int, rows: int) -> list[h.Variant]:
    def work(session: Any) -> list[Row]:
        objs = [Row(title=f"title {i:08d}", n=i) for i in range(rows)]
        session.add_all(objs)
        return objs

    def work_dropping(session: Any) -> int:
        work(session)  # the objects go when the flush is done with them
        return rows

    def plain(factory: Any, unit: Any) -> Any:
        def run(_: Any) -> None:
            kept = []
            for _ in range(units):
                with factory() as session:
                    kept.append(unit(session))
                    session.commit()

        return run

    def retry(factory: Any, unit: Any) -> Any:
        return lambda _: [retry_session(factory, unit) for _ in range(units)]

    def checked(name: str, run: Any) -> h.Variant:
        def teardown(_: Any) -> None:
            assert h.count_rows(engine, Row.__table__) == units * rows, f"{name}: rows lost"

        return h.Variant(name, run, lambda: h.empty_table(engine, Row.__table__), teardown, units)

    expiring, keeping = sessionmaker(engine), sessionmaker(engine, expire_on_commit=False)
    runs = {
        "retry": retry(expiring, work_dropping),
        "plain": plain(expiring, work_dropping),
        "plain A/A": plain(expiring, work_dropping),
        "retry, objs": retry(expiring, work),
        "plain, objs": plain(expiring, work),
        "retry, no expire": retry(keeping, work_dropping),
        "plain, no expire": plain(keeping, work_dropping),
    }
    return [checked(name, run) for name, run in runs.items()]


def run_backend(args: Any, backend: str, units: int, rows: int) -> dict[str, Any]:
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    with h.throwaway_database(backend) as url:
        h.log(f"[{backend}] {h.redact(url)}: {units} units of {rows:,} rows per run")
        engine = sa.create_engine(url)
        logging.getLogger("sqlalchemy_tickets").addHandler(handler)
        try:
            Base.metadata.create_all(engine)
            timings = h.interleave(
                variants(engine, units, rows), h.rounds(args, 21), label=f"{backend} "
            )
            info = h.server_info(backend, url)
        finally:
            logging.getLogger("sqlalchemy_tickets").removeHandler(handler)
            stats = h.close_embedded(engine)
            engine.dispose()
    ratios = {key: h.ratio_summary(timings, a, b, t) for key, (a, b, t) in PAIRS.items()}
    ms = {name: timings.median(name) * 1e3 for name in timings.seconds}
    return {
        "ratios": ratios,
        "median_ms_per_unit": ms,
        "library_warnings": warnings,
        "ticket_cache_stats": stats,
        "server": info,
        **timings.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    units, rows = (1, 20) if args.smoke else (5, ROWS)
    env = h.environment("tenacity")
    results = {backend: run_backend(args, backend, units, rows) for backend in args.backends}
    checks = {f"{b} retry/plain": r["ratios"]["retry/plain"] for b, r in results.items()}
    for b, r in results.items():
        checks[f"{b} retry/plain"]["passed"] &= not r["library_warnings"]
    title = f"retry_session around a {rows:,}-row insert unit, nothing failing"
    fig, (ax,) = h.figure(1, title, env, width=8, height=7)
    h.ratio_panel(ax, h.flatten(results, "ratios"), f"target: retry / plain <= {TARGET}")
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"rows_per_unit": rows, "units_per_run": units},
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
