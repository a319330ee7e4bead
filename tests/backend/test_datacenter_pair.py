"""A DatacenterTier over Flickr's odd/even pair: its stock holds interleaved ranges of both
parities, and ids given back are compared id by id, not by the interval they span."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketId, TicketServer, TicketServers

STEADY = {"supply": 0.001, "min_block": 100, "timeout": 5.0}
#: A cache's wait for its first block: the tier's and the pair's first contacts (tables made)
#: on a loaded machine can take longer than the default 2 s, and nothing here tests timeouts.
FIRST_BLOCK_TIMEOUT = 30.0


def _pair(backend: str, make_database: Callable[[str], str]) -> TicketServers:
    return TicketServers(
        [
            TicketServer(make_database(backend), stride=(2, 1)),
            TicketServer(make_database(backend), stride=(2, 2)),
        ]
    )


def test_interleaved_ranges_are_taken_back(
    backend: str, database_url: str, make_database: Callable[[str], str]
) -> None:
    pair = _pair(backend, make_database)
    try:
        with DatacenterTier(database_url, pair, **STEADY) as tier:
            blocks = []
            while {b.start % 2 for b in blocks} != {0, 1}:  # both servers' ids drawn
                blocks.append(tier.next_block("photos", 10))
                assert len(blocks) < 100
            blocks.append(tier.next_block("photos", 10))
            assert tier.wait_idle(10)
            drawn = [i for b in blocks for i in b]
            assert len(set(drawn)) == len(drawn)
            # The stock now holds the rest of both parities' ranges: every block given back
            # spans an interval that the other parity's ranges also span.
            taken = sum(tier.give_back("photos", b) for b in reversed(blocks))
            assert taken == len(drawn)
            assert sum(tier.give_back("photos", b) for b in blocks) == 0  # twice: refused
            again = []
            while len(again) < len(drawn):
                again.extend(tier.next_block("photos", len(drawn) - len(again)))
            assert sorted(again) == sorted(drawn)  # given back: out first, each once
    finally:
        pair.close()


def test_a_cache_over_a_tier_over_a_pair_closes_burning_nothing(
    backend: str, database_url: str, make_database: Callable[[str], str]
) -> None:
    pair = _pair(backend, make_database)
    try:
        with DatacenterTier(database_url, pair, **STEADY) as tier:
            for _ in range(3):  # several processes' caches, one after another
                cache = CachedSource(tier, min_block=7, max_block=40, timeout=FIRST_BLOCK_TIMEOUT)
                ids = [cache.next_id("photos") for _ in range(150)]
                assert len(set(ids)) == 150
                assert cache.wait_idle(10)
                assert cache.close() == 0
                assert cache.stats()["burned"] == 0
    finally:
        pair.close()


def test_a_first_flush_behind_the_server_ahead_keeps_the_other_lanes_stock(
    backend: str, database_url: str, make_database: Callable[[str], str]
) -> None:
    """The servers of a pair drift apart: a table's largest key is the server ahead's. A
    fresh process's first insert tells its cache and tier that key; the ids they hold of the
    server behind are below it, yet nobody else's: they stay (before, the cache and the tier
    dropped them as in use, emptying a stock that an outage of the pair then could not
    refill)."""
    odd, even = make_database(backend), make_database(backend)
    pair = TicketServers([TicketServer(odd, stride=(2, 1)), TicketServer(even, stride=(2, 2))])
    app = sa.create_engine(make_database(backend))
    try:
        with DatacenterTier(database_url, pair, **STEADY) as tier:
            tier.prepare(["photos"])
            # The odd server far ahead (another datacenter drew much from it), and a row of
            # its in the table.
            ahead = TicketServer(odd, stride=(2, 1))
            ahead.next_block("photos", 5001)
            key = ahead.next_id("photos")
            ahead.close()
            while {tier.next_block("photos", 10).start % 2 for _ in range(4)} != {0, 1}:
                pass  # the stock holds ranges of both servers
            assert tier.wait_idle(10)
            before = {s.sequence: s.stock for s in tier.describe()}["photos"]
            cache = CachedSource(tier, min_block=7, max_block=40, timeout=FIRST_BLOCK_TIMEOUT)
            photos = sa.Table("photos", sa.MetaData(),
                              sa.Column("id", TicketId("photos", source=cache), primary_key=True),
                              sa.Column("title", sa.String(20)))
            photos.create(app)
            with app.begin() as conn:
                conn.execute(photos.insert(), [{"id": key, "title": "ahead"}])
            with app.begin() as conn:
                conn.execute(photos.insert(), [{"title": "new"} for _ in range(3)])
            with app.connect() as conn:
                ids = conn.execute(sa.select(photos.c.id)).scalars().all()
            assert len(set(ids)) == 4
            assert cache.stats()["burned"] == 0
            assert tier.stats()["burned"] == 0
            after = {s.sequence: s.stock for s in tier.describe()}["photos"]
            assert before - after <= cache.stats()["in_hand"] + 3 + 2 * STEADY["min_block"]
            cache.close()
    finally:
        app.dispose()
        pair.close()
