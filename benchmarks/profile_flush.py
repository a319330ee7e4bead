"""Where the time of bench_flush's ``add_all`` + ``flush`` + ``commit`` goes, per model and phase.

Phases, measured with event hooks around the same interleaved runs as ``bench_flush.py``:

* ``add_all``        ``session.add_all(objs)``
* ``before_flush``   every ``before_flush`` listener on ``Session`` - in practice the library's
                     ``_assign_ids``, which runs on every flush, TicketId model or not (timed by a
                     listener inserted first and one appended last)
* ``driver INSERT``  time inside the driver for the INSERTs (``before/after_cursor_execute``)
* ``flush rest``     the rest of ``flush()``: unit of work, parameter building, key write-back
* ``commit``         ``session.commit()`` (COMMIT, expiring the objects)

    .venv/bin/python benchmarks/profile_flush.py [--quick] [--backends ...] [--cprofile]

Writes ``results/profile_flush.json``; ``--cprofile`` also dumps one profile per backend and
model (``results/profile_flush_<backend>_<model>.prof``) and prints the top of the ticket one.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from typing import Any

import sqlalchemy as sa
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
from bench_flush import MODELS, Base, build_objects, close_ticket_source, empty_table
from sqlalchemy import event
from sqlalchemy.orm import Session

NAME = "profile_flush"
PHASES = ("add_all", "before_flush", "driver INSERT", "flush rest", "commit", "total")


def run_backend(backend: str, rows: int, rounds: int, use_cprofile: bool) -> dict[str, Any]:
    marks: dict[str, float] = {}
    driver: list[float] = []

    def first(*_: Any) -> None:
        marks["before_flush_start"] = time.perf_counter()

    def last(*_: Any) -> None:
        marks["before_flush_end"] = time.perf_counter()

    def before_cursor(conn, cursor, statement, *_: Any) -> None:  # type: ignore[no-untyped-def]
        marks["cursor"] = time.perf_counter()

    def after_cursor(conn, cursor, statement, *_: Any) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("INSERT"):
            driver.append(time.perf_counter() - marks["cursor"])

    phases: dict[str, dict[str, list[float]]] = {m: {p: [] for p in PHASES} for m in MODELS}
    profiles: dict[str, str] = {}
    with throwaway_database(backend) as url:
        engine = sa.create_engine(url)
        event.listen(Session, "before_flush", first, insert=True)
        event.listen(Session, "before_flush", last)
        event.listen(engine, "before_cursor_execute", before_cursor)
        event.listen(engine, "after_cursor_execute", after_cursor)
        try:
            Base.metadata.create_all(engine)

            def variant(name: str) -> Variant:
                model = MODELS[name]
                seen = phases[name]

                def setup() -> tuple[Session, list[Any]]:
                    empty_table(engine, backend, model)
                    return Session(engine), build_objects(model, rows)

                def run(state: tuple[Session, list[Any]]) -> None:
                    session, objs = state
                    driver.clear()
                    t0 = time.perf_counter()
                    session.add_all(objs)
                    t1 = time.perf_counter()
                    session.flush()
                    t2 = time.perf_counter()
                    session.commit()
                    t3 = time.perf_counter()
                    hooks = marks["before_flush_end"] - marks["before_flush_start"]
                    inserts = sum(driver)
                    rest = t2 - t1 - hooks - inserts
                    values = (t1 - t0, hooks, inserts, rest, t3 - t2, t3 - t0)
                    for phase, value in zip(PHASES, values, strict=True):
                        seen[phase].append(value)

                return Variant(name, run, setup, lambda state: state[0].close())

            log(f"[{backend}] {rows} rows per flush, {rounds} rounds")
            interleave([variant(name) for name in MODELS], rounds, warmup=1, label=f"{backend} ")
            if use_cprofile:
                for name, model in MODELS.items():
                    empty_table(engine, backend, model)
                    objs = build_objects(model, rows)
                    profiler = cProfile.Profile()
                    with Session(engine) as session:
                        profiler.enable()
                        session.add_all(objs)
                        session.flush()
                        session.commit()
                        profiler.disable()
                    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                    profiler.dump_stats(RESULTS_DIR / f"{NAME}_{backend}_{name}.prof")
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
                    profiles[name] = out.getvalue()
        finally:
            event.remove(Session, "before_flush", first)
            event.remove(Session, "before_flush", last)
            close_ticket_source(engine)
            engine.dispose()
    # Phase lists include the warm-up run first; drop it.
    medians = {
        name: {phase: statistics.median(values[1:]) for phase, values in seen.items()}
        for name, seen in phases.items()
    }
    return {
        "rows": rows,
        "median_seconds": medians,
        "seconds_per_round": phases,
        "cprofile_top": profiles,
    }


def main(argv: list[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cprofile", action="store_true", help="also dump cProfiles")

    args = parse_args(__doc__.split("\n\n")[0], argv, extra)
    rows = 2_000 if args.quick else 20_000
    rounds = args.rounds or (3 if args.quick else 7)
    env = environment()
    results = {b: run_backend(b, rows, rounds, args.cprofile) for b in args.backends}
    write_json(
        NAME,
        {
            "benchmark": NAME,
            "description": __doc__,
            "environment": env,
            "parameters": {"rows": rows, "rounds": rounds},
            "backends": results,
        },
    )
    log("")
    for backend, result in results.items():
        log(f"{backend}: median ms per phase ({rows} rows)")
        log("  " + f"{'model':8s}" + "".join(f"{phase:>15s}" for phase in PHASES))
        for name, medians in result["median_seconds"].items():
            log("  " + f"{name:8s}" + "".join(f"{medians[p] * 1e3:15.1f}" for p in PHASES))
        if "ticket" in result["cprofile_top"]:
            log(result["cprofile_top"]["ticket"])
    log(f"wrote {RESULTS_DIR / (NAME + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
