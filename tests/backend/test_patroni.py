"""A PostgreSQL ticket server failed over by Patroni itself, with writes lost: no id twice.

``test_sync_failover.py`` and ``test_rewind.py`` promote a replica themselves, at the moment
they choose. Here a real Patroni 3.0 cluster over etcd (``support.patroni``) decides: its
leader (Patroni and PostgreSQL) is SIGKILLed with callers drawing ids, the leader key expires
after its TTL, and the replica's Patroni promotes it. The replica is asynchronous (Patroni's
default) and held back before the kill, so the leader's last commits -- ids callers were given
-- never reach it: the promoted server starts below ids already in use, on a new timeline.

Callers reach the cluster as an application without a proxy does, through a libpq multi-host
URL wanting the read-write node: three threads through one :class:`TicketServer`, three
through a :class:`CachedSource` over another. The first running server to meet the new
timeline heals it (the sequence moved above what it issued, plus a margin; the other finds it
healed); callers see, at most, :class:`TicketServerUnavailable` while no node takes writes; a
process started afterwards issues above every id drawn. The figures printed (errors, longest
waits, time until traffic was back) are for the documentation to cite.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sqlalchemy_tickets import CachedSource, TicketServer, TicketServerUnavailable
from support.callers import THREADS, TRAFFIC_TIMEOUT, Callers, until
from support.patroni import (  # noqa: F401 - the fixture
    LOOP_WAIT,
    TTL,
    PatroniCluster,
    patroni_cluster,
)
from support.rewind import pg_connect
from support.rewinding import assert_distinct

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

#: Blocks the uncached callers draw before the replica is held back, while it is held back
#: (ids it never receives), and blocks each group draws once the new leader is up.
BEFORE = 100
HELD = 100
AFTER = 200


def _replica_state(cluster: PatroniCluster) -> tuple[bool, int]:
    """``(in recovery, the sequence's last id)`` as the replica has them."""
    assert cluster.replica is not None
    with pg_connect(cluster.replica.url("tickets")) as conn:
        row: Any = conn.execute(
            "SELECT pg_is_in_recovery(), (SELECT max(id) FROM tickets__photos)"
        ).fetchone()
    return bool(row[0]), int(row[1])


def test_a_failover_patroni_makes_by_itself_losing_writes_repeats_no_id(
    patroni_cluster: PatroniCluster,  # noqa: F811 - the fixture
) -> None:
    cluster = patroni_cluster
    cluster.create_database("tickets")
    url = cluster.url("tickets")
    server = TicketServer(url, timeout=2.0)
    cache = CachedSource(TicketServer(url, timeout=2.0))
    try:
        server.next_block("photos", 1)  # the table made, its identity recorded, before traffic
        uncached, cached = Callers("uncached", server), Callers("cached", cache)
        groups = (uncached, cached)
        for group in groups:
            group.start()
        try:
            uncached.draws(BEFORE)
            cached.draws(BEFORE)
            cluster.wait_caught_up()
            cluster.hold_replication()
            uncached.draws(HELD)  # committed on the leader alone: lost with it
            killed_at = cluster.kill_leader()
            issued = max(group.high for group in groups)
            # Nothing reaches the replica any more: what it has now is what Patroni promotes.
            in_recovery, kept = _replica_state(cluster)
            assert in_recovery, "promoted before the leader key's TTL ran out"
            assert kept < issued, f"the replica missed nothing ({kept} >= {issued})"
            for group in groups:
                group.cut_at(killed_at)
            new_leader = cluster.wait_new_leader()
            promoted = time.monotonic() - killed_at
            refills = cache.stats()["refills"]
            until(lambda: cache.stats()["refills"] > refills, TRAFFIC_TIMEOUT,
                   lambda: f"the cache took no block from the new leader: {cache.stats()!r}")
            refilled = time.monotonic() - killed_at
            uncached.draws(AFTER)
            cached.draws(AFTER)
        finally:
            for group in groups:
                group.stop()
        rewinds = {"uncached": server.stats()["rewinds"], "cached": cache.stats()["rewinds"]}
    finally:
        cache.close()
        server.close()

    ids = uncached.ids + cached.ids
    print(f"\nPatroni failover (ttl {TTL} s, loop_wait {LOOP_WAIT} s): the replica was "
          f"promoted {promoted:.2f} s after the leader was killed, on timeline "
          f"{new_leader.status().get('timeline')}; it had the sequence at {kept}, callers had "
          f"been given ids up to {issued}: {issued - kept} ids lost with the leader; rewinds "
          f"healed {rewinds}")
    print(f"  uncached ({THREADS} threads, one TicketServer): {uncached.figures(killed_at)}")
    print(f"  cached ({THREADS} threads, one CachedSource): {cached.figures(killed_at)}; its "
          f"first block from the new leader {refilled:.2f} s after the kill")
    assert_distinct(ids)
    unexpected = [e for group in groups for e in group.errors
                  if not isinstance(e, TicketServerUnavailable)]
    assert not unexpected, unexpected[:5]
    assert uncached.back_at is not None, "no uncached call made after the kill succeeded"
    # The new timeline was met by a server that knew what it issued: healed, not refused.
    assert sum(rewinds.values()) >= 1, rewinds

    fresh = TicketServer(url)
    try:
        after = fresh.next_block("photos", 10)
        assert after.start > max(ids), (after, max(ids))
    finally:
        fresh.close()
