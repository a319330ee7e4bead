"""Many sequences in one process: threads, memory, first contact, per-id cost, blocking waits and
close, for S sequences.

For each S (default 10, 100, 1,000, 5,000) and each layout — ``server``:
``CachedSource(TicketServer(url))``, and ``tier``: ``CachedSource(DatacenterTier(dc_url,
TicketServer(global_url)))``, every source with its defaults — a worker process of its own, on
two fresh throwaway databases of the backend (global, datacenter), does in order:

1. builds the sources and draws 200,000 ids of one sequence, ``warm`` (untimed: connections,
   statement caches, the tier's tables; it is the one-sequence reference of step 4);
2. **first contact**: the first id of each of S fresh sequences, one after another in one thread
   (each sequence's tables created on first use), wall time in all and per sequence. A call
   that fails (``TicketServerUnavailable``: a loaded machine) is counted and retried. Past
   ``--cap`` seconds (default 240) it stops, and the rest of the case runs on the sequences
   reached (``capped`` and ``sequences_reached`` in the JSON);
3. **threads** the library started (``threading.enumerate()`` less the threads there before
   step 1, counted by name pattern) and **RSS growth per sequence** (``VmRSS`` of
   ``/proc/self/status`` once step 2's refills landed, less before step 2, over the sequences
   reached; ``VmSize`` too);
4. **warm per-id cost**: N = max(20,000, 8 x S) ``next_id`` calls per run cycling round robin
   over the S sequences vs N on ``warm``, the same loop over a list of names, in interleaved
   rounds (one untimed warm-up round; refills in flight awaited before each run). The figure
   is the median of the per-round ratios; the blocking waits and round trips of the timed runs
   are counted (``CachedSource.stats()``) per 1,000 ids;
5. **close**: ``CachedSource.close()`` over the S + 1 lanes (their ids given back), timed, with
   what it gave back and burned; then the tier and the server closed (timed apart), and the
   threads still alive afterwards.

A process per case, so that RSS and thread counts are the case's own and nothing a case started
(the library's watchdog lives as long as its process) outlives it. Checks: the scaling goals at
the largest S (threads <= 8 with a tier, <= 20 KB per sequence, round robin / one <= 1.5, first
contact <= 5 s, close <= 1 s, 0 blocking waits). The library as it stands misses most of them:
they are reported (exit 1 only with ``--strict``), for the restructuring to be compared with.
``--smoke``: S = 10, 50, N = 1,000, one round, both layouts on one pair of databases.

    .venv/bin/python benchmarks/bench_scale.py [--smoke] [--sizes 10,100,1000,5000]
        [--layouts server,tier] [--cap 240] [--rounds 7] [--backends postgresql]
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

import _common as h

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer, TicketServerUnavailable

NAME = "bench_scale"
LAYOUTS = {
    "server": "CachedSource(TicketServer(url))",
    "tier": "CachedSource(DatacenterTier(dc_url, TicketServer(global_url)))",
}
ONE, RR = "one sequence", "round robin over S"
WARM = "warm"
ROUNDS = 7
#: Ids per sequence per round-robin run, at least: a young lane's blocks are 8 ids, and runs
#: that gave each lane half a block alternated between thousands of blocking waits and none
#: (which one depended on the run's parity, not on the library).
PER_LANE = 8
#: Ids the one-sequence reference takes before anything is measured (as bench_alloc primes).
PRIME = 200_000
RETRIES = 5  # first-contact attempts per sequence before the case fails
#: The scaling goals, checked at the largest S reached.
GOALS = {
    "threads": 8,
    "rss_kb_per_sequence": 20.0,
    "round_robin_over_one": 1.5,
    "first_contact_seconds": 5.0,
    "close_seconds": 1.0,
    "blocking_waits_per_1000_ids": 0.0,
}


# -- the worker process ------------------------------------------------------------------------


def memory() -> dict[str, int]:
    """``VmRSS``, ``VmHWM`` and ``VmSize`` of this process, in KB."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "VmSize"):
                found[key] = int(value.split()[0])
    return found


def thread_kinds(threads: Sequence[threading.Thread]) -> dict[str, int]:
    """Thread counts by name, with the per-sequence and numbered parts masked."""
    kinds = Counter(
        re.sub(r"^(tickets-dc-refill-).*$", r"\1<sequence>", re.sub(r"_\d+$", "_<n>", t.name))
        for t in threads
    )
    return dict(kinds.most_common())


def library_threads(before: set[int]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.ident not in before]


