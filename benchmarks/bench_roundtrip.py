"""Ticket round trips: ``TicketServer.next_id`` / ``next_block(seq, 1000)`` vs the raw driver.

Per backend, a :class:`TicketServer` on a throwaway database issues ids from sequence
``bench_ours``; the baseline is the bare driver (sqlite3 / psycopg / PyMySQL) on one connection
in autocommit, opened with the connect arguments SQLAlchemy and the library would use, running
the library's own compiled statement - read back from its statement cache, so the SQL text is
identical - on sequence ``bench_raw``, whose table the server created (identical schema):

* PostgreSQL, SQLite: ``UPDATE … SET id = id + n*increment … RETURNING id`` + ``fetchone()``
* MySQL/MariaDB: ``UPDATE … SET id = LAST_INSERT_ID(id + step) …`` + ``cursor.lastrowid``

Overhead ratio = our seconds per round trip / raw seconds per round trip, both timed in the same
round; reported: the median over rounds. Target: <= 1.2 for both calls on every backend.

    .venv/bin/python benchmarks/bench_roundtrip.py [--quick] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

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

from sqlalchemy_tickets import TicketServer
from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets.dialects import backend_for

NAME = "bench_roundtrip"
TARGET = 1.2  # our time per round trip / raw driver time per round trip
BLOCK = 1000
OURS, RAW = "bench_ours", "bench_raw"
CALLS = {"next_id": 1, "next_block": BLOCK}  # ids per round trip


def raw_connection(server: TicketServer) -> Any:
    """A bare DBAPI connection in autocommit, opened as the server's engine opens its own."""
    engine = server.engine
    dialect = engine.dialect
    cargs, cparams = dialect.create_connect_args(engine.url)
    options = backend_for(dialect.name).engine_options(engine.url, server.timeout)
    cparams.update(options.get("connect_args", {}))
    dbapi = dialect.loaded_dbapi
    conn = dbapi.connect(*cargs, **cparams)
    if dialect.name == "sqlite":
        conn.isolation_level = None  # what SQLAlchemy's AUTOCOMMIT does for pysqlite
    elif dialect.name == "postgresql":
        conn.autocommit = True
    else:
        conn.autocommit(True)
    return conn


def raw_statement(server: TicketServer, sequence: str, ids: int) -> tuple[str, Any]:
    """The SQL text and parameters the library sends to take ``ids`` ids of ``sequence``.

    The statement comes from the backend's cache, filled by a call through ``server`` first;
    the parameters are what the backend's ``take_block`` passes for that count.
    """
    server.next_block(sequence, ids)  # creates the table and fills the statement cache
    dialect = server.engine.dialect
    table = ticket_table(sequence)

    def not_cached(_: Any) -> Any:
        raise AssertionError(f"no cached take_block statement for {table.name}")

    stmt = backend_for(dialect.name).statement(dialect, table, "take_block", not_cached)
    info = server.describe(sequence)
    assert info is not None
    # The same parameters on every backend (see TicketBackend.take_block).
    step = ids * info.increment
    return stmt.sql, stmt.params(
        step=step, max=table.max_id - step, increment=info.increment, offset=info.offset
    )


def ours_variant(server: TicketServer, label: str, calls: int) -> Variant:
    ids = CALLS[label]

    def run(_: Any) -> None:
        if ids == 1:
            next_id = server.next_id
            for _ in range(calls):
                next_id(OURS)
        else:
            next_block = server.next_block
            for _ in range(calls):
                next_block(OURS, ids)

    return Variant(f"ours {label}", run)


def raw_variant(conn: Any, mysql: bool, label: str, sql: str, params: Any, calls: int) -> Variant:
    seen: list[int] = []

    def setup() -> Any:
        return conn.cursor()

    if mysql:

        def run(cursor: Any) -> None:
            execute = cursor.execute
            for _ in range(calls):
                execute(sql, params)
                last = cursor.lastrowid
            seen.append(last)

    else:

        def run(cursor: Any) -> None:
            execute = cursor.execute
            for _ in range(calls):
                execute(sql, params)
                last = cursor.fetchone()[0]
            seen.append(last)

    def teardown(cursor: Any) -> None:
        cursor.close()  # SQLite: resets the statement, so no write lock outlives the round
        if len(seen) >= 2:
            assert seen[-1] - seen[-2] >= calls * CALLS[label], "raw loop issued no ids"

    return Variant(f"raw {label}", run, setup, teardown)


def calibrate(step: Callable[[], None], budget: float, low: int, high: int) -> int:
    """How many calls of ``step`` fill about ``budget`` seconds."""
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(20):
        step()
    per_call = (time.perf_counter() - start) / 20
    return max(low, min(high, int(budget / per_call)))


