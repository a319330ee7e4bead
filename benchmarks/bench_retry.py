"""What ``retry_session`` costs when nothing fails: a 1,000-row insert unit with and without it.

``retry_session(sessionmaker(engine), work)`` vs ``work(s); s.commit()`` (and A/A), with the
objects kept by the caller or not, with ``expire_on_commit`` or not; 5 units a run, 21 rounds,
the library's warnings recorded. Target: retry / plain <= 1.05 on every backend.

    .venv/bin/python benchmarks/bench_retry.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import logging
from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, sessionmaker

from sqlalchemy_tickets import TicketId, retry_session

NAME, TARGET, ROWS = "bench_retry", 1.05, 1_000
PAIRS = {  # ratio -> (numerator, denominator, target)
    "retry/plain": ("retry", "plain", TARGET),
    "plain A/A / plain": ("plain A/A", "plain", None),
    "plain, objs / plain": ("plain, objs", "plain", None),
    "retry, objs / plain, objs": ("retry, objs", "plain, objs", None),
    "retry / plain, no expire": ("retry, no expire", "plain, no expire", None),
}


class Row(h.Base):
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
    return [checked(name, run) for name, run in {
        "retry": retry(expiring, work_dropping),
        "plain": plain(expiring, work_dropping),
        "plain A/A": plain(expiring, work_dropping),
        "retry, objs": retry(expiring, work),
        "plain, objs": plain(expiring, work),
        "retry, no expire": retry(keeping, work_dropping),
        "plain, no expire": plain(keeping, work_dropping),
    }.items()]


def run_backend(args: Any, backend: str, units: int, rows: int) -> dict[str, Any]:
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    with h.throwaway_engine(backend, h.Base.metadata) as engine:
        logging.getLogger("sqlalchemy_tickets").addHandler(handler)
        try:
            h.first_contact(engine, ["bench"], embedded=True)
            timings = h.interleave(variants(engine, units, rows), h.rounds(args, 21),
                                   label=f"{backend} ")
        finally:
            logging.getLogger("sqlalchemy_tickets").removeHandler(handler)
    ratios = {key: h.ratio_summary(timings, a, b, t) for key, (a, b, t) in PAIRS.items()}
    return {"ratios": ratios, "library_warnings": warnings,
            **timings.to_json("median_ms_per_unit", 1e3)}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, peers=("tenacity",))
    units, rows = (1, 20) if args.smoke else (5, ROWS)
    results = {backend: run_backend(args, backend, units, rows) for backend in args.backends}
    for r in results.values():  # a warning (a retry logged) fails the check too
        r["ratios"]["retry/plain"]["passed"] &= not r["library_warnings"]
    return h.report(args, NAME, results, height=7,
                    title=f"retry_session around a {rows:,}-row insert unit, nothing failing",
                    parameters={"rows_per_unit": rows, "units_per_run": units})


if __name__ == "__main__":
    raise SystemExit(main())
