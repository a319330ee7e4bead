"""Many sequences in one process: threads, memory, first contact, per-id cost, blocking waits and
close, for S sequences.

For each S (default 10, 100, 1,000, 5,000) and each layout — ``server``:
``CachedSource(TicketServer(url))``, and ``tier``: ``CachedSource(DatacenterTier(dc_url,
TicketServer(global_url)))``, every source with its defaults — a worker process of its own, on
two fresh throwaway databases of the backend (global, datacenter), does in order:

1. makes the global server's S tables with ``TicketServer.create_tables`` (what ``init`` does
   once for a fleet; timed apart: ``create_tables_seconds``), builds the sources and draws
   200,000 ids of one sequence, ``warm`` (untimed: connections, statement caches, the tier's
   tables; the one-sequence reference of step 4);
2. **first contact**: ``cache.prepare(names)`` then the first id of each of the S sequences,
   wall time in all (``first_contact_seconds``; goal <= 5 s at S = 5,000). Then, for a sample
   of ``--lazy`` more fresh sequences (default 100), the first id one sequence at a time with
   nothing prepared (each table created on first use): ``lazy_first_contact_per_sequence``;
3. **threads** the library started (``threading.enumerate()`` less the threads there before
   step 1) and **RSS growth per sequence** (``VmRSS`` of ``/proc/self/status`` after step 2's
   refills landed, less before step 2, over S);
4. **warm per-id cost**: N = max(20,000, 8 x S) ``next_id`` calls per run cycling round robin
   over the S sequences (each warmed first with 40 runs' worth of ids, as ``warm`` was: a cache
   holds no more of a sequence than it issued) vs N on ``warm``, the same loop over a list of
   names, in interleaved rounds (one untimed warm-up round; refills in flight awaited before
   each run). The figure
   is the median of the per-round ratios; blocking waits and round trips of the timed runs are
   counted (``CachedSource.stats()``) per 1,000 ids;
5. **close**: ``CachedSource.close()`` over the S + 1 lanes (their ids given back in one call
   where the source takes many), timed, with what it gave back and burned; then the tier and
   the server closed, and the threads still alive afterwards.

A process per case, so that RSS and thread counts are the case's own. Goals, checked at the
largest S: threads <= 8, <= 20 KB RSS per sequence, round robin / one <= 1.5, first contact
<= 5 s, close <= 1 s, 0 blocking waits. ``--smoke``: S = 10, 50, N = 1,000, one round.

    .venv/bin/python benchmarks/bench_scale.py [--smoke] [--sizes 10,100,1000,5000]
        [--layouts server,tier] [--lazy 100] [--rounds 7] [--backends postgresql]
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import re
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

import _common as h

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer

NAME = "bench_scale"
LAYOUTS = {
    "server": "CachedSource(TicketServer(url))",
    "tier": "CachedSource(DatacenterTier(dc_url, TicketServer(global_url)))",
}
ONE, RR, WARM = "one sequence", "round robin over S", "warm"
ROUNDS = 7
PER_LANE = 8  # ids per sequence per round-robin run, at least
WARM_RUNS = 40  # round-robin runs' worth of ids each lane issues before the timed runs
PRIME = 200_000
GOALS = {
    "threads": 8,
    "rss_kb_per_sequence": 20.0,
    "round_robin_over_one": 1.5,
    "first_contact_seconds": 5.0,
    "close_seconds": 1.0,
    "blocking_waits_per_1000_ids": 0.0,
}


def memory() -> dict[str, int]:
    """``VmRSS`` and ``VmSize`` of this process, in KB."""
    with open("/proc/self/status") as status:
        return {
            key: int(value.split()[0])
            for key, _, value in (line.partition(":") for line in status)
            if key in ("VmRSS", "VmSize")
        }


def library_threads(before: set[int]) -> dict[str, int]:
    """The threads started since ``before``, counted by name (numbers masked)."""
    return dict(Counter(
        re.sub(r"_\d+$", "_<n>", t.name) for t in threading.enumerate() if t.ident not in before
    ))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    label = f"{spec['backend']}/{spec['layout']}/S={spec['sequences']}: "
    names = [f"{spec['prefix']}{i:05d}" for i in range(spec["sequences"])]
    lazy = [f"{spec['prefix']}lazy{i:04d}" for i in range(spec["lazy"])]
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    server = TicketServer(spec["global_url"])
    started = time.perf_counter()
    server.create_tables(names)
    out: dict[str, Any] = {"layout": LAYOUTS[spec["layout"]],
                           "create_tables_seconds": time.perf_counter() - started}
    tier = None if spec["dc_url"] is None else DatacenterTier(spec["dc_url"], upstream=server)
    cache = CachedSource(tier if tier is not None else server)
    try:
        h.loop(cache.next_id, spec["prime"], spec["prefix"] + WARM)()
        for source in (cache, tier):
            if source is not None:
                source.wait_idle(30.0)
        gc.collect()
        mem0 = memory()
        h.log(f"  {label}first contact")
        waits = cache.stats()["blocking_waits"]
        started = time.perf_counter()
        cache.prepare(names)
        prepared = time.perf_counter() - started
        for name in names:
            cache.next_id(name)
        contact = time.perf_counter() - started
        first_waits = cache.stats()["blocking_waits"] - waits
        cache.wait_idle(30.0)
        if tier is not None:
            tier.wait_idle(30.0)
        gc.collect()
        mem1 = memory()
        s = len(names)
        out.update(
            sequences=s,
            prepare_seconds=prepared,
            first_contact_seconds=contact,
            first_contact_blocking_waits=first_waits,
            threads_by_name=library_threads(before),
            rss_kb_per_sequence=(mem1["VmRSS"] - mem0["VmRSS"]) / max(1, s),
            vmsize_kb_per_sequence=(mem1["VmSize"] - mem0["VmSize"]) / max(1, s),
        )
        out["threads"] = sum(out["threads_by_name"].values())
        took = []
        for name in lazy:
            began = time.perf_counter()
            cache.next_id(name)
            took.append(time.perf_counter() - began)
        out["lazy_first_contact_per_sequence"] = h.distribution(took)
        h.log(f"  {label}prepare + first ids {contact:.2f} s ({prepared:.2f} s prepare), "
              f"{out['threads']} threads, {out['rss_kb_per_sequence']:.1f} KB per sequence, "
              f"lazy first id p50 {out['lazy_first_contact_per_sequence'].get('p50', 0):.4f} s")
        n = max(spec["ids_per_run"], PER_LANE * s)
        # Warm, as the one sequence is: each lane has issued a few dozen runs' worth of ids (a
        # cache holds no more than a lane issued), so the timed runs measure the hot path.
        for _ in range(WARM_RUNS * math.ceil(n / s)):
            for name in names:
                cache.next_id(name)
        lists = {RR: (names * math.ceil(n / s))[:n], ONE: [spec["prefix"] + WARM] * n}
        counts: dict[str, list[dict[str, int]]] = {RR: [], ONE: []}

        def variant(which: str) -> h.Variant:
            def run(_: Any = None) -> None:
                next_id = cache.next_id
                for name in lists[which]:
                    next_id(name)

            def setup() -> dict[str, int]:
                cache.wait_idle(30.0)
                stats = cache.stats()
                return {k: stats[k] for k in ("blocking_waits", "round_trips")}

            def teardown(before_run: dict[str, int]) -> None:
                stats = cache.stats()
                counts[which].append({k: stats[k] - v for k, v in before_run.items()})

            return h.Variant(which, run, setup, teardown, per=n)

        timings = h.interleave([variant(RR), variant(ONE)], spec["rounds"], label=label)
        ids = n * spec["rounds"]
        out["warm"] = {
            "ids_per_run": n,
            "ratio": h.ratio_summary(timings, RR, ONE),
            "median_ns_per_id": {v: timings.median(v) * 1e9 for v in timings.seconds},
            "per_1000_ids": {
                v: {k: sum(r[k] for r in counts[v][1:]) * 1000 / ids for k in counts[v][0]}
                for v in counts
            },
            **timings.to_json(),
        }
        cache.wait_idle(30.0)
        held = cache.stats()
        started = time.perf_counter()
        burned = cache.close()
        out["close_seconds"] = time.perf_counter() - started
        out["close"] = {"lanes": len(held["sequences"]), "held": held["in_hand"],
                        "given_back": cache.stats()["given_back"] - held["given_back"],
                        "burned": burned}
    finally:
        cache.close()
        if tier is not None:
            tier.close()
        server.close()
    deadline = time.monotonic() + 10.0  # threads end once they see the close
    while set(library_threads(before)) - {"sqlalchemy-tickets-watchdog"}:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out["threads_after_close"] = library_threads(before)
    h.log(f"  {label}close {out['close_seconds']:.2f} s, left: {out['threads_after_close']}")
    return out


def _case(spec: dict[str, Any], pipe: Any) -> None:
    try:
        pipe.send(measure(spec))
    except BaseException as error:
        pipe.send({"error": repr(error), "traceback": traceback.format_exc()})
    finally:
        pipe.close()


def run_case(spec: dict[str, Any], limit: float) -> dict[str, Any]:
    """``measure(spec)`` in a process of its own (forked where the platform can: the parent
    holds no thread and none of the library's objects), killed after ``limit`` seconds."""
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                      else "spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_case, args=(spec, theirs), daemon=True)
    process.start()
    theirs.close()
    try:
        result: dict[str, Any] = (
            mine.recv() if mine.poll(limit) else {"error": f"no result within {limit:.0f} s"}
        )
    except EOFError:
        result = {"error": f"the worker died (exit code {process.exitcode})"}
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
        mine.close()
    if "error" in result:
        h.log(f"  FAILED: {result['error']}\n{result.get('traceback', '')}")
    return result


def figure_value(row: dict[str, Any], key: str) -> float:
    if key == "ratio":
        return float(row["warm"]["ratio"]["median"])
    if key == "waits":
        return float(row["warm"]["per_1000_ids"][RR]["blocking_waits"])
    return float(row[key])


PANELS = (
    ("threads", "threads the library started", "threads", "threads"),
    ("rss_kb_per_sequence", "RSS growth per sequence", "KB", "rss_kb_per_sequence"),
    ("first_contact_seconds", "prepare + first id of every sequence", "s",
     "first_contact_seconds"),
    ("ratio", "warm next_id: round robin over S / one sequence", "×", "round_robin_over_one"),
    ("waits", "blocking waits per 1,000 ids, round robin", "waits",
     "blocking_waits_per_1000_ids"),
    ("close_seconds", "CachedSource.close() over S lanes", "s", "close_seconds"),
)


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    plt = h.pyplot()
    fig, grid = plt.subplots(2, 3, figsize=(16, 9))
    fig.suptitle("Many sequences in one process, by S")
    fig.text(0.01, 0.01, f"a process per point; {h.RATIO_NOTE} (ratio panel); "
             f"{h.load_text(env)} at start", fontsize=7.5, color="dimgray")
    for ax, (key, title, unit, goal) in zip(grid.flat, PANELS, strict=True):
        for backend, layouts in results.items():
            for layout, rows in layouts.items():
                points = sorted((int(s), figure_value(row, key))
                                for s, row in rows.items() if "error" not in row)
                if points:
                    ax.plot(*zip(*points, strict=True), "s-" if layout == "tier" else "o--",
                            label=f"{h.LABELS.get(backend, backend)}: {layout}")
                    for x, y in points:
                        ax.annotate(f"{y:,.3g}", (x, y), xytext=(3, 3),
                                    textcoords="offset points", fontsize=7)
        if GOALS.get(goal):
            ax.axhline(GOALS[goal], color="red", linestyle=":", linewidth=1.2, label="goal")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("sequences S (log)", fontsize=9)
        ax.set_ylabel(unit, fontsize=9)
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.06, right=0.98, hspace=0.35, wspace=0.3, bottom=0.09, top=0.9)
    return fig


