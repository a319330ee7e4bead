"""ORM flush of 20,000 new rows by primary key: TicketId vs keys set by hand vs native
auto-increment vs UUIDv4, per backend.

``add_all``, ``flush()``, ``commit()`` of four models differing only in their key: ``ticket``
(``TicketId``, embedded default), ``preset`` (keys set beforehand: the floor), ``autoinc``,
``uuid``; 9 rounds; cursor calls and ticket round trips counted. Target: ticket / autoinc <= 0.9
on every backend; also ticket / preset, preset / autoinc, uuid / autoinc.

    .venv/bin/python benchmarks/bench_flush.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import uuid
from collections import Counter
from itertools import count
from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId
from sqlalchemy_tickets.sources.default import embedded_source

NAME, TARGET = "bench_flush", 0.9  # ticket time / auto-increment time
PAIRS = (("ticket", "autoinc"), ("ticket", "preset"), ("preset", "autoinc"), ("uuid", "autoinc"))


class Columns:
    title: Mapped[str] = mapped_column(sa.String(50))
    n: Mapped[int] = mapped_column(sa.Integer)


class TicketRow(Columns, h.Base):
    __tablename__ = "bench_ticket"
    id: Mapped[int] = mapped_column(TicketId("bench"), primary_key=True)


class AutoincRow(Columns, h.Base):
    __tablename__ = "bench_autoinc"  # SQLite auto-increments only an INTEGER PRIMARY KEY
    id: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                                    primary_key=True, autoincrement=True)


class PresetRow(Columns, h.Base):
    __tablename__ = "bench_preset"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)


class UuidRow(Columns, h.Base):
    __tablename__ = "bench_uuid"
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid.uuid4)


MODELS: dict[str, Any] = {"ticket": TicketRow, "preset": PresetRow, "autoinc": AutoincRow,
                          "uuid": UuidRow}


def flush(engine: sa.Engine, name: str, rows: int) -> h.Variant:
    """The timed unit: add, flush and commit ``rows`` new objects."""
    model, start = MODELS[name], count(1)

    def setup() -> tuple[Session, list[Any]]:
        h.empty_table(engine, model.__table__)  # preset: the keys set here, before the clock
        return Session(engine), [model(title=f"title {i:08d}", n=i, **(
            {"id": next(start)} if name == "preset" else {})) for i in range(rows)]

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
        calls[("executemany " if many else "execute ") + sql.split()[0]] += 1

    cache = embedded_source(engine)
    before = cache.source.stats()["round_trips"]  # type: ignore[attr-defined]
    variant = flush(engine, name, rows)
    event.listen(engine, "before_cursor_execute", count)  # a failure ends the script anyway
    state = variant.setup()
    variant.run(state)
    variant.teardown(state)
    event.remove(engine, "before_cursor_execute", count)
    cache.wait_idle(5.0)  # a refill the flush started counts too
    trips = cache.source.stats()["round_trips"] - before  # type: ignore[attr-defined]
    return {"cursor_calls": dict(calls), "ticket_round_trips": trips}


def run_backend(args: Any, backend: str, rows: int) -> dict[str, Any]:
    with h.throwaway_engine(backend, h.Base.metadata) as engine:
        h.first_contact(engine, ["bench"], embedded=True)
        variants = [flush(engine, name, rows) for name in MODELS]
        timings = h.interleave(variants, h.rounds(args, 9), label=f"{backend} ")
        probe = {name: statements(engine, name, rows) for name in MODELS}
        stats = embedded_source(engine).stats()
    ratios = {f"{a}/{b}": h.ratio_summary(timings, a, b, TARGET if (a, b) == PAIRS[0] else None)
              for a, b in PAIRS}  # the first with its target
    return {"ratios": ratios, "statements_per_flush": probe,
            "ticket_cache_stats": {k: v for k, v in stats.items() if k != "sequences"},
            **timings.to_json()}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    rows = 200 if args.smoke else 20_000
    return h.report(args, NAME, {b: run_backend(args, b, rows) for b in args.backends},
                    title=f"ORM flush + commit of {rows:,} rows, by primary key",
                    parameters={"rows_per_flush": rows, "target": TARGET})


if __name__ == "__main__":
    raise SystemExit(main())
