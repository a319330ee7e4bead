"""The datacenter tier's take under contention: takes per second one sequence serves, and their
latency, when P processes take small blocks at once; a baseline commit against this tree.

A *take* is ``DatacenterTier.next_block(seq, count)`` (``--count``, default 1); at ``18dfaeb``
one short transaction (BEGIN, SET LOCAL, two SELECT ... FOR UPDATE, two UPDATE, COMMIT) queued
on the sequence's state row lock. ``baseline`` is ``src/`` at ``--baseline-ref`` (default
``18dfaeb``, exported with ``git archive <ref> src | tar -x``), ``new`` the ``src/`` beside this
script. Every worker is a fresh interpreter (this script with ``--worker``) with its variant's
``src`` first on ``PYTHONPATH``; its ``sqlalchemy_tickets.__file__`` is checked against that
tree and kept in the JSON. Only the public API is used.

Per backend (default PostgreSQL and MariaDB; ``sqlite`` works too) each variant has its own
throwaway global (upstream: ``TicketServer(global_url)``) and datacenter databases, so the two
never share tables even if their schemas come to differ. After an untimed warm-up run each, for
each P (``--procs``, default 2, 8, 24), ``--rounds`` (default 3) rounds alternate the variants,
the first swapped each round. Each run has a sequence of its own, ``take_p<P>_r<round>``:

1. worker 0 fills the stock: ``DatacenterTier(dc, upstream, min_block=max_block=3,000,000)``
   takes an id, ``wait_idle()``, and ``describe()`` must show ~3 million ids in stock;
2. every worker builds ``DatacenterTier(dc, upstream, supply=1, timeout=30)`` and takes once,
   untimed. ``supply=1``: it aims at a second of ids in stock, so no take finds the stock low
   and nothing is refilled during the run;
3. all start at one instant of the shared monotonic clock and call ``next_block(seq, count)``
   in a tight loop for ``--seconds`` (default 10), garbage collector off, each call timed with
   ``time.perf_counter``; failed calls are counted.

Per run: takes/s (all workers' takes ÷ the window), the pooled latency distribution (ms) and
each worker's, ``stats()`` deltas over the window (blocking waits, upstream round trips,
refills: 0 expected) and duplicates among all ids handed out (0, else exit 1). Per (backend,
P): each variant's medians over rounds of takes/s, p50 and p99; ``new / baseline`` as medians
of per-round ratios (and the ratio of the medians). Checks (failing only with ``--strict``):
time per take new / baseline <= 1 at every P, i.e. new takes/s >= baseline's. With the same
code in both trees the ratios show the noise. ``--smoke``: P = 2, 1 s, one round.

    .venv/bin/python benchmarks/bench_tier_take.py [--smoke] [--procs 2,8,24] [--seconds 10]
        [--count 1] [--rounds 3] [--baseline-ref 18dfaeb] [--backends postgresql,mysql]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common as h

NAME = "bench_tier_take"
VARIANTS = ("baseline", "new")
STOCK = 3_000_000  # ids in stock per sequence before its run
TIER = {"supply": 1.0, "timeout": 30.0}  # the workers' tiers: no refill, no give-up under load
ROUNDS = 3
KEYS = ("takes_per_second", "p50_ms", "p99_ms")  # per variant: medians over rounds


# -- worker processes (this script with --worker, under a variant's PYTHONPATH) ----------------


def _fill(tier_cls: Any, upstream: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Stock ``spec["stock"]`` ids of the run's sequence; its ``describe()`` status after."""
    seq, n = spec["sequence"], spec["stock"]
    tier = tier_cls(spec["dc"], upstream=upstream, min_block=n, max_block=n, timeout=60.0)
    try:
        tier.next_id(seq)
        tier.wait_idle(120.0)
        status: dict[str, Any] = next(s for s in tier.describe() if s.sequence == seq).as_dict()
    finally:
        tier.close()
    if status["stock"] < 0.9 * n:
        raise RuntimeError(f"the stock of {seq} is {status['stock']}, not ~{n}")
    return status