def distribution(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    if not ordered:
        return {}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def first_contact(
    cache: CachedSource, names: Sequence[str], cap: float
) -> tuple[list[str], list[float], Counter[str], bool]:
    """The first id of each sequence in turn; stops at ``cap`` seconds."""
    reached: list[str] = []
    took: list[float] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    for i, name in enumerate(names):
        if time.perf_counter() - start > cap:
            return reached, took, errors, True
        began = time.perf_counter()
        for attempt in range(1, RETRIES + 1):
            try:
                cache.next_id(name)
                break
            except TicketServerUnavailable as error:
                errors[type(error).__name__] += 1
                if attempt == RETRIES:
                    raise
        took.append(time.perf_counter() - began)
        reached.append(name)
        if (i + 1) % 500 == 0:
            h.log(f"    {i + 1} sequences in {time.perf_counter() - start:.1f} s")
    return reached, took, errors, False


def counted(
    name: str, cache: CachedSource, tier: DatacenterTier | None, run: Any, per: int, log: list
) -> h.Variant:
    """Refills in flight awaited before each run (untimed); its waits and round trips counted."""

    def snapshot() -> dict[str, int]:
        c = cache.stats()
        t = tier.stats() if tier is not None else {}
        return {
            "blocking_waits": c["blocking_waits"],
            "round_trips": c["round_trips"],
            "tier_blocking_waits": t.get("blocking_waits", 0),
            "tier_upstream_round_trips": t.get("upstream_round_trips", 0),
        }

    def setup() -> dict[str, int]:
        cache.wait_idle(30.0)
        return snapshot()

    def teardown(before: dict[str, int]) -> None:
        after = snapshot()
        log.append({k: after[k] - before[k] for k in after})

    return h.Variant(name, run, setup, teardown, per=per)


def names_loop(cache: CachedSource, names: list[str]) -> Any:
    def run(_: Any = None) -> None:
        next_id = cache.next_id
        for name in names:
            next_id(name)

    return run


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    label = f"{spec['backend']}/{spec['layout']}/S={spec['sequences']}: "
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    at_start = memory()
    server = TicketServer(spec["global_url"])
    tier = None if spec["dc_url"] is None else DatacenterTier(spec["dc_url"], upstream=server)
    cache = CachedSource(tier if tier is not None else server)
    out: dict[str, Any] = {"layout": LAYOUTS[spec["layout"]], "memory_kb_at_start": at_start}
    closed = False
    try:
        started = time.perf_counter()
        h.loop(cache.next_id, spec["prime"], spec["prefix"] + WARM)()
        out["warm_sequence_seconds"] = time.perf_counter() - started
        cache.wait_idle(30.0)
        if tier is not None:
            tier.wait_idle(30.0)
        gc.collect()
        mem0 = memory()
        names = [f"{spec['prefix']}{i:05d}" for i in range(spec["sequences"])]
        h.log(f"  {label}first contact")
        started = time.perf_counter()
        reached, took, errors, capped = first_contact(cache, names, spec["cap"])
        contact = time.perf_counter() - started
        cache.wait_idle(30.0)
        if tier is not None:
            tier.wait_idle(30.0)
        gc.collect()
        mem1, threads = memory(), library_threads(before)
        s = len(reached)
        out.update(
            sequences_asked=spec["sequences"],
            sequences_reached=s,
            capped=capped,
            first_contact_seconds=contact,
            first_contact_per_sequence_seconds=distribution(took),
            first_contact_cumulative_seconds={
                str(k): sum(took[:k]) for k in sorted({max(1, s * j // 10) for j in range(1, 11)})
            },
            first_contact_errors=dict(errors),
            threads=len(threads),
            threads_by_name=thread_kinds(threads),
            memory_kb_before=mem0,
            memory_kb_after=mem1,
            rss_kb_per_sequence=(mem1["VmRSS"] - mem0["VmRSS"]) / max(1, s),
            vmsize_kb_per_sequence=(mem1["VmSize"] - mem0["VmSize"]) / max(1, s),
        )
        h.log(
            f"  {label}{s} sequences in {contact:.1f} s{' (capped)' if capped else ''}, "
            f"{len(threads)} threads, {out['rss_kb_per_sequence']:.1f} KB RSS per sequence"
        )
        n = max(spec["ids_per_run"], PER_LANE * s)
        lists = {RR: (reached * math.ceil(n / max(1, s)))[:n], ONE: [spec["prefix"] + WARM] * n}
        runs: dict[str, list[dict[str, int]]] = {RR: [], ONE: []}
        variants = [
            counted(v, cache, tier, names_loop(cache, lists[v]), n, runs[v]) for v in (RR, ONE)
        ]
        timings = h.interleave(variants, spec["rounds"], label=label)
        ids = n * spec["rounds"]
        out["warm"] = {
            "ids_per_run": n,
            "ids_per_sequence_per_run": n / max(1, s),
            "ratio": h.ratio_summary(timings, RR, ONE),
            "median_ns_per_id": {v: timings.median(v) * 1e9 for v in timings.seconds},
            "per_1000_ids": {
                v: {k: sum(r[k] for r in runs[v][1:]) * 1000 / ids for k in runs[v][0]}
                for v in runs
            },
            "counts_per_run": {v: runs[v][1:] for v in runs},
            **timings.to_json(),
        }
        cache.wait_idle(30.0)
        held = cache.stats()
        out["cache_stats_before_close"] = {k: v for k, v in held.items() if k != "sequences"}
        started = time.perf_counter()
        burned = cache.close()
        out["close_seconds"] = time.perf_counter() - started
        closed = True
        after = cache.stats()
        out["close"] = {
            "lanes": len(held["sequences"]),
            "held_before": held["in_hand"] + held["in_flight"],
            "given_back": after["given_back"] - held["given_back"],
            "burned": burned,
        }
    finally:
        if not closed:
            cache.close()
        started = time.perf_counter()
        if tier is not None:
            tier.close()
        server.close()
        out["close_sources_seconds"] = time.perf_counter() - started
    deadline = time.monotonic() + 10.0  # refill threads end once they see the close
    while library_threads(before) and time.monotonic() < deadline:
        if all(t.name == "sqlalchemy-tickets-watchdog" for t in library_threads(before)):
            break
        time.sleep(0.05)
    out["threads_after_close"] = thread_kinds(library_threads(before))
    h.log(
        f"  {label}close {out['close_seconds']:.2f} s (+ sources "
        f"{out['close_sources_seconds']:.2f} s), left: {out['threads_after_close']}"
    )
    return out


def _case(spec: dict[str, Any], pipe: Any) -> None:
    try:
        pipe.send(measure(spec))
    except BaseException as error:
        pipe.send({"error": repr(error), "traceback": traceback.format_exc()})
    finally:
        pipe.close()


# -- the runner --------------------------------------------------------------------------------


def run_case(spec: dict[str, Any], limit: float) -> dict[str, Any]:
    """``measure(spec)`` in a process of its own, killed after ``limit`` seconds."""
    # Forked where the platform can: the parent holds no thread and none of the library's
    # objects, and a fork spares each case a second of imports (smoke runs in make test).
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_case, args=(spec, theirs), daemon=True)
    started = time.perf_counter()
    process.start()
    theirs.close()
    try:
        if mine.poll(limit):
            result: dict[str, Any] = mine.recv()
        else:
            result = {"error": f"killed: no result within {limit:.0f} s"}
    except EOFError:
        result = {"error": f"the worker died (exit code {process.exitcode})"}
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(10)
        mine.close()
    result["process_seconds"] = time.perf_counter() - started
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if "error" in result:
        h.log(f"  FAILED: {result['error']}\n{result.get('traceback', '')}")
    return result


def case(
    backend: str,
    layout: str,
    sequences: int,
    args: Any,
    n: int,
    cap: float,
    shared: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """One case on ``shared`` databases (global, datacenter), else on two of its own."""
    with contextlib.ExitStack() as stack:
        if shared is not None:
            url, dc = shared
        else:
            url = stack.enter_context(h.throwaway_database(backend))
            dc = stack.enter_context(h.throwaway_database(backend))
        spec = {
            "backend": backend,
            "layout": layout,
            "sequences": sequences,
            "prefix": f"{layout[0]}{sequences}_",
            "global_url": url.render_as_string(hide_password=False),
            "dc_url": dc.render_as_string(hide_password=False) if layout == "tier" else None,
            "ids_per_run": n,
            "prime": n if args.smoke else PRIME,
            "rounds": h.rounds(args, ROUNDS),
            "cap": cap,
        }
        return run_case(spec, limit=3 * cap + 600)


def sizes_option(parser: Any) -> None:
    parser.add_argument("--sizes", default=None, help="numbers of sequences, comma-separated")
    parser.add_argument("--layouts", default="server,tier", help="server,tier")
    parser.add_argument("--cap", type=float, default=None, help="first-contact seconds per case")


# -- report ------------------------------------------------------------------------------------


PANELS = (
    ("threads", "threads the library started", "threads", True),
    ("rss_kb_per_sequence", "RSS growth per sequence", "KB", False),
    ("first_contact_seconds", "first id of every sequence (wall)", "s", True),
    ("ratio", "warm next_id: round robin over S / one sequence", "× (median of rounds)", True),
    ("waits", "blocking waits per 1,000 ids, round robin", "waits", False),
    ("close_seconds", "CachedSource.close() over S lanes", "s", True),
)


def figure_value(row: dict[str, Any], key: str) -> float | None:
    if "error" in row:
        return None
    if key == "ratio":
        return float(row["warm"]["ratio"]["median"])
    if key == "waits":
        return float(row["warm"]["per_1000_ids"][RR]["blocking_waits"])
    return float(row[key])


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    plt = h.pyplot()
    fig, grid = plt.subplots(2, 3, figsize=(16, 9))
    fig.suptitle("Many sequences in one process, by S (today's library: the baseline)")
    fig.text(
        0.01,
        0.01,
        f"a process per point; {h.RATIO_NOTE} (ratio panel; bars: min-max of "
        f"rounds); x: sequences reached; {h.load_text(env)} at start",
        fontsize=7.5,
        color="dimgray",
    )
    for ax, (key, title, unit, log_y) in zip(grid.flat, PANELS, strict=True):
        for backend, layouts in results.items():
            for layout, rows in layouts.items():
                points = [
                    (row["sequences_reached"], figure_value(row, key), row)
                    for row in rows.values()
                    if "error" not in row
                ]
                if not points:
                    continue
                xs = [p[0] for p in points]
                ys = [p[1] for p in points]
                style = "s-" if layout == "tier" else "o--"
                tag = f"{h.LABELS.get(backend, backend)}: {layout}"
                if key == "ratio":
                    spread = [p[2]["warm"]["ratio"] for p in points]
                    lows = [y - r["min"] for y, r in zip(ys, spread, strict=True)]
                    highs = [r["max"] - y for y, r in zip(ys, spread, strict=True)]
                    ax.errorbar(xs, ys, yerr=[lows, highs], fmt=style, capsize=3, label=tag)
                else:
                    ax.plot(xs, ys, style, label=tag)
                for x, y, row in points:
                    ax.annotate(
                        f"{y:,.3g}" + ("*" if row.get("capped") else ""),
                        (x, y),
                        xytext=(3, 3),
                        textcoords="offset points",
                        fontsize=7,
                    )
        goal = {"ratio": "round_robin_over_one", "waits": "blocking_waits_per_1000_ids"}.get(
            key, key
        )
        if GOALS.get(goal):
            ax.axhline(GOALS[goal], color="red", linestyle=":", linewidth=1.2, label="goal")
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("sequences S (log)", fontsize=9)
        ax.set_ylabel(unit, fontsize=9)
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.06, right=0.98, hspace=0.35, wspace=0.3, bottom=0.09, top=0.9)
    return fig


def checks_for(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The scaling goals at the largest S reached, per backend and layout."""
    out: dict[str, dict[str, Any]] = {}
    for backend, layouts in results.items():
        for layout, rows in layouts.items():
            done = [row for row in rows.values() if "error" not in row]
            if not done:
                continue
            top = max(done, key=lambda row: row["sequences_reached"])
            s = top["sequences_reached"]
            for goal, target in GOALS.items():
                if goal == "threads" and layout != "tier":
                    continue
                key = {"round_robin_over_one": "ratio"}.get(goal, goal)
                key = {"blocking_waits_per_1000_ids": "waits"}.get(goal, key)
                value = figure_value(top, key)
                assert value is not None
                out[f"{backend} {layout} S={s}: {goal}"] = {
                    "median": value,
                    "target": target,
                    "passed": value <= target,
                }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, sizes_option, backends=("postgresql",))
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    else:
        sizes = [10, 50] if args.smoke else [10, 100, 1000, 5000]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or set(layouts) - set(LAYOUTS) or not layouts:
        raise SystemExit("--sizes takes positive numbers, --layouts names from server,tier")
    n = 1_000 if args.smoke else 20_000
    cap = args.cap or (60.0 if args.smoke else 240.0)
    env = h.environment()
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for backend in args.backends:
        results[backend] = {layout: {} for layout in layouts}
        with contextlib.ExitStack() as stack:
            # Smoke: two databases for all cases (each case's sequences have names of their
            # own), sparing seconds of CREATE DATABASE; full runs give each case empty catalogs.
            shared = None
            if args.smoke:
                shared = [stack.enter_context(h.throwaway_database(backend)) for _ in "gd"]
            for s in sizes:
                for layout in layouts:
                    h.log(f"{backend}, {layout}, S = {s}")
                    results[backend][layout][str(s)] = case(
                        backend, layout, s, args, n, cap, shared
                    )
    total = time.perf_counter() - started
    failed = [
        f"{b} {lay} S={s}: {row['error']}"
        for b, ls in results.items()
        for lay, rows in ls.items()
        for s, row in rows.items()
        if "error" in row
    ]
    status = h.report(
        args,
        NAME,
        env=env,
        parameters={
            "sizes": sizes,
            "layouts": {k: LAYOUTS[k] for k in layouts},
            "ids_per_run": f"max({n}, {PER_LANE} x S)",
            "warm_sequence_primed_with": n if args.smoke else PRIME,
            "rounds": h.rounds(args, ROUNDS),
            "first_contact_cap_seconds": cap,
            "goals_at_largest_s": GOALS,
            "run_seconds": total,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        results={**results, "failed_cases": failed},
        checks=checks_for(results),
        figure=draw(env, results),
    )
    if failed:
        h.log("failed cases:\n  " + "\n  ".join(failed))
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
