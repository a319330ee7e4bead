"""What callers see while a PostgreSQL ticket server fails over: three threads through an
uncached ``TicketServer`` (``timeout`` 2 s) and three through a ``CachedSource`` over one, on a
libpq multi-host URL, one call each every 2 ms, when the primary is SIGKILLed and (1) its
asynchronous replica, held back first, is promoted at once by hand, (2) its synchronous
standby is, (3) Patroni promotes its replica by itself (``ttl`` 10 s, ``loop_wait`` 1 s; the
servers started here from the installed binaries, ``tests/support``). For each: the errors
callers got, the longest a thread went without ids, when the first call made after the kill was
served, and the rewinds healed (none is expected after a synchronous failover). Every id is
checked distinct. ``--smoke``: scenario 1 only, little traffic.

    .venv/bin/python benchmarks/bench_failover.py [--smoke]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import _harness as h

import sqlalchemy_tickets as st

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from support.callers import Callers  # noqa: E402
from support.patroni import start_patroni_cluster  # noqa: E402
from support.rewind import pg_connect, start_postgresql_pair  # noqa: E402

NAME = "bench_failover"


@contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tickets-failover-"))
    shutil.chown(path, "postgres", "postgres")  # the servers run as postgres
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def measure(url: str, fail_over: Callable[[Callable[[], None]], float],
            blocks: int) -> dict[str, Any]:
    """Callers drawing ``blocks`` blocks per group before and after ``fail_over(more)``
    (``more()``: until the uncached callers drew a few more blocks; it returns when the primary
    was killed, on the monotonic clock): what each group saw."""
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
                with group.lock:
                    group.cut = killed_at
            for group in groups.values():
                group.draws(blocks)
        finally:
            for group in groups.values():
                group.stop()
        rewinds = server.stats()["rewinds"] + cache.stats()["rewinds"]
    ids = [i for group in groups.values() for i in group.ids]
    if len(ids) != len(set(ids)):
        raise SystemExit("an id was drawn twice")
    found: dict[str, Any] = {"rewinds_healed": rewinds, "ids": len(ids)}
    for name, group in groups.items():
        back = None if group.back_at is None else group.back_at - killed_at
        found[name] = {"errors": len(group.errors), "longest_without_ids_s": group.longest_without,
                       "longest_call_s": group.longest_call, "served_after_kill_s": back}
        h.log(f"  {name:<8} {len(group.errors):6,} errors, longest without ids "
              f"{group.longest_without:6.2f} s, first call after the kill served after "
              f"{back if back is None else round(back, 2)} s")
    return found


def by_hand(synchronous: bool, blocks: int) -> dict[str, Any]:
    """Scenarios 1 and 2: a primary and its streaming replica, promoted as soon as it is dead."""
    with workdir() as path, start_postgresql_pair(path) as pair:
        pair.wait_streaming()
        with pg_connect(pair.primary.url) as conn:
            conn.execute("CREATE DATABASE tickets")
        if synchronous:
            pair.set_standbys("{}")
        url = ("postgresql+psycopg://postgres@/tickets?host=127.0.0.1:"
               f"{pair.primary.port}&host=127.0.0.1:{pair.replica.port}"
               "&target_session_attrs=read-write")

        def fail_over(more: Callable[[], None]) -> float:
            if not synchronous:
                pair.cut_replication()
                more()  # ids the replica will not have
            pair.crash_primary()
            killed_at = time.monotonic()
            pair.promote()
            return killed_at

        return measure(url, fail_over, blocks)


def patroni(blocks: int) -> dict[str, Any]:
    """Scenario 3: Patroni's own failover of an asynchronous replica held back first."""
    with workdir() as path, closing(start_patroni_cluster(path)) as cluster:
        cluster.create_database("tickets")

        def fail_over(more: Callable[[], None]) -> float:
            cluster.wait_caught_up()
            cluster.hold_replication()
            more()  # ids the replica will not have
            killed_at = cluster.kill_leader()
            cluster.wait_new_leader()
            return killed_at

        return measure(cluster.url("tickets"), fail_over, blocks)


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, axes = h.figure(2, "Callers during a PostgreSQL failover", env, note="one run each",
                         width=5.5, height=3.5)
    for ax, key, title in ((axes[0], "longest_without_ids_s", "longest without ids"),
                           (axes[1], "errors", "errors")):
        h.value_panel(ax, {f"{scenario}, {group}": float(found[group][key] or 0)
                           for scenario, found in results.items()
                           for group in ("uncached", "cached")},
                      title, "s" if key.endswith("_s") else "")
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql",))
    blocks = 20 if args.smoke else 200
    h.log("1: asynchronous replica promoted by hand")
    results = {"async, by hand": by_hand(False, blocks)}
    if not args.smoke:
        h.log("2: synchronous standby promoted by hand")
        results["sync, by hand"] = by_hand(True, blocks)
        h.log("3: Patroni")
        results["Patroni"] = patroni(blocks)
    checks = {}
    if "sync, by hand" in results:
        checks["sync_failover_rewinds"] = h.check(
            float(results["sync, by hand"]["rewinds_healed"]), 0.0)
    return h.report(args, NAME, results, figure=draw(args.env, results), checks=checks,
                    parameters={"blocks": blocks})


if __name__ == "__main__":
    sys.exit(main())
