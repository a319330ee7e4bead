"""A tenfold burst through ``CachedSource`` in real time (HubSpot's VTickets figure), per backend.

``CachedSource(TicketServer(db), supply=2.0, window=5.0).next_id`` paced at R = 2,000 ids/s for
3 s (warm-up), R for 10 s, 10 R for 10 s, R for 20 s; per phase: ids, round trips, blocking
waits, block sizes, ids in hand, slowest call. Target: 0 blocking waits after the warm-up.

    .venv/bin/python benchmarks/bench_burst.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

import time
from typing import Any

import _harness as h

from sqlalchemy_tickets import CachedSource, TicketServer

NAME, RATE, SAMPLE_EVERY, TICK = "bench_burst", 2_000.0, 0.1, 0.001
KEYS = ("issued", "round_trips", "blocking_waits", "block_size", "in_hand", "rate")


def due_by(phases: list[tuple[str, float, float]], elapsed: float) -> int:
    """Ids the schedule of ``(name, rate, seconds)`` phases has asked for by ``elapsed``."""
    total, start = 0.0, 0.0
    for _, rate, seconds in phases:
        total += rate * max(0.0, min(elapsed, start + seconds) - start)
        start += seconds
    return int(total)


def drive(cache: CachedSource, phases: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """Run the schedule; a ``stats()`` sample every 100 ms and at every phase boundary (these
    carry ``"phase"``), each with the worst ``next_id`` since the sample before."""
    ends = [sum(p[2] for p in phases[: i + 1]) for i in range(len(phases))]
    issued, worst, phase, samples = 0, 0.0, 0, []
    start = time.monotonic()

    def sample(t: float, **extra: Any) -> None:
        stats = cache.stats()
        samples.append({"t": t, "ids": issued, "worst_ms": worst * 1e3,
                        **{k: stats[k] for k in KEYS}, **extra})

    sample(0.0, phase=phases[0][0])
    next_sample = SAMPLE_EVERY
    while phase < len(phases):
        now = min(time.monotonic() - start, ends[phase])
        for _ in range(due_by(phases, now) - issued):
            worst = max(worst, h.timed(cache.next_id, "burst")[0])
            issued += 1
        if now >= ends[phase]:
            phase += 1
            sample(now, phase=phases[phase][0] if phase < len(phases) else "end")
        elif now >= next_sample:
            sample(now)
            worst, next_sample = 0.0, next_sample + SAMPLE_EVERY
        wake = min(now + TICK, next_sample, ends[min(phase, len(phases) - 1)])
        time.sleep(max(0.0, wake - (time.monotonic() - start)))
    return samples


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: ids, achieved rate, round trips (per 1,000 ids), blocking waits, blocks seen."""
    marks = [s for s in samples if "phase" in s]
    out = []
    for a, b in zip(marks, marks[1:], strict=False):
        inside = [s for s in samples if a["t"] < s["t"] <= b["t"]]
        ids, trips = b["ids"] - a["ids"], b["round_trips"] - a["round_trips"]
        out.append({"phase": a["phase"], "ids": ids,
                    "achieved_rate": ids / max(b["t"] - a["t"], 1e-9), "round_trips": trips,
                    "round_trips_per_1000_ids": trips / ids * 1000 if ids else None,
                    "blocking_waits": b["blocking_waits"] - a["blocking_waits"],
                    "block_sizes": sorted({s["block_size"] for s in inside}),
                    "min_in_hand": min((s["in_hand"] for s in inside), default=None),
                    "worst_next_id_ms": max((s["worst_ms"] for s in inside), default=0.0)})
    return out


def run_backend(backend: str, phases: list[Any], window: float) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        h.first_contact(url, ["burst"])  # the DDL outside the cache's warm-up
        server = TicketServer(url)
        cache = CachedSource(server, supply=2.0, window=window)
        try:
            samples = drive(cache, phases)
        finally:
            burned = cache.close()
            server.close()
    out = summarize(samples)
    for p in out:
        h.log(f"  {p['phase']:8s} {p['ids']:7,d} ids at {p['achieved_rate']:7,.0f}/s: "
              f"{p['round_trips']} round trips, blocking waits {p['blocking_waits']}, "
              f"blocks {p['block_sizes'][:1]}-{p['block_sizes'][-1:]}")
    waits = sum(p["blocking_waits"] for p in out[1:])
    return {"phases": out, "blocking_waits_after_warmup": h.check(waits, 0),
            "samples": samples, "burned_at_close": burned}


def plot(results: dict[str, Any], env: dict[str, Any]) -> Any:
    """Four figures of ``stats()`` over time, a line per backend; warm-up grey, burst orange."""
    fig, axes = h.figure(4, "A tenfold burst through CachedSource(TicketServer(db), supply=2 s, "
                         "window=5 s)", env, "one process, real time; stats() every 100 ms",
                         width=4.5, left=0.05, wspace=0.3)
    marks = [s["t"] for s in next(iter(results.values()))["samples"] if "phase" in s]
    for ax, key in zip(axes, ("block_size", "in_hand", "round_trips", "blocking_waits"),
                       strict=True):
        ax.axvspan(marks[0], marks[1], color="#dddddd")
        ax.axvspan(marks[2], marks[3], color="#ffe2c6")
        for backend, r in results.items():
            ax.step([s["t"] for s in r["samples"]], [s[key] for s in r["samples"]],
                    where="post", label=h.LABELS[backend])
        ax.set_title(key.replace("_", " "), fontsize=10)
        ax.set_xlabel("seconds", fontsize=9)
    axes[0].legend(fontsize=7)
    return fig


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql", "mysql"))
    warm, length = (0.2, 0.3) if args.smoke else (3.0, 10.0)
    phases = [("warm-up", RATE, warm), ("base", RATE, length), ("burst", 10 * RATE, length),
              ("after", RATE, 2 * length)]
    window = 1.0 if args.smoke else 5.0
    results = {backend: run_backend(backend, phases, window) for backend in args.backends}
    return h.report(args, NAME, results, figure=plot(results, args.env),
                    parameters={"phases": phases, "supply": 2.0, "window": window},
                    checks={f"{b} blocking waits after warm-up": r["blocking_waits_after_warmup"]
                            for b, r in results.items()})


if __name__ == "__main__":
    raise SystemExit(main())
