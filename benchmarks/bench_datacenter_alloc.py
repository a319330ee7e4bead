"""Per-id cost of a warm ``CachedSource`` over a datacenter tier vs over a ticket server.

Two caches, in one process: ``CachedSource(DatacenterTier(<dc db>,
upstream=TicketServer(<global db>)))`` and ``CachedSource(TicketServer(<global db>))``, each
with ``waste_ratio=1.0`` (so a run's ids fit in what it holds) and primed with 300,000 ids
(untimed). Each timed run takes 40,000 ids;
before each cache run its refill in flight is awaited (untimed) and the blocking waits the run
caused are counted (expected 0), as in ``bench_alloc.py``, whose reference, ``uuid_utils.uuid7()``,
is timed in the same rounds. 51 rounds; medians of per-round ratios. **Target: over the tier /
over a server <= 1.1** (the hot path is the cache's own: the tier is only ever behind a refill).

    .venv/bin/python benchmarks/bench_datacenter_alloc.py [--smoke] [--backends postgresql]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import _common as h
import uuid_utils

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer

NAME, TARGET = "bench_datacenter_alloc", 1.1
TIER, SERVER, REF = "cache over DatacenterTier", "cache over TicketServer", "uuid_utils.uuid7"


def cache_variant(name: str, cache: CachedSource, n: int, waits: list[int]) -> h.Variant:
    def setup() -> None:
        cache.wait_idle(10.0)
        waits.append(-cache.stats()["blocking_waits"])

    def teardown(_: Any) -> None:
        waits[-1] += cache.stats()["blocking_waits"]

    return h.Variant(name, h.loop(cache.next_id, n, "bench"), setup, teardown, per=n)


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql",))
    backend = next((b for b in args.backends if b != "sqlite"), args.backends[0])
    n, primed, rounds = (
        (2_000, 20_000, h.rounds(args, 51)) if args.smoke else (40_000, 300_000, h.rounds(args, 51))
    )
    env = h.environment("uuid-utils")
    waits: dict[str, list[int]] = {TIER: [], SERVER: []}
    with h.throwaway_database(backend) as global_url, h.throwaway_database(backend) as dc_url:
        upstream = TicketServer(global_url)
        tier = DatacenterTier(dc_url, upstream=upstream)
        # waste_ratio=1: a run's 40,000 ids fit in what a cache holds, so the runs time the
        # hot path, not refills (at 300,000 ids issued the default 5 % would hold fewer).
        caches = {
            TIER: CachedSource(tier),
            SERVER: CachedSource(TicketServer(global_url)),
        }
        try:
            for cache in caches.values():
                h.loop(cache.next_id, primed, "bench")()  # teaches the rate, fills the blocks
            variants = [cache_variant(k, c, n, waits[k]) for k, c in caches.items()]
            variants.append(h.Variant(REF, h.loop(uuid_utils.uuid7, n), per=n))
            timings = h.interleave(variants, rounds)
            stats = {k: c.stats() for k, c in caches.items()}
            tier_stats = tier.stats()
        finally:
            for cache in caches.values():
                cache.close()
            tier.close()
            upstream.close()
            caches[SERVER].source.close()  # type: ignore[attr-defined]
    check = h.ratio_summary(timings, TIER, SERVER, TARGET)
    results = {
        "tier_over_server": check,
        "ratio_to_uuid_utils": {v: h.ratio_summary(timings, v, REF) for v in (TIER, SERVER)},
        "median_ns_per_id": {v: timings.median(v) * 1e9 for v in timings.seconds},
        "blocking_waits_during_timed_runs": {k: sum(v[1:]) for k, v in waits.items()},
        "cache_stats_at_end": stats,
        "tier_stats_at_end": {k: v for k, v in tier_stats.items() if k != "sequences"},
        **timings.to_json(),
    }
    fig, (ax,) = h.figure(1, f"Warm next_id: CachedSource over a datacenter tier ({backend})", env)
    h.ratio_panel(
        ax,
        {
            f"{TIER} / {SERVER}": check,
            **{f"{v} / {REF}": s for v, s in results["ratio_to_uuid_utils"].items()},
        },
        "time per id",
    )
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"ids_per_run": n, "primed": primed, "rounds": rounds},
        results=results,
        checks={f"{TIER} / {SERVER}": check},
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
