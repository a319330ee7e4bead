"""Where a ``TicketServer.next_id`` round trip spends its time beyond the raw driver's.

An ablation, not a profiler (cProfile's own per-call cost is of the order of what is measured):
each layer adds one thing ``TicketServer.next_id`` does around the driver call, all timed in
interleaved rounds in one process, so the difference between adjacent layers is its cost:

1. ``raw``        the library's statement on a bare cursor (as ``bench_roundtrip.py``'s baseline)
2. ``+watchdog``  the socket's fd looked up and the watchdog armed and disarmed per call
3. ``+library``   the server's own round trip: a kept connection and cursor, the watchdog, the
                  statement cache and parameters (``next_block`` without its checks)
4. ``next_id``    the public call

No target: a profiling aid. ``--cprofile`` also dumps a cProfile of the public call per backend
(``<out>/profile_roundtrip_<backend>.prof``; call counts, not times, are what it shows well).

    .venv/bin/python benchmarks/profile_roundtrip.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

import cProfile
import statistics
import sys
from typing import Any

import _common as h
from bench_roundtrip import raw_driver

from sqlalchemy_tickets import TicketServer

NAME, SEQ = "profile_roundtrip", "bench_profile"


def layers(server: TicketServer, cursor: Any, call: Any) -> dict[str, Any]:
    """One call of each layer; each does what the one before does, plus one thing. The two
    middle layers reach into the library's internals: when these move, this is what to update."""
    from sqlalchemy_tickets._naming import ticket_table

    table, info = ticket_table(SEQ), server.describe(SEQ)

    def with_watchdog() -> Any:
        token = server.own.arm(cursor.connection)  # the DBAPI connection
        try:
            return call(cursor)
        finally:
            server.own.disarm(token)

    return {
        "raw": lambda: call(cursor),
        "+watchdog": with_watchdog,
        "+library": lambda: server._round_trip(server._take, table, 1, info),
        "next_id": lambda: server.next_id(SEQ),
    }


def run_backend(args: Any, backend: str, calls: int) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        server, conn = TicketServer(url), None
        try:
            conn, call = raw_driver(server, SEQ, 1)
            steps = layers(server, conn.cursor(), call)
            variants = [h.Variant(name, h.loop(f, calls), per=calls) for name, f in steps.items()]
            timings = h.interleave(variants, h.rounds(args, 9), label=f"{backend} ")
            if args.cprofile:
                cProfile.runctx(
                    "variants[-1].run(None)",
                    globals(),
                    locals(),
                    str(args.out / f"{NAME}_{backend}.prof"),
                )
        finally:
            if conn is not None:
                conn.close()
            server.close()
    names = list(steps)

    def added(cpu: bool) -> dict[str, float]:
        """Median of per-round differences between adjacent layers: each layer's cost, µs."""
        return {
            b: statistics.median(
                y - x for x, y in zip(timings.unit(a, cpu), timings.unit(b, cpu), strict=True)
            )
            * 1e6
            for a, b in zip(names, names[1:], strict=False)
        }

    us = {n: timings.median(n) * 1e6 for n in names}
    h.log(
        f"{backend}: µs per call "
        + ", ".join(f"{n} {v:.1f}" for n, v in us.items())
        + "; added: "
        + ", ".join(f"{n} {v:+.1f}" for n, v in added(False).items())
    )
    return {
        "median_us_per_call": us,
        "added_us_per_layer": added(False),
        "added_cpu_us_per_layer": added(True),
        **timings.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, lambda p: p.add_argument("--cprofile", action="store_true"))
    args.out.mkdir(parents=True, exist_ok=True)
    calls = 20 if args.smoke else 600
    results = {backend: run_backend(args, backend, calls) for backend in args.backends}
    return h.report(args, NAME, env=h.environment(), parameters={"calls": calls}, results=results)


if __name__ == "__main__":
    sys.exit(main())