def checks_for(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The goals at the largest S, per backend and layout."""
    out: dict[str, dict[str, Any]] = {}
    for backend, layouts in results.items():
        for layout, rows in layouts.items():
            done = {int(s): row for s, row in rows.items() if "error" not in row}
            if not done:
                continue
            s = max(done)
            for key, _, _, goal in PANELS:
                value = figure_value(done[s], key)
                out[f"{backend} {layout} S={s}: {goal}"] = {
                    "median": value, "target": GOALS[goal], "passed": value <= GOALS[goal],
                }
    return out


def options(parser: Any) -> None:
    parser.add_argument("--sizes", default=None, help="numbers of sequences, comma-separated")
    parser.add_argument("--layouts", default="server,tier", help="server,tier")
    parser.add_argument("--lazy", type=int, default=None,
                        help="fresh sequences whose first id is taken one at a time")


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, options, backends=("postgresql",))
    sizes = ([int(x) for x in args.sizes.split(",") if x.strip()] if args.sizes
             else [10, 50] if args.smoke else [10, 100, 1000, 5000])
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or not layouts or set(layouts) - set(LAYOUTS):
        raise SystemExit("--sizes takes positive numbers, --layouts names from server,tier")
    n = 1_000 if args.smoke else 20_000
    lazy = args.lazy if args.lazy is not None else (5 if args.smoke else 100)
    env = h.environment()
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for backend in args.backends:
        results[backend] = {layout: {} for layout in layouts}
        for s in sizes:
            for layout in layouts:
                h.log(f"{backend}, {layout}, S = {s}")
                with contextlib.ExitStack() as stack:
                    url = stack.enter_context(h.throwaway_database(backend))
                    dc = stack.enter_context(h.throwaway_database(backend))
                    spec = {
                        "backend": backend, "layout": layout, "sequences": s,
                        "prefix": f"{layout[0]}{s}_", "lazy": lazy,
                        "global_url": url.render_as_string(hide_password=False),
                        "dc_url": dc.render_as_string(hide_password=False)
                        if layout == "tier" else None,
                        "ids_per_run": n, "prime": n if args.smoke else PRIME,
                        "rounds": h.rounds(args, ROUNDS),
                    }
                    results[backend][layout][str(s)] = run_case(spec, limit=1800)
    failed = [f"{b} {lay} S={s}: {row['error']}" for b, ls in results.items()
              for lay, rows in ls.items() for s, row in rows.items() if "error" in row]
    status = h.report(
        args, NAME, env=env,
        parameters={
            "sizes": sizes, "layouts": {k: LAYOUTS[k] for k in layouts},
            "ids_per_run": f"max({n}, {PER_LANE} x S)", "lazy_sequences": lazy,
            "warm_sequence_primed_with": n if args.smoke else PRIME,
            "rounds": h.rounds(args, ROUNDS), "goals_at_largest_s": GOALS,
            "run_seconds": time.perf_counter() - started,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        results={**results, "failed_cases": failed},
        checks=checks_for(results),
        figure=draw(env, results),
    )
    return 1 if failed else status


if __name__ == "__main__":
    sys.exit(main())
