"""An application's test cycle on one database kept for the run (microblog-api, the FastAPI
template): a new engine, ``create_all``, 20 rows of two models, ``drop_all``,
``drop_ticket_tables``, ``dispose()``; ``TicketId`` keys on the embedded default vs
auto-increment keys. Target: tickets / auto-increment <= 1.5.

    .venv/bin/python benchmarks/bench_test_cycle.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

from typing import Any

import _harness as h
import sqlalchemy as sa

from sqlalchemy_tickets import TicketId, drop_ticket_tables

NAME, TARGET, ROWS = "bench_test_cycle", 1.5, 10  # rows of each model


def cycle(tickets: bool, url: sa.URL) -> Any:
    """The timed unit on ``url``'s database, for keys drawn from tickets or auto-incremented."""
    metadata = sa.MetaData()
    autoinc = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite's: INTEGER keys
    key = (lambda name: TicketId(name)) if tickets else (lambda name: autoinc)
    users = sa.Table("cycle_users", metadata, sa.Column("id", key("cycle_users"), primary_key=True),
                     sa.Column("name", sa.String(40)))
    posts = sa.Table("cycle_posts", metadata, sa.Column("id", key("cycle_posts"), primary_key=True),
                     sa.Column("user_id", sa.BigInteger, sa.ForeignKey(users.c.id)))

    def run(_: Any = None) -> None:
        engine = sa.create_engine(url)
        metadata.create_all(engine)
        with engine.begin() as conn:
            made = [conn.execute(users.insert().values(name=f"u{i}")) for i in range(ROWS)]
            conn.execute(posts.insert(), [{"user_id": r.inserted_primary_key_rows[0][0]}
                                          for r in made])
        metadata.drop_all(engine)
        if tickets:
            drop_ticket_tables(metadata, engine)
        engine.dispose()

    return run


def run_backend(args: Any, backend: str) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        variants = [h.Variant(n, cycle(n == "tickets", url)) for n in ("tickets", "autoinc")]
        timings = h.interleave(variants, h.rounds(args, 41), label=f"{backend} ")
    return {"ratios": {"tickets/autoinc": h.ratio_summary(timings, "tickets", "autoinc",
                                                          TARGET)}, **timings.to_json()}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    return h.report(args, NAME, {b: run_backend(args, b) for b in args.backends},
                    title=f"A test's cycle: create_all, {2 * ROWS} rows, drop_all, reset, dispose",
                    parameters={"rows": 2 * ROWS, "target": TARGET})


if __name__ == "__main__":
    raise SystemExit(main())
