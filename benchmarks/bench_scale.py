"""Many sequences in one process: threads, memory, first contact, per-id cost, blocking waits and
close, for S sequences.

Per S and layout (``server``: ``CachedSource(TicketServer)``; ``tier``: over a
``DatacenterTier``), a forked process on fresh databases. Goals at the largest S: <= 8 threads,
<= 20 KB RSS per sequence, first contact (``prepare`` and each first id) <= 5 s, warm ``next_id``
round robin over S / one sequence <= 1.5 with 0 blocking waits, ``close()`` <= 1 s.

    .venv/bin/python benchmarks/bench_scale.py [--smoke] [--sizes 10,100,1000,5000]
        [--layouts server,tier] [--lazy 100] [--rounds 7] [--backends postgresql]
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import _harness as h

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer

NAME, ROUNDS, PER_LANE, WARM_RUNS, PRIME = "bench_scale", 7, 8, 40, 200_000
LAYOUTS = {"server": "CachedSource(TicketServer(url))",
           "tier": "CachedSource(DatacenterTier(dc_url, TicketServer(global_url)))"}
ONE, RR, WARM = "one sequence", "round robin over S", "warm"
OPTIONS = {"timeout": h.SETUP_TIMEOUT}
PANELS = {  # figure -> (title, unit, goal at the largest S)
    "threads": ("threads the library started", "threads", 8),
    "rss_kb_per_sequence": ("RSS growth per sequence", "KB", 20.0),
    "first_contact_seconds": ("prepare + first id of every sequence", "s", 5.0),
    "round_robin_over_one": ("warm next_id: round robin over S / one sequence", "×", 1.5),
    "blocking_waits_per_1000_ids": ("blocking waits per 1,000 ids, round robin", "waits", 0.0),
    "close_seconds": ("CachedSource.close() over S lanes", "s", 1.0),
}


def memory(*sources: Any) -> dict[str, int]:
    """This process's ``VmRSS`` and ``VmSize`` in KB, ``sources`` idle, the garbage collected."""
    for source in filter(None, sources):
        source.wait_idle(30.0)
    gc.collect()
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmSize")}


def library_threads(before: set[int]) -> dict[str, int]:
    """The threads started since ``before``, counted by name (numbers masked)."""
    return dict(Counter(re.sub(r"_\d+$", "_<n>", t.name) for t in threading.enumerate()
                        if t.ident not in before))