def run_backend(backend: str, rounds: int, budget: float, quick: bool) -> dict[str, Any]:
    with throwaway_database(backend) as url:
        server = TicketServer(url)
        conn = None
        try:
            server.next_id(OURS)  # first contact: creates the table, caches its stride
            statements = {label: raw_statement(server, RAW, ids) for label, ids in CALLS.items()}
            conn = raw_connection(server)
            mysql = server.engine.dialect.name == "mysql"
            sql_id, params_id = statements["next_id"]
            probe = conn.cursor()

            def one_raw() -> None:
                probe.execute(sql_id, params_id)
                if not mysql:
                    probe.fetchone()

            calls = calibrate(one_raw, budget, 20 if quick else 100, 5000)
            probe.close()
            log(
                f"[{backend}] {redact(url)}: {calls} round trips per variant per round, "
                f"{rounds} rounds"
            )
            log(f"  SQL: {sql_id}")
            variants = []
            for label in CALLS:
                sql, params = statements[label]
                variants.append(ours_variant(server, label, calls))
                variants.append(raw_variant(conn, mysql, label, sql, params, calls))
            before = server.next_id(OURS)
            timings: Timings = interleave(variants, rounds, warmup=1, label=f"{backend} ")
            after = server.next_id(OURS)
            issued = (rounds + 1) * calls * sum(CALLS.values())
            assert after - before == issued + 1, f"ours issued {after - before - 1}, not {issued}"
            info = server_info(backend, url)
            driver = {
                "dbapi": server.engine.dialect.loaded_dbapi.__name__,
                "raw_connection_type": type(conn).__module__ + "." + type(conn).__qualname__,
                "prepare_threshold": getattr(conn, "prepare_threshold", None),
            }
        finally:
            if conn is not None:
                conn.close()
            server.dispose()
    result: dict[str, Any] = {
        "url": redact(url),
        "server": info,
        "driver": driver,
        "round_trips_per_round": calls,
        "sql": {label: sql for label, (sql, _) in statements.items()},
        "raw_params": {label: params for label, (_, params) in statements.items()},
        "round_orders": timings.orders,
        "seconds_per_round": timings.seconds,
        "median_us_per_round_trip": {
            name: timings.median(name) / calls * 1e6 for name in timings.seconds
        },
        "cpu_seconds_per_round": timings.cpu_seconds,
        "median_client_cpu_us_per_round_trip": {
            name: timings.cpu_median(name) / calls * 1e6 for name in timings.cpu_seconds
        },
        "median_ids_per_second": {
            name: calls * CALLS[name.split()[1]] / timings.median(name) for name in timings.seconds
        },
        "ratios": {
            label: ratio_summary(timings, f"ours {label}", f"raw {label}", TARGET)
            for label in CALLS
        },
    }
    result["overhead_us_per_round_trip"] = {
        label: result["median_us_per_round_trip"][f"ours {label}"]
        - result["median_us_per_round_trip"][f"raw {label}"]
        for label in CALLS
    }
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    # Many short rounds: each round's ratio compares runs made a fraction of a second apart.
    rounds = args.rounds or (3 if args.quick else 21)
    budget = 0.03 if args.quick else 0.15  # seconds of raw round trips per variant and round
    env = environment()
    results = {
        backend: run_backend(backend, rounds, budget, args.quick) for backend in args.backends
    }
    checks = {
        f"{backend} {label}": result["ratios"][label]
        for backend, result in results.items()
        for label in CALLS
    }
    passed = all(summary["passed"] for summary in checks.values())
    payload = {
        "benchmark": NAME,
        "description": __doc__,
        "environment": env,
        "parameters": {
            "block_size": BLOCK,
            "rounds": rounds,
            "warmup_rounds": 1,
            "seconds_of_raw_round_trips_per_round": budget,
            "quick": args.quick,
            "backends": args.backends,
            "reported_ratio": "median over rounds of (ours seconds / raw seconds) for the same "
            "number of round trips, both timed in the same round",
        },
        "target": {"ratio": "ours/raw per round trip", "max": TARGET, "on": "every backend"},
        "backends": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)
    png_path = plot(
        NAME,
        title="Ticket round trip: TicketServer vs the raw driver running the same SQL",
        bars=[
            RatioBar(
                backend,
                f"{label}" + (f"(seq, {BLOCK})" if label == "next_block" else "()"),
                result["ratios"][label]["per_round"],
                TARGET,
            )
            for label in CALLS
            for backend, result in results.items()
        ],
        ratio_ylabel="overhead: our time / raw driver time per round trip",
        target=TARGET,
        target_label=f"target: <= {TARGET}x raw",
        side_title="median ids per second (log scale)",
        side_ylabel="ids / second",
        side_values={
            backend: result["median_ids_per_second"] for backend, result in results.items()
        },
        side_log=True,
        footnote=(
            f"{rounds} interleaved rounds (order rotated) after 1 warm-up; raw = one DBAPI "
            "connection in autocommit, same SQL text and parameters. "
            f"{load_text(env)} at start"
        ),
    )

    log("")
    log(f"{NAME}: {rounds} rounds")
    for backend, result in results.items():
        per_trip = result["median_us_per_round_trip"]
        cpu = result["median_client_cpu_us_per_round_trip"]
        log(
            f"  {backend} (wall / client CPU per round trip): "
            + ", ".join(f"{name} {us:.0f}/{cpu[name]:.0f} us" for name, us in per_trip.items())
        )
    for line in verdict_lines(checks):
        log(line)
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    return 1 if (args.strict and not passed) else 0


if __name__ == "__main__":
    sys.exit(main())
