"""Ticket round trips: ``TicketServer.next_id`` / ``next_block(seq, 1000)`` against the bare
driver running the same take, and what the rewind guard costs in the database.

The bare driver runs the take ``docs/rewinds.md`` describes on a table of its own, without
(``raw``) and with (``raw guarded``) the rewind guard's conditions; 21 rounds, ids issued
checked. **Target: next_id and next_block(1000) / raw guarded <= 1.2**; ``raw guarded / raw``:
the guard's cost per take.

    .venv/bin/python benchmarks/bench_roundtrip.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

from typing import Any

import _harness as h
import sqlalchemy as sa

from sqlalchemy_tickets import TicketServer

NAME, TARGET, BLOCK, SEQ = "bench_roundtrip", 1.2, 1000, "bench"
MAX = 2**63 - 1 - BLOCK
RETURNING = "UPDATE bench_raw SET id = id + {n} WHERE {where} RETURNING id"
TAKE = {"postgresql": RETURNING, "sqlite": RETURNING,  # backend -> the take, {x}: parameter x
        "mysql": "UPDATE bench_raw SET id = LAST_INSERT_ID(id + {n}) WHERE {where}"}
WHERE = "stub = 'a' AND id <= {max} AND step = 1 AND lane = 1"
TIMELINE = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"
INNODB_ID = ("(SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
             "WHERE NAME = CONCAT(DATABASE(), '/bench_raw'))")
GUARD = {  # backend -> (the guard's conditions, the query reading their parameters)
    "postgresql": (f" AND tableoid::bigint = {{oid}} AND {TIMELINE} = {{timeline}}",
                   f"SELECT 'bench_raw'::regclass::oid::bigint AS oid, {TIMELINE} AS timeline"),
    "mysql": (f" AND @@server_id = {{server}} AND {INNODB_ID} = {{table}}",
              f"SELECT @@server_id AS server, {INNODB_ID} AS `table`")}


def raw_takes(url: Any, backend: str) -> tuple[Any, Any, dict[str, Any]]:
    """``(engine, connection, {"raw": call, "raw guarded": call})``: a bare DBAPI connection in
    autocommit on the script's own ticket table, and ``call(cursor)`` making one take on it."""
    args = {"prepare_threshold": None} if backend == "postgresql" else {}
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool,
                              connect_args=args)
    guard, read_guards = GUARD.get(backend, ("", None))
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE bench_raw (stub CHAR(1) NOT NULL PRIMARY KEY, "
                             "id BIGINT NOT NULL, step INTEGER NOT NULL, lane INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO bench_raw VALUES ('a', 0, 1, 1)")
        guards = dict(conn.exec_driver_sql(read_guards).mappings().one()) if read_guards else {}
    params = {"n": 1, "max": MAX, **guards}
    marker = {k: f":{k}" if backend == "sqlite" else f"%({k})s" for k in params}
    connection = engine.raw_connection()

    def take(where: str) -> Any:
        sql = TAKE[backend].format(where=where, **marker).format(**marker)
        if backend == "mysql":
            return lambda cursor: (cursor.execute(sql, params), cursor.lastrowid)
        return lambda cursor: (cursor.execute(sql, params), cursor.fetchone())

    takes = {"raw": take(WHERE), "raw guarded": take(WHERE + guard)}
    cursor = connection.cursor()
    assert all(call(cursor)[1] for call in takes.values()), "a raw take advanced nothing"
    cursor.close()
    return engine, connection, takes


def run_backend(args: Any, backend: str) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        h.first_contact(url, [SEQ])
        server = TicketServer(url)
        engine, connection, takes = raw_takes(url, backend)
        try:
            cursor = connection.cursor()
            per_call = h.timed(h.loop(takes["raw"], 20, cursor))[0] / 20
            cursor.close()
            calls = 20 if args.smoke else max(100, min(5000, int(0.15 / per_call)))
            h.log(f"[{backend}] {url!r}: {calls} round trips per run")
            variants = [h.Variant("next_id", h.loop(server.next_id, calls, SEQ), per=calls),
                        h.Variant(f"next_block({BLOCK})",
                                  h.loop(server.next_block, calls, SEQ, BLOCK), per=calls)]
            variants += [h.Variant(name, lambda cursor, t=take: h.loop(t, calls, cursor)(),
                                   connection.cursor, lambda cursor: cursor.close(), calls)
                         for name, take in takes.items() if name == "raw" or backend in GUARD]
            before = server.next_id(SEQ)
            timings = h.interleave(variants, h.rounds(args, 21), label=f"{backend} ")
            issued = server.next_id(SEQ) - before - 1
            expected = (len(timings.orders) + 1) * calls * (1 + BLOCK)
            assert issued == expected, f"the server issued {issued} ids, expected {expected}"
            stats = server.stats()
        finally:
            connection.close()
            engine.dispose()
            server.close()
    guarded = "raw guarded" if backend in GUARD else "raw"
    ratios = {f"{name} / {guarded}": h.ratio_summary(timings, name, guarded, TARGET)
              for name in ("next_id", f"next_block({BLOCK})")}
    if backend in GUARD:
        ratios["raw guarded / raw"] = h.ratio_summary(timings, "raw guarded", "raw")
    return {"ratios": ratios, "server_stats": stats,
            **timings.to_json("median_us_per_round_trip", 1e6)}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    return h.report(args, NAME, {backend: run_backend(args, backend) for backend in args.backends},
                    title="Ticket round trip: TicketServer vs the raw driver",
                    values=("median_us_per_round_trip", "median µs per round trip", "µs"),
                    parameters={"block": BLOCK, "target": TARGET, "raw_takes": TAKE,
                                "guards": {b: g[0] for b, g in GUARD.items()}})


if __name__ == "__main__":
    raise SystemExit(main())