def measure(spec: dict[str, Any], conn: Any) -> None:
    """One case, in a process of its own; its figures sent on ``conn``."""
    label = f"{spec['backend']}/{spec['layout']}/S={spec['sequences']}: "
    names = [f"{spec['prefix']}{i:05d}" for i in range(spec["sequences"])]
    lazy = [f"{spec['prefix']}lazy{i:04d}" for i in range(spec["lazy"])]
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    server = TicketServer(spec["global_url"], **OPTIONS)
    out: dict[str, Any] = {"layout": LAYOUTS[spec["layout"]],
                           "create_tables_seconds": h.timed(server.create_tables, names)[0]}
    tier = spec["dc_url"] and DatacenterTier(spec["dc_url"], upstream=server, **OPTIONS)
    cache = CachedSource(tier or server, **OPTIONS)
    try:
        h.loop(cache.next_id, spec["prime"], spec["prefix"] + WARM)()
        mem0, waits = memory(cache, tier), cache.stats()["blocking_waits"]
        h.log(f"  {label}first contact")
        prepared = h.timed(cache.prepare, names)[0]
        contact = prepared + h.timed(lambda: [cache.next_id(name) for name in names])[0]
        first_waits = cache.stats()["blocking_waits"] - waits
        mem1, s = memory(cache, tier), len(names)
        out.update(sequences=s, prepare_seconds=prepared, first_contact_seconds=contact,
                   first_contact_blocking_waits=first_waits,
                   threads_by_name=library_threads(before),
                   rss_kb_per_sequence=(mem1["VmRSS"] - mem0["VmRSS"]) / max(1, s),
                   vmsize_kb_per_sequence=(mem1["VmSize"] - mem0["VmSize"]) / max(1, s))
        out["threads"] = sum(out["threads_by_name"].values())
        out["lazy_first_contact_per_sequence"] = h.distribution(
            [h.timed(cache.next_id, name)[0] for name in lazy])
        h.log(f"  {label}prepare + first ids {contact:.2f} s ({prepared:.2f} s prepare), "
              f"{out['threads']} threads, {out['rss_kb_per_sequence']:.1f} KB per sequence")
        n = max(spec["ids_per_run"], PER_LANE * s)
        for _ in range(WARM_RUNS * math.ceil(n / s)):  # warm, as the one sequence is
            for name in names:
                cache.next_id(name)
        lists = {RR: (names * math.ceil(n / s))[:n], ONE: [spec["prefix"] + WARM] * n}
        counts: dict[str, dict[str, list[int]]] = {v: {"blocking_waits": [], "round_trips": []}
                                                   for v in lists}

        def variant(which: str) -> h.Variant:
            def run(_: Any = None) -> None:
                next_id = cache.next_id
                for name in lists[which]:
                    next_id(name)

            plain = h.Variant(which, run, per=n)
            for key, into in counts[which].items():
                plain = h.watched(plain, cache, into, key)
            return plain

        timings = h.interleave([variant(RR), variant(ONE)], spec["rounds"], label=label)
        ratio = h.ratio_summary(timings, RR, ONE)
        per_1000 = {v: {k: sum(x[1:]) * 1000 / (n * spec["rounds"]) for k, x in c.items()}
                    for v, c in counts.items()}  # the warm-up round's left out
        out["warm"] = {"ids_per_run": n, "ratio": ratio, "per_1000_ids": per_1000,
                       **timings.to_json("median_ns_per_id", 1e9)}
        out["round_robin_over_one"] = ratio["median"]
        out["blocking_waits_per_1000_ids"] = per_1000[RR]["blocking_waits"]
        cache.wait_idle(30.0)
        held = cache.stats()
        out["close_seconds"], burned = h.timed(cache.close)
        out["close"] = {"lanes": len(held["sequences"]), "held": held["in_hand"],
                        "given_back": cache.stats()["given_back"] - held["given_back"],
                        "burned": burned}
    finally:
        cache.close()
        if tier:
            tier.close()
        server.close()
    deadline = time.monotonic() + 10.0  # threads end once they see the close
    while set(library_threads(before)) - {"sqlalchemy-tickets-watchdog"} and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    out["threads_after_close"] = library_threads(before)
    h.log(f"  {label}close {out['close_seconds']:.2f} s, left: {out['threads_after_close']}")
    conn.send(out)


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`measure` in a forked process of its own (the parent holds no thread, none of the
    library's objects), given 30 minutes; a case that failed is recorded, and the run goes on."""
    with h.Fleet(measure, [spec], method="fork", grace=30) as fleet:
        try:
            result: dict[str, Any] = fleet.hear(timeout=1800)[0]
        except RuntimeError as error:
            h.log(f"  FAILED: {error}")
            result = {"error": str(error)}
    return result


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, axes = h.figure(6, "Many sequences in one process, by S (a process per point)", env,
                         width=4.0, left=0.04, wspace=0.35)
    for ax, (key, (title, unit, goal)) in zip(axes, PANELS.items(), strict=True):
        h.line_panel(ax, {f"{h.LABELS[b]}: {layout}": [(int(s), float(row[key])) for s, row in
                                                        rows.items() if "error" not in row]
                          for b, layouts in results.items() for layout, rows in layouts.items()},
                     title, unit, "sequences S", goal=goal)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, {
        "--sizes": dict(type=h.ints, default=None, help="numbers of sequences, comma-separated"),
        "--layouts": dict(default="server,tier", help="server,tier"),
        "--lazy": dict(type=int, default=None, help="fresh sequences whose first id is taken "
                       "one at a time")}, backends=("postgresql",))
    sizes = args.sizes or ([10, 50] if args.smoke else [10, 100, 1000, 5000])
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or not layouts or set(layouts) - set(LAYOUTS):
        raise SystemExit("--sizes takes positive numbers, --layouts names from server,tier")
    n = 1_000 if args.smoke else 20_000
    lazy = args.lazy if args.lazy is not None else (5 if args.smoke else 100)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for backend in args.backends:
        results[backend] = {layout: {} for layout in layouts}
        for s in sizes:
            for layout in layouts:
                h.log(f"{backend}, {layout}, S = {s}")
                with contextlib.ExitStack() as stack:
                    url, dc = h.databases(stack, backend, backend)
                    spec = {"backend": backend, "layout": layout, "sequences": s,
                            "prefix": f"{layout[0]}{s}_", "lazy": lazy, "global_url": url,
                            "dc_url": dc if layout == "tier" else None, "ids_per_run": n,
                            "prime": n if args.smoke else PRIME, "rounds": h.rounds(args, ROUNDS)}
                    results[backend][layout][str(s)] = run_case(spec)
    failed = [f"{b} {lay} S={s}: {row['error']}" for b, ls in results.items()
              for lay, rows in ls.items() for s, row in rows.items() if "error" in row]
    checks = {}
    for backend, layouts_ in results.items():
        for layout, rows in layouts_.items():
            done = {int(s): row for s, row in rows.items() if "error" not in row}
            for key, (_, _, goal) in PANELS.items() if done else ():
                checks[f"{backend} {layout} S={max(done)}: {key}"] = h.check(
                    float(done[max(done)][key]), goal)
    status = h.report(
        args, NAME, {**results, "failed_cases": failed}, checks=checks,
        figure=draw(args.env, results),
        parameters={"sizes": sizes, "layouts": {k: LAYOUTS[k] for k in layouts},
                    "source_options": OPTIONS, "ids_per_run": f"max({n}, {PER_LANE} x S)",
                    "lazy_sequences": lazy, "warm_sequence_primed_with": n if args.smoke
                    else PRIME, "rounds": h.rounds(args, ROUNDS), "goals_at_largest_s":
                    {k: v[2] for k, v in PANELS.items()},
                    "run_seconds": time.perf_counter() - started})
    return 1 if failed else status


if __name__ == "__main__":
    raise SystemExit(main())