def worker() -> None:
    """Fill (worker 0), build a tier, take once, say ready, wait for the start, take in a tight
    loop until the window closes, answer with latencies, ids and stats deltas."""
    try:
        spec = json.loads(sys.stdin.readline())
        import sqlalchemy_tickets
        from sqlalchemy_tickets import DatacenterTier, TicketsError, TicketServer

        upstream = TicketServer(spec["global"], timeout=30.0)
        filled = _fill(DatacenterTier, upstream, spec) if spec["index"] == 0 else None
        h.say({"library": sqlalchemy_tickets.__file__, "filled": filled})
        sys.stdin.readline()  # worker 0 filled the stock
        tier = DatacenterTier(spec["dc"], upstream=upstream, **spec["tier"])
        seq, count = spec["sequence"], spec["count"]
        tier.next_block(seq, count)
        before = tier.stats()
        h.say("ready")
        start = json.loads(sys.stdin.readline())
        latencies: list[float] = []
        ids: list[int] = []
        errors: list[str] = []
        clock, now = time.perf_counter, time.monotonic
        gc.collect()
        gc.disable()
        time.sleep(max(0.0, start - now()))
        end = start + spec["seconds"]
        while now() < end:
            began = clock()
            try:
                block = tier.next_block(seq, count)
            except TicketsError as error:
                errors.append(repr(error))
                continue
            latencies.append(clock() - began)
            ids.extend(block)
        gc.enable()
        after = tier.stats()
        stock = next(s for s in tier.describe() if s.sequence == seq).stock if filled else None
        tier.close()
        upstream.close()
        keys = ("blocking_waits", "upstream_round_trips", "refills", "round_trips", "failures")
        h.say({"summary": {k: v if k == "count" else v * 1e3
                           for k, v in h.distribution(latencies).items()},
               "latencies_us": [round(x * 1e6) for x in latencies], "ids": ids,
               "errors": len(errors), "first_errors": errors[:3], "stock_after": stock,
               "stats": {k: after[k] - before[k] for k in keys}})
    except BaseException:
        h.say({"error": traceback.format_exc()})
        raise SystemExit(1) from None


# -- the runner ---------------------------------------------------------------------------------


