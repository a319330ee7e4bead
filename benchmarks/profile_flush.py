"""Where a flush's time goes, per phase, for the three models of ``bench_flush.py``.

The same models, sizes and interleaved runs as ``bench_flush.py``, each run split into:
``add_all``; ``before_flush``, every ``before_flush`` listener on ``Session`` (in practice the
library's id assignment, which runs on every flush; timed by a listener inserted first and one
appended last); ``driver INSERT``, time inside the driver for the INSERTs
(``before/after_cursor_execute``); ``flush rest``, the rest of ``flush()`` (unit of work,
parameters, key write-back); ``commit``. No target: a profiling aid.

    .venv/bin/python benchmarks/profile_flush.py [--smoke] [--backends ...] [--cprofile]

``--cprofile`` also dumps one cProfile per backend and model (``<out>/profile_flush_<backend>_
<model>.prof``; read one with ``python -m pstats``).
"""

from __future__ import annotations

import cProfile
import statistics
import sys
import time
from typing import Any

import _common as h
import sqlalchemy as sa
from bench_flush import MODELS, Base, flush
from sqlalchemy import event
from sqlalchemy.orm import Session

NAME = "profile_flush"
PHASES = ("add_all", "before_flush", "driver INSERT", "flush rest", "commit")


class Clock:
    """Listeners marking the phases of the flush in progress."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.driver = 0.0

    def mark(self, name: str) -> Any:
        return lambda *_: self.marks.__setitem__(name, time.perf_counter())

    def after_cursor(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            self.driver += time.perf_counter() - self.marks["cursor"]


def phased(variant: h.Variant, clock: Clock, seen: dict[str, list[float]]) -> h.Variant:
    """``variant``'s run, its phases recorded from the clock's marks."""

    def run(state: tuple[Session, list[Any]]) -> None:
        session, objs = state
        clock.driver, t0 = 0.0, time.perf_counter()
        session.add_all(objs)
        t1 = time.perf_counter()
        session.flush()
        t2 = time.perf_counter()
        session.commit()
        hooks = clock.marks["hooks end"] - clock.marks["hooks start"]
        values = (
            t1 - t0,
            hooks,
            clock.driver,
            t2 - t1 - hooks - clock.driver,
            time.perf_counter() - t2,
        )
        for phase, value in zip(PHASES, values, strict=True):
            seen[phase].append(value)

    return h.Variant(variant.name, run, variant.setup, variant.teardown)


def run_backend(args: Any, backend: str, rows: int) -> dict[str, Any]:
    clock, phases = Clock(), {name: {p: [] for p in PHASES} for name in MODELS}
    listeners = [
        (Session, "before_flush", clock.mark("hooks start"), {"insert": True}),
        (Session, "before_flush", clock.mark("hooks end"), {}),
    ]
    with h.throwaway_database(backend) as url:
        engine = sa.create_engine(url)
        listeners += [
            (engine, "before_cursor_execute", clock.mark("cursor"), {}),
            (engine, "after_cursor_execute", clock.after_cursor, {}),
        ]
        for target, name, fn, kw in listeners:
            event.listen(target, name, fn, **kw)
        try:
            Base.metadata.create_all(engine)
            variants = [phased(flush(engine, name, rows), clock, phases[name]) for name in MODELS]
            h.interleave(variants, h.rounds(args, 7), label=f"{backend} ")
            for variant in variants if args.cprofile else []:
                state, profiler = variant.setup(), cProfile.Profile()
                profiler.runcall(variant.run, state)
                variant.teardown(state)
                profiler.dump_stats(args.out / f"{NAME}_{backend}_{variant.name}.prof")
        finally:
            for target, name, fn, _ in listeners:
                event.remove(target, name, fn)
            h.close_embedded(engine)
            engine.dispose()
    # Each list starts with the warm-up run's; the median is of the timed runs.
    median = {
        m: {p: statistics.median(v[1:]) * 1e3 for p, v in ph.items()} for m, ph in phases.items()
    }
    h.log(
        f"{backend}: median ms per phase ({rows:,} rows)\n  {'model':8s}"
        + "".join(f"{p:>15s}" for p in PHASES)
    )
    for model, ms in median.items():
        h.log(f"  {model:8s}" + "".join(f"{ms[p]:15.1f}" for p in PHASES))
    return {"median_ms": median, "seconds_per_round": phases}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, lambda p: p.add_argument("--cprofile", action="store_true"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = 200 if args.smoke else 20_000
    results = {backend: run_backend(args, backend, rows) for backend in args.backends}
    return h.report(args, NAME, env=h.environment(), parameters={"rows": rows}, results=results)


if __name__ == "__main__":
    sys.exit(main())
