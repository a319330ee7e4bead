"""Where a ``TicketServer.next_id`` round trip spends its time beyond the raw driver's.

An ablation, not a profiler (cProfile's own per-call cost is of the same order as what is
measured here): each variant adds one layer of what ``TicketServer.next_block`` does around the
driver call, all timed in interleaved rounds in one process, so the difference between adjacent
variants is the wall-clock cost of that layer:

1. ``raw``            one cursor, ``execute`` + ``fetchone`` (MySQL: ``lastrowid``) per call
2. ``+cursor``        a new cursor per call, closed after it
3. ``+pool``          the connection checked out of the server's pool and returned per call
4. ``+watchdog``      the socket's fd looked up and the watchdog armed/disarmed per call
5. ``+library``       the library's ``take_block`` (statement cache, parameter merge), i.e.
                      ``TicketServer._round_trip(_take, …)`` without ``next_block``'s checks
6. ``next_id``        the public call

    .venv/bin/python benchmarks/profile_roundtrip.py [--quick] [--backends postgresql,mysql]

Writes ``results/profile_roundtrip.json``. ``--cprofile`` also writes one cProfile dump per
backend of the public call (``results/profile_roundtrip_<backend>.prof``) and prints its top.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from collections.abc import Callable
from typing import Any

from _common import (
    RESULTS_DIR,
    Variant,
    environment,
    interleave,
    log,
    parse_args,
    throwaway_database,
    write_json,
)
from bench_roundtrip import raw_connection, raw_statement

from sqlalchemy_tickets import TicketServer
from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets._watchdog import watchdog
from sqlalchemy_tickets.dialects import backend_for

NAME = "profile_roundtrip"
SEQ = "bench_profile"


def layers(server: TicketServer, conn: Any, sql: str, params: Any) -> dict[str, Callable[[], Any]]:
    """One call of each layer; each does what the one before does, plus one thing."""
    mysql = server.engine.dialect.name == "mysql"
    backend = backend_for(server.engine.dialect.name)
    table = ticket_table(SEQ)
    increment = server.describe(SEQ).increment  # type: ignore[union-attr]
    shared = conn.cursor()

    def read(cursor: Any) -> Any:
        return cursor.lastrowid if mysql else cursor.fetchone()[0]

    def raw() -> Any:
        shared.execute(sql, params)
        return read(shared)

    def with_cursor() -> Any:
        cursor = conn.cursor()
        try:
            cursor.execute(sql, params)
            return read(cursor)
        finally:
            cursor.close()

    def with_pool() -> Any:
        pooled = server.engine.raw_connection()
        try:
            cursor = pooled.cursor()
            try:
                cursor.execute(sql, params)
                return read(cursor)
            finally:
                cursor.close()
        finally:
            pooled.close()

    def with_watchdog() -> Any:
        pooled = server.engine.raw_connection()
        fd = backend.socket_fd(pooled.dbapi_connection)
        token = watchdog.arm(fd, server.timeout) if fd is not None else None
        try:
            cursor = pooled.cursor()
            try:
                cursor.execute(sql, params)
                return read(cursor)
            finally:
                cursor.close()
        finally:
            if token is not None:
                watchdog.disarm(token)
            pooled.close()

    def with_library() -> Any:
        return server._round_trip(server._take, table, 1, increment)

    def public() -> Any:
        return server.next_id(SEQ)

    return {
        "raw": raw,
        "+cursor": with_cursor,
        "+pool": with_pool,
        "+watchdog": with_watchdog,
        "+library": with_library,
        "next_id": public,
    }


def run_backend(backend: str, rounds: int, calls: int, use_cprofile: bool) -> dict[str, Any]:
    with throwaway_database(backend) as url:
        server = TicketServer(url)
        conn = None
        try:
            sql, params = raw_statement(server, SEQ, 1)
            conn = raw_connection(server)
            steps = layers(server, conn, sql, params)

            def repeat(step: Callable[[], Any]) -> Callable[[Any], None]:
                def run(_: Any) -> None:
                    for _ in range(calls):
                        step()

                return run

            log(f"[{backend}] {calls} calls per layer per round, {rounds} rounds")
            variants = [Variant(name, repeat(step)) for name, step in steps.items()]
            timings = interleave(variants, rounds, warmup=1, label=f"{backend} ")
            profile_text = None
            if use_cprofile:
                profiler = cProfile.Profile()
                profiler.enable()
                repeat(steps["next_id"])(None)
                profiler.disable()
                RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(RESULTS_DIR / f"{NAME}_{backend}.prof")
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
                profile_text = out.getvalue()
        finally:
            if conn is not None:
                conn.close()
            server.dispose()
    names = list(steps)

    def per_call(series: dict[str, list[float]]) -> dict[str, float]:
        return {name: statistics.median(s) / calls * 1e6 for name, s in series.items()}

    def added(series: dict[str, list[float]]) -> dict[str, float]:
        """Per-round differences between adjacent layers, then their median: a layer's cost."""
        return {
            name: statistics.median(
                (b - a) / calls * 1e6 for a, b in zip(series[prev], series[name], strict=True)
            )
            for prev, name in zip(names, names[1:], strict=False)
        }

    return {
        "calls_per_round": calls,
        "median_wall_us_per_call": per_call(timings.seconds),
        "added_wall_us_per_layer": added(timings.seconds),
        "median_cpu_us_per_call": per_call(timings.cpu_seconds),
        "added_cpu_us_per_layer": added(timings.cpu_seconds),
        "seconds_per_round": timings.seconds,
        "cpu_seconds_per_round": timings.cpu_seconds,
        "cprofile_top": profile_text,
    }


def main(argv: list[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cprofile", action="store_true", help="also dump a cProfile")

    args = parse_args(__doc__.split("\n\n")[0], argv, extra)
    cprof = args.cprofile
    rounds = args.rounds or (3 if args.quick else 9)
    calls = 100 if args.quick else 600
    env = environment()
    results = {b: run_backend(b, rounds, calls, cprof) for b in args.backends}
    write_json(
        NAME,
        {
            "benchmark": NAME,
            "description": __doc__,
            "environment": env,
            "parameters": {"rounds": rounds, "calls": calls},
            "backends": results,
        },
    )
    log("")
    for backend, result in results.items():
        log(
            f"{backend}: median us per call (+ what the layer adds: median of per-round "
            "differences)"
        )
        log(f"  {'layer':10s} {'wall':>8s} {'(+wall)':>9s} {'client CPU':>11s} {'(+CPU)':>9s}")
        for name in result["median_wall_us_per_call"]:
            wall = result["median_wall_us_per_call"][name]
            cpu = result["median_cpu_us_per_call"][name]
            extra_wall = result["added_wall_us_per_layer"].get(name)
            extra_cpu = result["added_cpu_us_per_layer"].get(name)
            log(
                f"  {name:10s} {wall:8.1f} "
                + ("" if extra_wall is None else f"({extra_wall:+7.1f})").rjust(9)
                + f" {cpu:11.1f} "
                + ("" if extra_cpu is None else f"({extra_cpu:+7.1f})").rjust(9)
            )
        if result["cprofile_top"]:
            log(result["cprofile_top"])
    log(f"wrote {RESULTS_DIR / (NAME + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
