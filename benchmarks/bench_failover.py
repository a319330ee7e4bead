"""What callers see while PostgreSQL fails over on a libpq multi-host URL (three threads
uncached, three through a CachedSource): a replica promoted by hand, asynchronous (held back)
and synchronous, and Patroni's own failover over etcd (servers started here, ``tests/support``).
``--strict``: exit 1 if the synchronous failover was healed as a rewind. ``--smoke``: the
asynchronous one, little traffic.

    .venv/bin/python benchmarks/bench_failover.py [--smoke]
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

import _harness as h

import sqlalchemy_tickets as st

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from support.callers import Callers  # noqa: E402
from support.patroni import start_patroni_cluster  # noqa: E402
from support.rewind import postgresql_pair  # noqa: E402
from support.rewinding import assert_distinct  # noqa: E402


def measure(url: str, fail_over: Callable[..., float], blocks: int) -> dict[str, Any]:
    """What callers drawing ``blocks`` blocks per group before and after ``fail_over(more)``
    saw (it returns when the primary was killed; ``more()`` waits for a few more blocks)."""
    server = st.TicketServer(url, timeout=2.0)
    cache = st.CachedSource(st.TicketServer(url, timeout=2.0))
    with closing(server), closing(cache):
        server.next_block("photos", 1)  # the table made before traffic
        groups = {"uncached": Callers("uncached", server), "cached": Callers("cached", cache)}
        for group in groups.values():
            group.start()
        try:
            for group in groups.values():
                group.draws(blocks)
            killed_at = fail_over(lambda: groups["uncached"].draws(max(blocks // 4, 5)))
            for group in groups.values():
                group.cut_at(killed_at)
            for group in groups.values():
                group.draws(blocks)
        finally:
            for group in groups.values():
                group.stop()
        rewinds = server.stats()["rewinds"] + cache.stats()["rewinds"]
    ids = [i for group in groups.values() for i in group.ids]
    assert_distinct(ids)
    found: dict[str, Any] = {"rewinds_healed": rewinds, "ids": len(ids)}
    for name, group in groups.items():
        back = None if group.back_at is None else group.back_at - killed_at
        found[name] = {"errors": len(group.errors), "longest_without_ids_s": group.longest_without,
                       "longest_call_s": group.longest_call, "served_after_kill_s": back}
        h.log(f"  {name}: {found[name]}")
    return found


def by_hand(synchronous: bool, blocks: int) -> dict[str, Any]:
    """Scenarios 1 and 2: a primary and its streaming replica, promoted as soon as it is dead."""
    with postgresql_pair() as pair:
        if synchronous:
            pair.set_standbys("{}")

        def fail_over(more: Callable[[], None]) -> float:
            if not synchronous:
                pair.cut_replication()
                more()  # ids the replica will not have
            killed_at = pair.crash_primary()
            pair.promote()
            return killed_at

        return measure(pair.multi_host_url("tickets"), fail_over, blocks)


def patroni(blocks: int) -> dict[str, Any]:
    """Scenario 3: Patroni's own failover of an asynchronous replica held back first."""
    with tempfile.TemporaryDirectory(prefix="tickets-failover-") as path, \
            start_patroni_cluster(path) as cluster:
        cluster.create_database("tickets")

        def fail_over(more: Callable[[], None]) -> float:
            cluster.hold_replication()
            more()  # ids the replica will not have
            killed_at = cluster.kill_leader()
            cluster.wait_new_leader()
            return killed_at

        return measure(cluster.url("tickets"), fail_over, blocks)


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, axes = h.figure(2, "Callers during a PostgreSQL failover", env, note="one run each")
    for ax, key, unit in zip(axes, ("longest_without_ids_s", "errors"), ("s", ""), strict=True):
        h.value_panel(ax, {f"{scenario}, {group}": float(found[group][key] or 0)
                           for scenario, found in results.items()
                           for group in ("uncached", "cached")}, key.replace("_", " "), unit)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql",))
    blocks = 20 if args.smoke else 200
    scenarios = {"async, by hand": lambda: by_hand(False, blocks)}
    if not args.smoke:
        scenarios["sync, by hand"] = lambda: by_hand(True, blocks)
        scenarios["Patroni"] = lambda: patroni(blocks)
    results: dict[str, Any] = {}
    for name, run in scenarios.items():
        h.log(name)
        results[name] = run()
    checks = {"sync_failover_rewinds": h.check(float(results["sync, by hand"]["rewinds_healed"]),
                                               0.0)} if "sync, by hand" in results else {}
    return h.report(args, "bench_failover", results, figure=draw(args.env, results), checks=checks,
                    parameters={"blocks": blocks})


if __name__ == "__main__":
    raise SystemExit(main())
