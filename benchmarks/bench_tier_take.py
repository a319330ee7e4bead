"""The datacenter tier's take under contention: takes per second one sequence serves, and their
latency, when P processes take small blocks at once; a baseline commit against this tree.

``DatacenterTier.next_block(seq, --count)`` in a tight loop for ``--seconds`` from P fresh
interpreters at once, ``src/`` at ``--baseline-ref`` vs this tree, alternated for ``--rounds``:
takes/s, latencies, waits and duplicates (exit 1). ``--strict``: time per take new / baseline
<= 1 at every P. ``--smoke``: P = 2, 1 s, one round.

    .venv/bin/python benchmarks/bench_tier_take.py [--smoke] [--procs 2,8,24] [--seconds 10]
        [--count 1] [--rounds 3] [--baseline-ref 18dfaeb] [--backends postgresql,mysql]
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _harness as h

NAME, STOCK, ROUNDS = "bench_tier_take", 3_000_000, 3
VARIANTS = ("baseline", "new")
TIER = {"supply": 1.0, "timeout": 30.0}  # the workers' tiers: no refill, no give-up under load
KEYS = ("takes_per_second", "p50_ms", "p99_ms")  # per variant: medians over rounds
STATS = ("blocking_waits", "upstream_round_trips", "refills", "round_trips", "failures")


def worker(spec: dict[str, Any], conn: Any) -> None:
    """With its variant's tree first on ``sys.path``: fill (worker 0), build a tier, take once,
    then take through the window from the start it is sent; its latencies, ids, stats deltas."""
    sys.path.insert(0, spec["src"])  # before the library's first import in this interpreter
    import sqlalchemy_tickets
    from sqlalchemy_tickets import DatacenterTier, TicketsError, TicketServer

    upstream = TicketServer(spec["global"], timeout=30.0)
    seq, count, filled = spec["sequence"], spec["count"], None
    if spec["index"] == 0:  # the stock of the run's sequence, and its describe() after
        n = spec["stock"]
        with DatacenterTier(spec["dc"], upstream=upstream, min_block=n, max_block=n,
                            timeout=60.0) as tier:
            tier.next_id(seq)
            tier.wait_idle(120.0)
            filled = next(s for s in tier.describe() if s.sequence == seq).as_dict()
        if filled["stock"] < 0.9 * n:
            raise RuntimeError(f"the stock of {seq} is {filled['stock']}, not ~{n}")
    conn.send({"library": sqlalchemy_tickets.__file__, "filled": filled})
    conn.recv()  # worker 0 filled the stock
    tier = DatacenterTier(spec["dc"], upstream=upstream, **spec["tier"])
    tier.next_block(seq, count)
    before = tier.stats()
    conn.send("ready")
    latencies, blocks, errors = h.window(lambda: tier.next_block(seq, count), conn.recv(),
                                         spec["seconds"], TicketsError)
    after = tier.stats()
    stock = next(s for s in tier.describe() if s.sequence == seq).stock if filled else None
    tier.close()
    upstream.close()
    conn.send({"summary": {k: v if k == "count" else v * 1e3
                           for k, v in h.distribution(latencies).items()},
               "latencies_us": [round(x * 1e6) for x in latencies],
               "ids": [i for block in blocks for i in block],
               "errors": len(errors), "first_errors": errors[:3], "stock_after": stock,
               "stats": {k: after[k] - before[k] for k in STATS}})


def run(src: Path, urls: dict[str, str], p: int, seq: str, count: int,
        seconds: float) -> dict[str, Any]:
    """One run of P workers of one variant (fresh interpreters); its figures."""
    spec = {**urls, "sequence": seq, "stock": STOCK, "tier": TIER, "count": count,
            "seconds": seconds, "src": str(src)}
    with h.Fleet(worker, [{**spec, "index": i} for i in range(p)], grace=60) as workers:
        started = workers.hear()  # imported; worker 0 filled the stock
        libraries = sorted({s["library"] for s in started})
        if any(not lib.startswith(str(src) + os.sep) for lib in libraries):
            raise RuntimeError(f"workers imported {libraries}, not the tree at {src}")
        workers.tell("go")  # build the tiers, one untimed take each
        workers.go()  # the common start
        answers = workers.hear()
    ids = [i for a in answers for i in a["ids"]]
    pooled = h.distribution([x / 1e3 for a in answers for x in a["latencies_us"]])
    return {"sequence": seq, "takes": int(pooled["count"]),
            "takes_per_second": pooled["count"] / seconds, "latency_ms": pooled,
            "p50_ms": pooled.get("p50"), "p99_ms": pooled.get("p99"),
            "workers": [{**a["summary"], "errors": a["errors"], "first_errors": a["first_errors"]}
                        for a in answers],
            "errors": sum(a["errors"] for a in answers), "ids_handed_out": len(ids),
            "duplicates": len(ids) - len(set(ids)),
            **{k: sum(a["stats"][k] for a in answers) for k in STATS},
            "filled": started[0]["filled"], "stock_after": answers[0]["stock_after"],
            "library": libraries, "load_average_at_end": h.load()}


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant the medians over rounds; new / baseline as medians of per-round ratios."""
    out: dict[str, Any] = {v: {k: statistics.median(r[k] for r in runs[v]) for k in KEYS}
                           for v in VARIANTS}
    for key in ("takes_per_second", "p99_ms"):
        per = [n[key] / max(b[key], 1e-9)
               for n, b in zip(runs["new"], runs["baseline"], strict=True)]
        out[f"new_over_baseline_{key}"] = {
            "median": statistics.median(per), "per_round": per,
            "ratio_of_medians": out["new"][key] / max(out["baseline"][key], 1e-9)}
    return out