def run(
    src: Path, urls: dict[str, str], p: int, seq: str, count: int, seconds: float
) -> dict[str, Any]:
    """One run of P workers of one variant; its figures."""
    spec = {**urls, "sequence": seq, "stock": STOCK, "tier": TIER, "count": count,
            "seconds": seconds}
    with h.Children(__file__, p, src) as workers:
        workers.tell([{**spec, "index": i} for i in range(p)])
        started = workers.hear()  # imported; worker 0 filled the stock
        libraries = sorted({s["library"] for s in started})
        if any(not lib.startswith(str(src) + os.sep) for lib in libraries):
            raise RuntimeError(f"workers imported {libraries}, not the tree at {src}")
        workers.tell(["go"] * p)  # build the tiers, one untimed take each
        workers.hear()
        workers.tell([time.monotonic() + 0.5] * p, close=True)  # the common start
        answers = workers.hear()
    ids = [i for a in answers for i in a["ids"]]
    pooled = h.distribution([x / 1e3 for a in answers for x in a["latencies_us"]])
    takes = int(pooled["count"])
    return {
        "sequence": seq,
        "takes": takes,
        "takes_per_second": takes / seconds,
        "latency_ms": pooled,
        "workers": [{**a["summary"], "errors": a["errors"], "first_errors": a["first_errors"]}
                    for a in answers],
        "errors": sum(a["errors"] for a in answers),
        "ids_handed_out": len(ids),
        "duplicates": len(ids) - len(set(ids)),
        **{k: sum(a["stats"][k] for a in answers) for k in answers[0]["stats"]},
        "filled": started[0]["filled"],
        "stock_after": answers[0]["stock_after"],
        "library": libraries,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def _figure(run: dict[str, Any], key: str) -> float:
    return float(run[key] if key == "takes_per_second" else run["latency_ms"][key[:3]])


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant the medians over rounds; new / baseline as medians of per-round ratios."""
    out: dict[str, Any] = {
        v: {k: statistics.median(_figure(r, k) for r in runs[v]) for k in KEYS} for v in VARIANTS
    }
    for key in ("takes_per_second", "p99_ms"):
        per = [_figure(n, key) / max(_figure(b, key), 1e-9)
               for n, b in zip(runs["new"], runs["baseline"], strict=True)]
        out[f"new_over_baseline_{key}"] = {
            "median": statistics.median(per), "per_round": per,
            "ratio_of_medians": out["new"][key] / max(out["baseline"][key], 1e-9)}
    return out


def draw(env: dict[str, Any], results: dict[str, Any], procs: list[int]) -> Any:
    loads = [r["load_average_at_end"][0] for by_p in results.values() for c in by_p.values()
             for v in VARIANTS for r in c["runs"][v]]
    fig, axes = h.figure(3, "Datacenter tier: takes of one sequence by P processes at once, "
                         "baseline vs new", env, width=4.6, note="lines: medians over rounds, "
                         "dots: rounds; variants alternated, the first swapped each round; "
                         f"1-min load {min(loads):.1f}-{max(loads):.1f} at the runs' ends")
    fig.subplots_adjust(left=0.06, wspace=0.3)
    colors = {"postgresql": "tab:blue", "mysql": "tab:orange", "sqlite": "tab:green"}
    for backend, by_p in results.items():
        for variant, style in (("baseline", "o--"), ("new", "s-")):
            for ax, key in zip(axes, KEYS, strict=True):
                ax.plot(procs, [by_p[str(p)][variant][key] for p in procs], style, alpha=0.85,
                        color=colors[backend], label=f"{h.LABELS[backend]}, {variant}")
                dots = [(p, _figure(r, key)) for p in procs for r in by_p[str(p)]["runs"][variant]]
                ax.scatter(*zip(*dots, strict=True), s=6, color=colors[backend], alpha=0.5)
        for p in procs:
            ratio = by_p[str(p)]["new_over_baseline_takes_per_second"]["median"]
            axes[0].annotate(f"×{ratio:.2f}", (p, by_p[str(p)]["new"]["takes_per_second"]),
                             xytext=(4, 4), textcoords="offset points", fontsize=7,
                             color=colors[backend])
    titles = ("takes/s (×: new / baseline, median of\nthe rounds' ratios)",
              "p50 latency of a take", "p99 latency of a take")
    for ax, title, unit in zip(axes, titles, ("takes/s", "ms", "ms"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("linear" if unit == "takes/s" else "log")
        ax.grid(alpha=0.3, which="both")
        ax.set_xticks(procs, [str(p) for p in procs])
        ax.set_xlabel("worker processes P", fontsize=9)
        ax.set_ylabel(unit, fontsize=9)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    return fig


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--procs", default=None, help="worker counts (default 2,8,24)")
    parser.add_argument("--seconds", type=float, default=None, help="timed window (default 10)")
    parser.add_argument("--count", type=int, default=1, help="ids per take (default 1)")
    parser.add_argument("--baseline-ref", default="18dfaeb", help="git ref of the baseline")


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, options, backends=("postgresql", "mysql"))
    procs = [int(x) for x in args.procs.split(",")] if args.procs else (
        [2] if args.smoke else [2, 8, 24])
    seconds = args.seconds or (1.0 if args.smoke else 10.0)
    rounds = h.rounds(args, ROUNDS)
    env = h.environment()
    results: dict[str, Any] = {}
    checks: dict[str, dict[str, Any]] = {}
    if args.smoke and not h.has_commit(args.baseline_ref):
        # A smoke run checks the script runs: without the history, this tree is its baseline.
        h.log(f"{args.baseline_ref!r} is not here: this tree stands in for the baseline")
        source: contextlib.AbstractContextManager[tuple[Path, str]] = (
            contextlib.nullcontext((h.REPO_DIR, "this tree"))
        )
    else:
        source = h.exported_source(args.baseline_ref)
    with source as (exported, commit):
        srcs = {"baseline": exported / "src", "new": h.REPO_DIR / "src"}
        for backend in args.backends:
            results[backend] = {}
            with contextlib.ExitStack() as stack:
                urls = {v: {k: stack.enter_context(h.throwaway_database(backend))
                            .render_as_string(hide_password=False) for k in ("global", "dc")}
                        for v in VARIANTS}
                if not args.smoke:  # untimed: a fresh database's first seconds are slow
                    for v in VARIANTS:
                        run(srcs[v], urls[v], procs[0], "take_warmup", args.count, 2.0)
                for p in procs:
                    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
                    for r in range(rounds):
                        for v in VARIANTS[::-1] if r % 2 else VARIANTS:
                            got = run(srcs[v], urls[v], p, f"take_p{p}_r{r}", args.count, seconds)
                            runs[v].append(got)
                            lat = got["latency_ms"]
                            h.log(f"  {backend} P={p} round {r + 1}/{rounds} {v:8}: "
                                  f"{got['takes_per_second']:7.1f} takes/s, p50 {lat['p50']:.2f} "
                                  f"ms, p99 {lat['p99']:.2f} ms, {got['errors']} errors, "
                                  f"{got['blocking_waits']} waits, {got['duplicates']} duplicates")
                    results[backend][str(p)] = got = {**compare(runs), "runs": runs}
                    per = [1 / x for x in got["new_over_baseline_takes_per_second"]["per_round"]]
                    checks[f"{backend} P={p}: time per take, new / baseline"] = {
                        "median": statistics.median(per), "min": min(per), "max": max(per),
                        "per_round": per, "target": 1.0, "passed": statistics.median(per) <= 1.0}
    every = [(f"{b} P={p} {v}", r) for b, by_p in results.items() for p, c in by_p.items()
             for v in VARIANTS for r in c["runs"][v]]
    waited = [n for n, r in every if r["blocking_waits"] or r["upstream_round_trips"]]
    duplicated = [n for n, r in every if r["duplicates"]]
    status = h.report(
        args, NAME, env=env,
        parameters={"procs": procs, "seconds": seconds, "count": args.count, "rounds": rounds,
                    "stock_per_sequence": STOCK, "worker_tier": TIER,
                    "baseline_ref": args.baseline_ref, "baseline_commit": commit,
                    "runs_that_waited_or_went_upstream": waited,
                    "runs_with_duplicates": duplicated,
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        results=results, checks=checks, figure=draw(env, results, procs),
    )
    for label, names in (("waited or went upstream", waited), ("duplicates", duplicated)):
        if names:
            h.log(f"runs with {label}: {', '.join(names)}")
    return 1 if duplicated else status


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
