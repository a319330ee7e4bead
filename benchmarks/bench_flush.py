"""ORM flush of 20,000 new rows: TicketId keys vs native auto-increment vs UUIDv4, per backend.

Three models that differ only in their primary key: ``ticket`` is
``mapped_column(TicketId("bench"), primary_key=True)`` with the embedded default (nothing
configured); ``autoinc`` a native auto-increment (BIGINT; SQLite: INTEGER, the rowid), which the
ORM must read back; ``uuid`` a ``sa.Uuid`` with ``default=uuid.uuid4``. Timed:
``session.add_all(objs); session.flush(); session.commit()`` on a fresh session, objects built
and the table emptied beforehand (untimed). One more untimed flush per model counts the INSERT
cursor calls and ticket round trips. Target: ticket / autoinc <= 0.9 on every backend.

    .venv/bin/python benchmarks/bench_flush.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from typing import Any

import _common as h
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId
from sqlalchemy_tickets.sources.default import embedded_source

NAME, TARGET = "bench_flush", 0.9  # ticket time / auto-increment time


class Base(DeclarativeBase):
    pass


class Columns:
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class TicketRow(Columns, Base):
    __tablename__ = "bench_ticket"
    id: Mapped[int] = mapped_column(TicketId("bench"), primary_key=True)


class AutoincRow(Columns, Base):
    __tablename__ = "bench_autoinc"
    id: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=True)


class UuidRow(Columns, Base):
    __tablename__ = "bench_uuid"
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid.uuid4)


MODELS: dict[str, Any] = {"ticket": TicketRow, "autoinc": AutoincRow, "uuid": UuidRow}


def flush(engine: sa.Engine, name: str, rows: int) -> h.Variant:
    """The timed unit as a variant: add, flush and commit ``rows`` new objects."""
    model = MODELS[name]

    def setup() -> tuple[Session, list[Any]]:
        h.empty_table(engine, model.__table__)
        return Session(engine), [model(title=f"title {i:08d}", n=i) for i in range(rows)]

    def run(state: tuple[Session, list[Any]]) -> None:
        state[0].add_all(state[1])
        state[0].flush()
        state[0].commit()

    def teardown(state: tuple[Session, list[Any]]) -> None:
        state[0].close()
        assert h.count_rows(engine, model.__table__) == rows, f"{model.__name__}: rows lost"

    return h.Variant(name, run, setup, teardown)


def statements(engine: sa.Engine, name: str, rows: int) -> dict[str, Any]:
    """One more flush, untimed: INSERT cursor calls and the ticket server's round trips."""
    calls: Counter[str] = Counter()

    def count(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        calls[("executemany" if many else "execute") + " " + sql.split()[0]] += 1

    server = embedded_source(engine).source
    before = server.stats()["round_trips"]  # type: ignore[attr-defined]
    variant = flush(engine, name, rows)
    event.listen(engine, "before_cursor_execute", count)
    try:
        state = variant.setup()
        variant.run(state)
        variant.teardown(state)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    embedded_source(engine).wait_idle(5.0)  # a refill the flush started counts too
    trips = server.stats()["round_trips"] - before  # type: ignore[attr-defined]
    return {"cursor_calls": dict(calls), "ticket_round_trips": trips}


def run_backend(args: Any, backend: str, rows: int) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        h.log(f"[{backend}] {h.redact(url)}: {rows:,} rows per flush")
        engine = sa.create_engine(url)
        try:
            Base.metadata.create_all(engine)
            variants = [flush(engine, name, rows) for name in MODELS]
            timings = h.interleave(variants, h.rounds(args, 9), label=f"{backend} ")
            probe = {name: statements(engine, name, rows) for name in MODELS}
            info = h.server_info(backend, url)
        finally:
            stats = h.close_embedded(engine)
            engine.dispose()
    return {
        "ratios": {
            "ticket/autoinc": h.ratio_summary(timings, "ticket", "autoinc", TARGET),
            "uuid/autoinc": h.ratio_summary(timings, "uuid", "autoinc"),
        },
        "statements_per_flush": probe,
        "ticket_cache_stats": stats,
        "server": info,
        **timings.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    rows = 200 if args.smoke else 20_000
    env = h.environment()
    results = {b: run_backend(args, b, rows) for b in args.backends}
    title = f"ORM flush + commit of {rows:,} rows, relative to auto-increment"
    fig, (ax,) = h.figure(1, title, env)
    h.ratio_panel(ax, h.flatten(results, "ratios"), f"target: ticket / autoinc <= {TARGET}")
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"rows_per_flush": rows, "target": TARGET},
        results=results,
        figure=fig,
        checks={f"{b} ticket/autoinc": r["ratios"]["ticket/autoinc"] for b, r in results.items()},
    )


if __name__ == "__main__":
    sys.exit(main())
