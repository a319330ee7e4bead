"""A tenfold burst through ``CachedSource``: block size, ids in hand, round trips and blocking
waits over real time (HubSpot's VTickets figure), per backend.

One process, real time. A load generator calls ``CachedSource.next_id("burst")`` on a schedule
kept by the monotonic clock: every millisecond or so it issues the ids due by then at the
current phase's rate (the rate is the slope of a cumulative schedule, so a late tick catches
up and the achieved rate is exact):

    warm-up  R      for W s   (the cold cache learns the rate: blocking waits expected)
    base     R      for T s
    burst    10 R   for T s
    after    R      for 2 T s (the rate estimate forgets the burst over ``window``; the block
                               size only changes when a refill starts, i.e. once the burst's
                               leftover ids have fallen to the low-water mark - hence 2 T)

with R = 2,000 ids/s and T = 10 s (``--quick``: T = 2 s). The cache is
``CachedSource(TicketServer(<throwaway db>), supply=2.0, window=5.0)``: ``supply`` = 2 s of ids
per block so that every phase needs several round trips (the default 30 s would cover a whole
phase in one block), ``window`` = 5 s (default 900 s) so that the shrink after the burst is
visible within the run (``--quick``: 1 s). ``stats()`` is sampled every 100 ms. Each
``next_id`` is timed too (worst call per sample).

Reported per backend: blocking waits after the warm-up (target: 0), round trips per 1,000 ids
per phase, achieved rate and worst lag behind the schedule per phase (the generator must keep
up for the figure to be honest). No speed ratio here: this one is about behaviour over time.

    .venv/bin/python benchmarks/bench_burst.py [--quick] [--backends postgresql,mysql]

(Default backends: PostgreSQL and MySQL/MariaDB; SQLite only when named.)
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from _common import (
    RESULTS_DIR,
    environment,
    load_text,
    log,
    parse_args,
    redact,
    server_info,
    throwaway_database,
    write_json,
)

from sqlalchemy_tickets import CachedSource, TicketServer

NAME = "bench_burst"
SEQ = "burst"
SAMPLE_EVERY = 0.1  # seconds between stats() samples
TICK = 0.001  # the load generator's pacing interval
TARGET_BLOCKING_AFTER_WARMUP = 0
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mysql": "MariaDB/MySQL"}


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # ids per second
    seconds: float


def schedule(base: float, warmup: float, length: float) -> list[Phase]:
    return [
        Phase("warm-up", base, warmup),
        Phase("base", base, length),
        Phase("burst", 10 * base, length),
        Phase("after", base, 2 * length),
    ]


def due_by(phases: list[Phase], elapsed: float) -> int:
    """Ids the schedule has asked for by ``elapsed`` seconds after the start."""
    total = 0.0
    start = 0.0
    for phase in phases:
        if elapsed <= start:
            break
        total += phase.rate * (min(elapsed, start + phase.seconds) - start)
        start += phase.seconds
    return int(total)


STAT_KEYS = ("issued", "round_trips", "blocking_waits", "refills", "block_size", "in_hand", "rate")


def snapshot(cache: CachedSource) -> dict[str, Any]:
    stats = cache.stats()
    lane = stats["sequences"].get(f"{SEQ}/64", {})
    row = {key: stats[key] for key in STAT_KEYS}
    row["refill_latency"] = lane.get("refill_latency", 0.0)
    return row


def drive(cache: CachedSource, phases: list[Phase]) -> dict[str, Any]:
    """Run the schedule; return the samples and the per-phase bookkeeping."""
    next_id = cache.next_id
    clock = time.monotonic
    timer = time.perf_counter
    ends = []
    acc = 0.0
    for phase in phases:
        acc += phase.seconds
        ends.append(acc)
    total = acc
    samples: list[dict[str, Any]] = []
    boundaries: list[dict[str, Any]] = []  # a snapshot at every phase start, and one at the end
    issued = 0
    worst_call = 0.0  # worst next_id in the current sample interval
    worst_lag_ids = [0] * len(phases)
    worst_call_phase = [0.0] * len(phases)
    phase_index = 0
    start = clock()
    boundaries.append({"t": 0.0, "ids": 0, **snapshot(cache)})
    next_sample = SAMPLE_EVERY
    samples.append({"t": 0.0, "ids": 0, "worst_call_ms": 0.0, **snapshot(cache)})
    while True:
        now = clock() - start
        while phase_index < len(phases) and now >= ends[phase_index]:
            # Catch up to the boundary exactly, then snapshot it.
            due = due_by(phases, ends[phase_index])
            while issued < due:
                t = timer()
                next_id(SEQ)
                took = timer() - t
                worst_call = max(worst_call, took)
                worst_call_phase[phase_index] = max(worst_call_phase[phase_index], took)
                issued += 1
            phase_index += 1
            boundaries.append({"t": now, "ids": issued, **snapshot(cache)})
        if phase_index >= len(phases):
            break
        due = due_by(phases, now)
        lag = due - issued
        if lag > worst_lag_ids[phase_index]:
            worst_lag_ids[phase_index] = lag
        while issued < due:
            t = timer()
            next_id(SEQ)
            took = timer() - t
            if took > worst_call:
                worst_call = took
            if took > worst_call_phase[phase_index]:
                worst_call_phase[phase_index] = took
            issued += 1
        if now >= next_sample:
            samples.append(
                {"t": now, "ids": issued, "worst_call_ms": worst_call * 1e3, **snapshot(cache)}
            )
            worst_call = 0.0
            while next_sample <= now:
                next_sample += SAMPLE_EVERY
        # Sleep to the next tick (or sample), never past the end of the phase.
        wake = min(now + TICK, next_sample, ends[phase_index])
        pause = wake - (clock() - start)
        if pause > 0:
            time.sleep(pause)
    samples.append(
        {"t": clock() - start, "ids": issued, "worst_call_ms": worst_call * 1e3, **snapshot(cache)}
    )
    assert issued == due_by(phases, total), (issued, due_by(phases, total))
    return {
        "samples": samples,
        "boundaries": boundaries,
        "worst_lag_ids": worst_lag_ids,
        "worst_call_ms": [x * 1e3 for x in worst_call_phase],
        "ids": issued,
    }


def per_phase(phases: list[Phase], run: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    marks = run["boundaries"]
    for i, phase in enumerate(phases):
        a, b = marks[i], marks[i + 1]
        ids = b["ids"] - a["ids"]
        trips = b["round_trips"] - a["round_trips"]
        seconds = b["t"] - a["t"]
        inside = [s for s in run["samples"] if a["t"] < s["t"] <= b["t"]]
        out.append(
            {
                "phase": phase.name,
                "scheduled_rate": phase.rate,
                "seconds": seconds,
                "ids": ids,
                "achieved_rate": ids / seconds if seconds else None,
                "round_trips": trips,
                "round_trips_per_1000_ids": trips / ids * 1000 if ids else None,
                "blocking_waits": b["blocking_waits"] - a["blocking_waits"],
                "block_size_range": [
                    min((s["block_size"] for s in inside), default=None),
                    max((s["block_size"] for s in inside), default=None),
                ],
                "block_size_at_end": b["block_size"],
                "min_in_hand": min((s["in_hand"] for s in inside), default=None),
                "worst_lag_ids": run["worst_lag_ids"][i],
                "worst_lag_ms": run["worst_lag_ids"][i] / phase.rate * 1e3,
                "worst_next_id_ms": run["worst_call_ms"][i],
            }
        )
    return out


def run_backend(backend: str, phases: list[Phase], supply: float, window: float) -> dict[str, Any]:
    with throwaway_database(backend) as url:
        server = TicketServer(url)
        cache = CachedSource(server, supply=supply, window=window)
        try:
            # First contact (creating the ticket table) is done outside the cache, so the
            # warm-up shows the cache learning the rate, not DDL.
            server.next_id(SEQ)
            log(
                f"[{backend}] {redact(url)}: "
                + ", ".join(f"{p.name} {p.rate:,.0f}/s x {p.seconds:g} s" for p in phases)
            )
            run = drive(cache, phases)
            cache.wait_idle(5.0)
            final = cache.stats()
            info = server_info(backend, url)
        finally:
            burned = cache.close()
            server.dispose()
    phases_out = per_phase(phases, run)
    warm = run["boundaries"][1]
    end = run["boundaries"][-1]
    after_warmup = end["blocking_waits"] - warm["blocking_waits"]
    for p in phases_out:
        log(
            f"  {p['phase']:8s} {p['ids']:7,d} ids at {p['achieved_rate']:8,.0f}/s: "
            f"{p['round_trips']:3d} round trips = "
            f"{p['round_trips_per_1000_ids']:.3f} per 1,000 ids, "
            f"blocking waits {p['blocking_waits']}, block {p['block_size_range'][0]}-"
            f"{p['block_size_range'][1]}, min in hand {p['min_in_hand']}, worst lag "
            f"{p['worst_lag_ms']:.1f} ms, worst next_id {p['worst_next_id_ms']:.2f} ms"
        )
    log(f"  blocking waits after warm-up: {after_warmup} (target {TARGET_BLOCKING_AFTER_WARMUP})")
    return {
        "url": redact(url),
        "server": info,
        "phases": phases_out,
        "blocking_waits_after_warmup": after_warmup,
        "passed": after_warmup <= TARGET_BLOCKING_AFTER_WARMUP,
        "samples": run["samples"],
        "phase_boundaries": run["boundaries"],
        "stats_at_end": final,
        "burned_at_close": burned,
    }


def plot_results(
    results: dict[str, Any], phases: list[Phase], params: dict[str, Any], env: dict[str, Any]
) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    backends = list(results)
    fig, axes = plt.subplots(
        4, len(backends), figsize=(7.2 * len(backends) + 1.5, 11), sharex=True, squeeze=False
    )
    shades = {"warm-up": "#dddddd", "base": "#e3efff", "burst": "#ffe2c6", "after": "#e3efff"}
    rows = [
        ("block_size", "block size (ids, blue)"),
        ("in_hand", "ids in hand"),
        ("round_trips", "round trips (cumulative)"),
        ("blocking_waits", "blocking waits (cumulative)"),
    ]
    for col, backend in enumerate(backends):
        result = results[backend]
        samples = result["samples"]
        ts = [s["t"] for s in samples]
        marks = [b["t"] for b in result["phase_boundaries"]]
        for row, (key, label) in enumerate(rows):
            ax = axes[row][col]
            for i, phase in enumerate(phases):
                ax.axvspan(marks[i], marks[i + 1], color=shades[phase.name], zorder=0)
            ys = [s[key] for s in samples]
            ax.step(ts, ys, where="post", color="tab:blue", linewidth=1.4, zorder=3)
            ax.grid(alpha=0.3, zorder=1)
            if col == 0:
                ax.set_ylabel(label)
            if row == 0:
                # Demand beside the block size: the rate estimate x supply is the block asked for.
                twin = ax.twinx()
                rates = [
                    (b["ids"] - a["ids"]) / (b["t"] - a["t"]) if b["t"] > a["t"] else 0
                    for a, b in zip(samples, samples[1:], strict=False)
                ]
                twin.step(
                    ts[1:],
                    rates,
                    where="pre",
                    color="tab:orange",
                    linewidth=0.9,
                    alpha=0.8,
                    zorder=2,
                )
                twin.plot(
                    ts,
                    [s["rate"] for s in samples],
                    color="tab:green",
                    linewidth=1.1,
                    linestyle="--",
                    zorder=2,
                )
                twin.set_ylim(0, max(rates + [1]) * 1.25)
                twin.tick_params(axis="y", labelcolor="tab:orange")
                if col == len(backends) - 1:
                    twin.set_ylabel("ids/s", color="tab:orange")
                ax.set_ylim(0, max(ys + [1]) * 1.25)
                ax.set_title(
                    f"{LABELS.get(backend, backend)}: blocking waits after warm-up "
                    f"{result['blocking_waits_after_warmup']} "
                    f"({'PASS' if result['passed'] else 'FAIL'})",
                    fontsize=11,
                )
            if row == 1:
                ax.set_ylim(0, max(ys + [1]) * 1.15)
            if row == 2:
                top = max(ys + [1])
                ax.set_ylim(0, top * 1.35)
                for i, p in enumerate(result["phases"]):
                    per = p["round_trips_per_1000_ids"]
                    ax.text(
                        (marks[i] + marks[i + 1]) / 2,
                        top * 1.3,
                        f"{p['round_trips']} RT\n{per:.3f}/1k ids" if per is not None else "",
                        ha="center",
                        va="top",
                        fontsize=8,
                    )
            if row == 3:
                ax.set_ylim(0, max(ys + [1]) * 1.3 + 0.5)
                ax.set_xlabel("seconds since start")
                for i, p in enumerate(result["phases"]):
                    ax.text(
                        (marks[i] + marks[i + 1]) / 2,
                        ax.get_ylim()[1] * 0.93,
                        f"+{p['blocking_waits']}",
                        ha="center",
                        va="top",
                        fontsize=8.5,
                        color="red" if p["blocking_waits"] and p["phase"] != "warm-up" else "black",
                    )
    handles = [
        Patch(color=shades["warm-up"], label="warm-up (R)"),
        Patch(color=shades["base"], label=f"base / after: R = {phases[1].rate:,.0f} ids/s"),
        Patch(color=shades["burst"], label=f"burst: 10 R = {phases[2].rate:,.0f} ids/s"),
        plt.Line2D([], [], color="tab:blue", label="stats() sample (every 100 ms)"),
        plt.Line2D([], [], color="tab:orange", label="ids/s issued (per sample)"),
        plt.Line2D([], [], color="tab:green", linestyle="--", label="cache's rate estimate"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=6, fontsize=8.5, bbox_to_anchor=(0.5, 0.02)
    )
    fig.suptitle(
        f"Tenfold burst through CachedSource(TicketServer(db), supply={params['supply']:g} s, "
        f"window={params['window']:g} s): one process, real time",
        fontsize=12,
    )
    fig.text(
        0.01,
        0.005,
        "Round trips are refills of the background thread, counted when they land. "
        f"Load generator paced by the monotonic clock (tick {TICK * 1e3:g} ms). "
        f"{load_text(env)} at start",
        fontsize=7.5,
        color="dimgray",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(__doc__.split("\n\n")[0], argv)
    if not any(a.startswith("--backends") for a in raw):
        args.backends = ["postgresql", "mysql"]
    base = 2_000.0
    length = 2.0 if args.quick else 10.0
    warmup = 1.0 if args.quick else 3.0
    supply = 2.0
    window = 1.0 if args.quick else 5.0
    phases = schedule(base, warmup, length)
    env = environment()
    results = {backend: run_backend(backend, phases, supply, window) for backend in args.backends}
    passed = all(r["passed"] for r in results.values())
    params = {
        "base_rate": base,
        "burst_rate": 10 * base,
        "phases": [p.__dict__ for p in phases],
        "supply": supply,
        "window": window,
        "cache": f"CachedSource(TicketServer(url), supply={supply}, window={window}) "
        "(other arguments default: min_block=16, max_block=100000, waste_budget=0.001)",
        "sample_every_seconds": SAMPLE_EVERY,
        "tick_seconds": TICK,
        "quick": args.quick,
        "backends": args.backends,
    }
    payload = {
        "benchmark": NAME,
        "description": __doc__,
        "environment": env,
        "parameters": params,
        "target": {"blocking_waits_after_warmup": TARGET_BLOCKING_AFTER_WARMUP},
        "backends": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)
    png_path = plot_results(results, phases, params, env)
    log("")
    log(
        f"{NAME}: R={base:,.0f}/s, 10R burst, {length:g} s phases, supply {supply:g} s, "
        f"window {window:g} s"
    )
    for backend, r in results.items():
        per = ", ".join(f"{p['phase']} {p['round_trips_per_1000_ids']:.3f}" for p in r["phases"])
        lag = max(p["worst_lag_ms"] for p in r["phases"][1:])
        log(
            f"  {backend}: round trips per 1,000 ids: {per}; blocking waits after warm-up "
            f"{r['blocking_waits_after_warmup']} (target 0): {'PASS' if r['passed'] else 'FAIL'}; "
            f"worst schedule lag after warm-up {lag:.1f} ms"
        )
        rates = [p["achieved_rate"] / p["scheduled_rate"] for p in r["phases"]]
        if statistics.fmean(rates) < 0.99:
            log("  note: the generator fell behind its schedule")
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    return 1 if (args.strict and not passed) else 0


if __name__ == "__main__":
    sys.exit(main())