def draw(env: dict[str, Any], results: dict[str, Any], procs: list[int]) -> Any:
    fig, axes = h.figure(3, "Datacenter tier: takes of one sequence by P processes at once, "
                         "baseline vs new (medians over rounds)", env, width=4.6, left=0.06,
                         wspace=0.3, note="variants alternated, the first swapped each round")
    for ax, key, unit in zip(axes, KEYS, ("takes/s", "ms", "ms"), strict=True):
        h.line_panel(ax, {f"{h.LABELS[b]}, {v}": [(p, by_p[str(p)][v][key]) for p in procs]
                          for b, by_p in results.items() for v in VARIANTS},
                     key.replace("_", " "), unit, "worker processes P", base=2)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, {
        "--procs": dict(type=h.ints, default=None, help="worker counts (default 2,8,24)"),
        "--seconds": dict(type=float, default=None, help="window (default 10)"),
        "--count": dict(type=int, default=1, help="ids per take (default 1)"),
        "--baseline-ref": dict(default="18dfaeb", help="git ref of the baseline")},
        backends=("postgresql", "mysql"))
    procs = args.procs or ([2] if args.smoke else [2, 8, 24])
    seconds, rounds = args.seconds or (1.0 if args.smoke else 10.0), h.rounds(args, ROUNDS)
    results: dict[str, Any] = {}
    checks: dict[str, dict[str, Any]] = {}
    with h.source_tree(args.baseline_ref, missing_ok=args.smoke) as (baseline, commit):
        srcs = {"baseline": baseline, "new": h.REPO_DIR / "src"}
        for backend in args.backends:
            results[backend] = {}
            with contextlib.ExitStack() as stack:
                urls = {v: dict(zip(("global", "dc"), h.databases(stack, backend, backend),
                                    strict=True)) for v in VARIANTS}
                if not args.smoke:  # untimed: a fresh database's first seconds are slow
                    for v in VARIANTS:
                        run(srcs[v], urls[v], procs[0], "take_warmup", args.count, 2.0)
                for p in procs:
                    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
                    for r in range(rounds):
                        for v in VARIANTS[::-1] if r % 2 else VARIANTS:
                            got = run(srcs[v], urls[v], p, f"take_p{p}_r{r}", args.count, seconds)
                            runs[v].append(got)
                            h.log(f"  {backend} P={p} round {r + 1} {v}: " + ", ".join(
                                f"{k} {got[k]:.1f}" for k in (*KEYS, "errors", "duplicates")))
                    results[backend][str(p)] = got = {**compare(runs), "runs": runs}
                    per = [1 / x for x in got["new_over_baseline_takes_per_second"]["per_round"]]
                    checks[f"{backend} P={p}: time per take, new / baseline"] = {
                        **h.check(statistics.median(per), 1.0), "min": min(per), "max": max(per),
                        "per_round": per}
    every = [(f"{b} P={p} {v}", r) for b, by_p in results.items() for p, c in by_p.items()
             for v in VARIANTS for r in c["runs"][v]]
    waited = [n for n, r in every if r["blocking_waits"] or r["upstream_round_trips"]]
    duplicated = [n for n, r in every if r["duplicates"]]
    for label, names in (("waited or went upstream", waited), ("duplicates", duplicated)):
        if names:
            h.log(f"runs with {label}: {', '.join(names)}")
    status = h.report(
        args, NAME, results, checks=checks, figure=draw(args.env, results, procs),
        parameters={"procs": procs, "seconds": seconds, "count": args.count, "rounds": rounds,
                    "stock_per_sequence": STOCK, "worker_tier": TIER,
                    "baseline_ref": args.baseline_ref, "baseline_commit": commit,
                    "runs_that_waited_or_went_upstream": waited,
                    "runs_with_duplicates": duplicated})
    return 1 if duplicated else status


if __name__ == "__main__":
    raise SystemExit(main())
