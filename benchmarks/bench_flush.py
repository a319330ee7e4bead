"""ORM flush of many new rows: TicketId keys vs native auto-increment vs UUIDv4, per backend.

Three models that differ only in their primary key:

* ``ticket``  - ``mapped_column(TicketId("bench"), primary_key=True)`` with the embedded default
  (whatever ``embedded_source()`` gives the engine: ticket tables beside the data, SQLite: the
  sibling ``<db>-tickets`` file, possibly behind a cache). ``before_flush`` gives every pending
  object its id from one block, then the ORM sends one plain executemany.
* ``autoinc`` - native auto-increment (BIGINT on PostgreSQL/MySQL, INTEGER - the rowid - on
  SQLite), ``autoincrement=True``: the ORM must read every generated key back.
* ``uuid``    - ``sa.Uuid`` with ``default=uuid.uuid4``.

Timed: ``session.add_all(objs); session.flush(); session.commit()`` on a fresh session; the
objects are built before the clock starts and the table is emptied between rounds (untimed).
Target: ticket time <= 0.9 x auto-increment time (median of per-round ratios) on every backend.

    .venv/bin/python benchmarks/bench_flush.py [--quick] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import statistics
import sys
import uuid
from collections import Counter
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
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketServer
from sqlalchemy_tickets.sources.default import embedded_source

NAME = "bench_flush"
TARGET = 0.9  # ticket time / auto-increment time


class Base(DeclarativeBase):
    pass


class TicketRow(Base):
    __tablename__ = "bench_ticket"
    id: Mapped[int] = mapped_column(TicketId("bench"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


class AutoincRow(Base):
    __tablename__ = "bench_autoinc"
    # SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


class UuidRow(Base):
    __tablename__ = "bench_uuid"
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid.uuid4)
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


MODELS: dict[str, type[Base]] = {"ticket": TicketRow, "autoinc": AutoincRow, "uuid": UuidRow}
RATIOS = {
    "ticket/autoinc": ("ticket", "autoinc", TARGET),
    "uuid/autoinc": ("uuid", "autoinc", None),
}


def ticket_source(engine: sa.Engine) -> tuple[Any, TicketServer]:
    """The embedded default of ``engine`` and the :class:`TicketServer` behind it (the default
    may be the server itself or a cache in front of it, whose ``.source`` is the server)."""
    source = embedded_source(engine)
    server = source
    while not isinstance(server, TicketServer):
        server = server.source
    return source, server


def close_ticket_source(engine: sa.Engine) -> None:
    source, server = ticket_source(engine)
    close = getattr(source, "close", None)
    if close is not None and source is not server:
        close()
    server.dispose()


def empty_table(engine: sa.Engine, backend: str, model: type[Base]) -> None:
    table = model.__table__.name  # type: ignore[attr-defined]
    with engine.begin() as conn:
        if backend == "sqlite":
            conn.exec_driver_sql(f"DELETE FROM {table}")
        else:
            conn.exec_driver_sql(f"TRUNCATE TABLE {table}")


def build_objects(model: type[Base], rows: int) -> list[Any]:
    return [model(title=f"title {i:08d}", n=i) for i in range(rows)]


def flush_variant(name: str, engine: sa.Engine, backend: str, rows: int) -> Variant:
    model = MODELS[name]

    def setup() -> tuple[Session, list[Any]]:
        empty_table(engine, backend, model)
        return Session(engine), build_objects(model, rows)

    def run(state: tuple[Session, list[Any]]) -> None:
        session, objs = state
        session.add_all(objs)
        session.flush()
        session.commit()

    def teardown(state: tuple[Session, list[Any]]) -> None:
        session, _ = state
        session.close()
        with engine.connect() as conn:
            written = conn.scalar(sa.select(sa.func.count()).select_from(model.__table__))  # type: ignore[attr-defined]
        assert written == rows, f"{name}: {written} rows written, expected {rows}"

    return Variant(name, run, setup, teardown)


def probe_statements(engine: sa.Engine, backend: str, rows: int) -> dict[str, Any]:
    """One untimed flush per model, counting what reaches the drivers (and the ticket engine)."""
    return {name: probe_one(engine, backend, name, rows) for name in MODELS}


def probe_one(engine: sa.Engine, backend: str, name: str, rows: int) -> dict[str, Any]:
    model = MODELS[name]
    empty_table(engine, backend, model)
    calls: Counter[str] = Counter()
    params: Counter[str] = Counter()
    samples: list[str] = []
    checkouts: list[int] = []

    def on_execute(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("INSERT"):
            kind = "executemany" if executemany else "execute"
            calls[kind] += 1
            params[kind] += len(parameters) if executemany else 1
            if not samples:
                samples.append(statement[:160])

    def on_checkout(*_: Any) -> None:
        checkouts.append(1)

    source, server = ticket_source(engine)
    ticket_engine = server.engine if name == "ticket" else None
    event.listen(engine, "before_cursor_execute", on_execute)
    if ticket_engine is not None:
        event.listen(ticket_engine, "checkout", on_checkout)
    try:
        with Session(engine) as session:
            session.add_all(build_objects(model, rows))
            session.flush()
            session.commit()
        wait_idle = getattr(source, "wait_idle", None)
        if wait_idle is not None:  # a cache may refill in the background after the flush
            wait_idle(5.0)
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        if ticket_engine is not None:
            event.remove(ticket_engine, "checkout", on_checkout)
    return {
        "insert_cursor_calls": dict(calls),
        "insert_parameter_sets": dict(params),
        "first_insert_sql": samples[0] if samples else None,
        # Pool checkouts on the ticket server's engine = round trips (with a cache in front,
        # they may be background refills, and a flush may need none).
        "ticket_round_trips": len(checkouts) if ticket_engine is not None else None,
    }


def run_backend(backend: str, rows: int, rounds: int) -> dict[str, Any]:
    with throwaway_database(backend) as url:
        log(f"[{backend}] {redact(url)}: {rows} rows per flush, {rounds} rounds")
        engine = sa.create_engine(url)
        try:
            Base.metadata.create_all(engine)
            ddl = {
                name: str(sa.schema.CreateTable(model.__table__).compile(engine)).strip()  # type: ignore[attr-defined]
                for name, model in MODELS.items()
            }
            variants = [flush_variant(name, engine, backend, rows) for name in MODELS]
            timings: Timings = interleave(variants, rounds, warmup=1, label=f"{backend} ")
            # After the timed rounds, so first-contact work (creating the ticket table) is done.
            probe = probe_statements(engine, backend, rows)
            for name, seen in probe.items():
                log(
                    f"  {name}: {seen['insert_cursor_calls']} INSERT cursor calls; "
                    f"ticket round trips: {seen['ticket_round_trips']}"
                )
            info = server_info(backend, url)
            source, server = ticket_source(engine)
            ticket = {"source": repr(source), "server_url": redact(server.url)}
            stats = getattr(source, "stats", None)
            if stats is not None:
                ticket["stats_after_run"] = stats()
        finally:
            close_ticket_source(engine)
            engine.dispose()
    ratios = {key: ratio_summary(timings, a, b, t) for key, (a, b, t) in RATIOS.items()}
    return {
        "url": redact(url),
        "ticket_source": ticket,
        "server": info,
        "ddl": ddl,
        "statements_per_flush": probe,
        "round_orders": timings.orders,
        "seconds_per_round": timings.seconds,
        "median_seconds": {name: timings.median(name) for name in MODELS},
        "cpu_seconds_per_round": timings.cpu_seconds,
        "median_client_cpu_seconds": {name: timings.cpu_median(name) for name in MODELS},
        "median_rows_per_second": {name: rows / timings.median(name) for name in MODELS},
        "ratios": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    rows = 2_000 if args.quick else 20_000
    rounds = args.rounds or (3 if args.quick else 9)
    env = environment()
    results: dict[str, Any] = {}
    for backend in args.backends:
        results[backend] = run_backend(backend, rows, rounds)

    checks = {
        f"{backend} ticket/autoinc": result["ratios"]["ticket/autoinc"]
        for backend, result in results.items()
    }
    passed = all(summary["passed"] for summary in checks.values())
    payload = {
        "benchmark": NAME,
        "description": __doc__,
        "environment": env,
        "parameters": {
            "rows_per_flush": rows,
            "rounds": rounds,
            "warmup_rounds": 1,
            "quick": args.quick,
            "backends": args.backends,
            "timed": "session.add_all(objs); session.flush(); session.commit()",
            "reported_ratio": "median over rounds of (variant seconds / autoinc seconds), "
            "both timed in the same round",
        },
        "target": {"ratio": "ticket/autoinc", "max": TARGET, "on": "every backend"},
        "backends": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)

    bars = [
        RatioBar(backend, label, result["ratios"][label]["per_round"], target)
        for label, (_, _, target) in RATIOS.items()
        for backend, result in results.items()
    ]
    png_path = plot(
        NAME,
        title=f"ORM flush + commit of {rows:,} new rows: time relative to native auto-increment",
        bars=[
            RatioBar(
                b.group,
                "TicketId / auto-increment"
                if b.label == "ticket/autoinc"
                else "UUIDv4 / auto-increment",
                b.per_round,
                b.target,
            )
            for b in bars
        ],
        ratio_ylabel="time ratio (lower is faster; 1.0 = auto-increment)",
        target=TARGET,
        target_label=f"target: TicketId <= {TARGET} x auto-increment",
        side_title="median time per flush + commit",
        side_ylabel="seconds",
        side_values={
            backend: {name: result["median_seconds"][name] for name in MODELS}
            for backend, result in results.items()
        },
        footnote=(
            f"{rounds} interleaved rounds (order rotated) after 1 warm-up; objects built outside "
            "the timing; tables emptied between rounds. TicketId uses the embedded default. "
            f"{load_text(env)} at start"
        ),
    )

    log("")
    log(f"{NAME}: {rows} rows per flush, {rounds} rounds")
    for backend, result in results.items():
        medians = ", ".join(
            f"{name} {seconds * 1e3:.0f} ms" for name, seconds in result["median_seconds"].items()
        )
        uuid_ratio = result["ratios"]["uuid/autoinc"]["median"]
        log(f"  {backend}: {medians}; uuid/autoinc {uuid_ratio:.3f}")
    for line in verdict_lines(checks):
        log(line)
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    spread = [s["max"] - s["min"] for s in checks.values()]
    if spread and statistics.median(spread) > 0.3:
        log("note: the per-round ratios spread widely; the machine was busy - rerun")
    return 1 if (args.strict and not passed) else 0


if __name__ == "__main__":
    sys.exit(main())
