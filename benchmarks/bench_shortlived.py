"""Ids burned by short-lived processes: three cron-job-like processes in a row, each inserting
rows in bursts through ``configure(url)`` (= ``CachedSource(TicketServer(url))``) and exiting.

Each process is a fresh interpreter (``multiprocessing`` spawn). It inserts ``1 + sum(BURSTS)``
rows (30,000; ``--smoke``: 3,000) into an SQLite application database, one ORM flush per burst,
with ids from a ticket server on the backend measured, then exits normally: its cache gives the
ids it still holds back to the server (the process is the server's only client, so its last
block is the server's), and what the server could not take back is burned. Burned by process
*k* = first id of process *k+1* - last id of process *k* - 1 (the third is followed by one more
id taken straight from the server). Reported per backend: burned / inserted per process (target:
at most 0.10), round trips and blocking waits.

    .venv/bin/python benchmarks/bench_shortlived.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from _common import environment, figure, log, parse_args, report, throwaway_database, value_panel
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, TicketServer, configure
from sqlalchemy_tickets.sources.default import configured_source

NAME = "bench_shortlived"
PROCESSES = 3
BURSTS = [50, 2_000, 10_000, 100, 7_849, 10_000]  # + 1 row first: 30,000 rows
TARGET = 0.10


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(TicketId("jobs"), primary_key=True)


def _process(app_url: str, ticket_url: str, bursts: list[int], queue: Any) -> None:
    """One short-lived process: ``configure(url)``, rows in bursts, a normal exit."""
    configure(ticket_url)
    engine = sa.create_engine(app_url)
    Base.metadata.create_all(engine)
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
    queue.put(
        {
            "first": first,
            "last": last,
            "inserted": 1 + sum(bursts),
            "round_trips": stats["round_trips"],
            "blocking_waits": stats["blocking_waits"],
            "held_at_exit": stats["in_hand"],
        }
    )
    engine.dispose()


def measure(backend: str, bursts: list[int]) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with throwaway_database("sqlite") as app_url, throwaway_database(backend) as ticket_url:
        app, tickets = (u.render_as_string(hide_password=False) for u in (app_url, ticket_url))
        runs = []
        for _ in range(PROCESSES):
            queue = ctx.Queue()
            child = ctx.Process(target=_process, args=(app, tickets, bursts, queue))
            child.start()
            runs.append(queue.get(timeout=600))
            child.join(60)
        server = TicketServer(tickets)
        try:
            after = server.next_id("jobs")
        finally:
            server.close()
    nexts = [r["first"] for r in runs[1:]] + [after]
    for run, following in zip(runs, nexts, strict=True):
        run["burned"] = following - run["last"] - 1
        run["burned_share"] = run["burned"] / run["inserted"]
    worst = max(r["burned_share"] for r in runs)
    log(
        f"{backend}: burned/inserted per process "
        + ", ".join(f"{r['burned']:,}/{r['inserted']:,} = {r['burned_share']:.3f}" for r in runs)
    )
    return {"processes": runs, "worst_burned_share": worst}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    bursts = [max(1, b // 10) for b in BURSTS] if args.smoke else BURSTS
    env = environment()
    results = {backend: measure(backend, bursts) for backend in args.backends}
    checks = {
        f"{backend}: worst burned/inserted": {
            "median": result["worst_burned_share"],
            "target": TARGET,
            "passed": result["worst_burned_share"] <= TARGET,
        }
        for backend, result in results.items()
    }
    fig, (ax,) = figure(
        1,
        "Ids burned per short-lived process (share of rows inserted)",
        env,
        note=f"{PROCESSES} processes in a row, {1 + sum(bursts):,} rows each",
    )
    value_panel(
        ax,
        {
            f"{backend} #{k + 1}": run["burned_share"] * 100
            for backend, result in results.items()
            for k, run in enumerate(result["processes"])
        },
        "burned / inserted",
        "%",
    )
    return report(
        args,
        NAME,
        env=env,
        parameters={"processes": PROCESSES, "bursts": bursts, "target": TARGET},
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
