"""Ids burned by short-lived processes: three cron-job-like processes in a row, each inserting
rows in bursts through ``configure(url)`` (= ``CachedSource(TicketServer(url))``) and exiting.

Each inserts 30,000 rows into an SQLite database with ids from a ticket server on the backend;
burned by a process: the next one's first id - its last id - 1. Target: burned / inserted <= 0.10.

    .venv/bin/python benchmarks/bench_shortlived.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketServer, configure
from sqlalchemy_tickets.sources.default import configured_source

NAME, PROCESSES, TARGET = "bench_shortlived", 3, 0.10
BURSTS = [50, 2_000, 10_000, 100, 7_849, 10_000]  # + 1 row first: 30,000 rows


class Job(h.Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(TicketId("jobs"), primary_key=True)


def short_lived(spec: tuple[str, str, list[int]], conn: Any) -> None:
    """One short-lived process: ``configure(url)``, rows in bursts, a normal exit."""
    app_url, ticket_url, bursts = spec
    configure(ticket_url)
    engine = sa.create_engine(app_url)
    h.Base.metadata.create_all(engine)
    first = last = 0
    for size in [1, *bursts]:
        with Session(engine) as session:
            rows = [Job() for _ in range(size)]
            session.add_all(rows)
            session.flush()
            first = first or min(r.id for r in rows)
            last = max(last, *(r.id for r in rows))
            session.commit()
    stats = configured_source().stats()  # type: ignore[union-attr]
    engine.dispose()
    conn.send({"first": first, "last": last, "inserted": 1 + sum(bursts),
               "round_trips": stats["round_trips"], "blocking_waits": stats["blocking_waits"],
               "held_at_exit": stats["in_hand"]})


def measure(backend: str, bursts: list[int], processes: int) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        app_url, tickets = h.databases(stack, "sqlite", backend)
        h.first_contact(tickets, ["jobs"])
        runs = []
        for _ in range(processes):  # one after the other, each exiting before the next starts
            with h.Fleet(short_lived, [(app_url, tickets, bursts)], grace=60) as process:
                runs += process.hear(timeout=600)
        with contextlib.closing(TicketServer(tickets, timeout=h.SETUP_TIMEOUT)) as server:
            after = server.next_id("jobs")
    for run, following in zip(runs, [r["first"] for r in runs[1:]] + [after], strict=True):
        run["burned"] = following - run["last"] - 1
        run["burned_share"] = run["burned"] / run["inserted"]
    h.log(f"{backend}: burned/inserted per process " + ", ".join(
        f"{r['burned']:,}/{r['inserted']:,} = {r['burned_share']:.3f}" for r in runs))
    return {"processes": runs, "worst_burned_share": max(r["burned_share"] for r in runs)}


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    bursts = [max(1, b // 10) for b in BURSTS] if args.smoke else BURSTS
    processes = 2 if args.smoke else PROCESSES
    results = {backend: measure(backend, bursts, processes) for backend in args.backends}
    fig, (ax,) = h.figure(1, "Ids burned per short-lived process (share of rows inserted)",
                          args.env, f"{processes} processes in a row, {1 + sum(bursts):,} rows")
    h.value_panel(ax, {f"{b} #{k + 1}": run["burned_share"] * 100 for b, r in results.items()
                       for k, run in enumerate(r["processes"])}, "burned / inserted", "%")
    return h.report(args, NAME, results, figure=fig, checks={
        f"{b}: worst burned/inserted": h.check(r["worst_burned_share"], TARGET)
        for b, r in results.items()}, parameters={"processes": processes, "bursts": bursts})


if __name__ == "__main__":
    raise SystemExit(main())
