"""A DatacenterTier over Flickr's odd/even pair: its stock holds interleaved ranges of both
parities, and ids given back are compared id by id, not by the interval they span."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer, TicketServers

STEADY = {"supply": 0.001, "min_block": 100, "timeout": 5.0}


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
                cache = CachedSource(tier, min_block=7, max_block=40)
                ids = [cache.next_id("photos") for _ in range(150)]
                assert len(set(ids)) == 150
                assert cache.wait_idle(10)
                assert cache.close() == 0
                assert cache.stats()["burned"] == 0
    finally:
        pair.close()
