"""Ticket round trips: ``TicketServer.next_id`` / ``next_block(seq, 1000)`` vs the raw driver.

A :class:`TicketServer` on a throwaway database issues ids of sequence ``bench_ours``. The
baseline is the bare driver (sqlite3 / psycopg / PyMySQL) on one connection in autocommit,
opened with the connect arguments the library uses, running the library's own compiled
statement (read from its statement cache, so the SQL text and parameters are identical) on
sequence ``bench_raw``, whose table the server created. Overhead = our time per round trip /
raw time per round trip, median of per-round ratios. Target: <= 1.2 for both calls, every backend.

    .venv/bin/python benchmarks/bench_roundtrip.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _common as h

from sqlalchemy_tickets import TicketServer

NAME, TARGET, BLOCK = "bench_roundtrip", 1.2, 1000
CALLS = {"next_id": 1, "next_block": BLOCK}  # ids per round trip


def raw_driver(server: TicketServer, sequence: str, ids: int) -> tuple[Any, Any]:
    """``(connection, call)``: a bare DBAPI connection in autocommit, opened as the server opens
    its own, and ``call(cursor)``, making the library's round trip for ``ids`` ids on it."""
    from sqlalchemy_tickets._naming import ticket_table
    from sqlalchemy_tickets.dialects import backend_for

    server.next_block(sequence, ids)  # creates the table and fills the statement cache
    engine, dialect = server.engine, server.engine.dialect
    backend, table = backend_for(dialect.name), ticket_table(sequence)
    # The take the server runs: guarded by the table's identity where the backend checks it
    # in the statement (TicketBackend.take_block).
    identity = server._known[sequence, 64].identity
    guards = backend.identity_guards(identity) if identity is not None and identity.guard else {}
    key = backend.guarded_take(identity)[0] if guards and identity is not None else "take_block"
    stmt = backend.statement(dialect, table, key, lambda _: None)
    info = server.describe(sequence)
    assert stmt is not None and info is not None, "the library's statement was not cached"
    step = ids * info.increment  # the parameters TicketBackend.take_block passes
    sql, params = (
        stmt.sql,
        stmt.params(
            step=step, max=table.max_id - step, increment=info.increment, offset=info.offset,
            **guards,
        ),
    )
    pooled = engine.raw_connection()  # made exactly as the server makes its own, in autocommit
    pooled.detach()  # and no longer the pool's
    conn = pooled.dbapi_connection
    mysql = dialect.name == "mysql"  # LAST_INSERT_ID(id + step): the id is the lastrowid

    def call(cursor: Any) -> Any:
        cursor.execute(sql, params)
        return cursor.lastrowid if mysql else cursor.fetchone()

    return conn, call


def variants(server: TicketServer, conn: Any, call: Any, label: str, calls: int) -> list[Any]:
    """Ours and raw for one call; the raw cursor is closed after each run (on SQLite that
    resets the statement, so no write lock outlives the run)."""
    ids = CALLS[label]  # next_id: the public single-id call, as an application makes it
    ours = (
        h.loop(server.next_id, calls, "bench_ours")
        if ids == 1
        else (h.loop(server.next_block, calls, "bench_ours", ids))
    )
    raw = lambda cursor: h.loop(call, calls, cursor)()  # noqa: E731
    return [
        h.Variant(f"ours {label}", ours, per=calls),
        h.Variant(f"raw {label}", raw, conn.cursor, lambda cursor: cursor.close(), calls),
    ]


def run_backend(args: Any, backend: str) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        server, conns = TicketServer(url), {}
        try:
            server.next_id("bench_ours")  # first contact: creates the table
            raw = {label: raw_driver(server, "bench_raw", ids) for label, ids in CALLS.items()}
            conns = {label: conn for label, (conn, _) in raw.items()}
            cursor, start = conns["next_id"].cursor(), time.perf_counter()
            h.loop(raw["next_id"][1], 20, cursor)()
            per_call = (time.perf_counter() - start) / 20  # ~0.15 s of raw round trips a run
            cursor.close()
            calls = 20 if args.smoke else max(100, min(5000, int(0.15 / per_call)))
            h.log(f"[{backend}] {h.redact(url)}: {calls} round trips per run")
            chosen = [v for k, (c, r) in raw.items() for v in variants(server, c, r, k, calls)]
            before = server.next_id("bench_ours")
            timings = h.interleave(chosen, h.rounds(args, 21), label=f"{backend} ")
            issued = server.next_id("bench_ours") - before - 1
            expected = (len(timings.orders) + 1) * calls * sum(CALLS.values())
            assert issued == expected, f"ours issued {issued} ids, expected {expected}"
            info = h.server_info(backend, url)
        finally:
            for conn in conns.values():
                conn.close()
            server.close()
    ratios = {k: h.ratio_summary(timings, f"ours {k}", f"raw {k}", TARGET) for k in CALLS}
    us = {name: timings.median(name) * 1e6 for name in timings.seconds}
    return {"ratios": ratios, "median_us_per_round_trip": us, "server": info, **timings.to_json()}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    env = h.environment()
    results = {backend: run_backend(args, backend) for backend in args.backends}
    checks = {f"{b} {k}": r["ratios"][k] for b, r in results.items() for k in CALLS}
    title = "Ticket round trip: TicketServer vs the raw driver, same SQL"
    fig, (left, right) = h.figure(2, title, env)
    h.ratio_panel(left, h.flatten(results, "ratios"), f"ours / raw (target <= {TARGET})")
    us = h.flatten(results, "median_us_per_round_trip")
    h.value_panel(right, us, "median µs per round trip", "µs")
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"block": BLOCK, "target": TARGET},
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
