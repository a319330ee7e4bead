"""A refused rewind through caches and datacenter tiers (CONTRACT §9): callers get
``RewindError`` before any id — at once, not ``TicketServerUnavailable`` after the timeout —
and the refusal is logged at WARNING once per rewind, not once per refill retry nor once per
layer it crosses (the retries say it at INFO).

Rewinds are real: the ticket table's row set back far below what was issued, or the database
restored from its dump (``pg_dump``/``mariadb-dump``, a replaced SQLite file). A process that
refused keeps refusing, without taking blocks, until an operator's ``sync`` moves the sequence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    RewindError,
    TicketServer,
    TicketServerUnavailable,
)
from support.cli import run
from support.rewinding import assert_distinct, put_back, set_back, snapshot

ALL = ("sqlite", "postgresql", "mysql")

#: Seconds a caller may wait for ids: a RewindError must come well within it.
TIMEOUT = 8.0
#: Refill retries to wait for before counting the WARNINGs.
RETRIES = 4
#: Seconds a wait for the retries may take before the test fails (back-offs 0.05, 0.1, ...).
DEADLINE = 30.0


def refusals(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sqlalchemy_tickets"
        and r.levelno == level
        and "went back in time" in r.getMessage()
    ]


def refused_at_once(source: Any) -> RewindError:
    """Draw from ``source`` until it refuses (the ids in hand first): the call that refuses
    raises ``RewindError`` well within the timeout, and so does the next one."""
    deadline = time.monotonic() + DEADLINE
    while True:
        assert time.monotonic() < deadline, "no RewindError"
        started = time.monotonic()
        try:
            source.next_id("photos")
        except RewindError:
            assert time.monotonic() - started < TIMEOUT / 4
            break
        except TicketServerUnavailable as error:  # the bug: the refusal waited out the timeout
            pytest.fail(f"TicketServerUnavailable instead of RewindError: {error}")
    started = time.monotonic()
    with pytest.raises(RewindError) as again:
        source.next_id("photos")
    assert time.monotonic() - started < TIMEOUT / 4
    return again.value


def retried(lane_failures: Callable[[], int]) -> None:
    """Wait until the refills were tried again :data:`RETRIES` times (a condition, polled)."""
    deadline = time.monotonic() + DEADLINE
    while lane_failures() < RETRIES:
        assert time.monotonic() < deadline, f"{lane_failures()} refill failures"
        time.sleep(0.02)


def cache_failures(cache: CachedSource) -> int:
    lanes = cache.stats()["sequences"]
    return int(lanes["photos/64"]["failures"]) if "photos/64" in lanes else 0


@pytest.mark.backend(*ALL)
def test_a_cache_over_a_refusing_server_raises_rewind_error_and_logs_it_once(
    backend: str, make_database: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    url = make_database(backend)
    server = TicketServer(url, on_rewind="refuse")
    cache = CachedSource(server, min_block=10, max_block=10, timeout=TIMEOUT, backoff=0.05)
    try:
        for _ in range(100_000 // 500):
            cache.next_block("photos", 500)  # far ahead of where the row goes back to
        set_back(url, 5)
        with caplog.at_level(logging.INFO, logger="sqlalchemy_tickets"):
            error = refused_at_once(cache)
            assert "sqlalchemy-tickets sync" in str(error)
            retried(lambda: cache_failures(cache))
        assert len(refusals(caplog)) == 1, refusals(caplog)
        assert len(refusals(caplog, logging.INFO)) >= RETRIES - 1
    finally:
        cache.close()
        server.close()


@pytest.mark.backend(*ALL)
def test_a_cache_over_a_tier_over_a_restored_server_refuses_at_once_and_logs_it_once(
    backend: str,
    make_database: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The global server restored under a fresh process: no floor to heal above. The tier's
    refill meets the refusal first; the cache above gets it from the tier: one WARNING."""
    url, dc = make_database(backend), make_database(backend)
    writer = TicketServer(url)
    writer.next_block("photos", 10)
    backup = snapshot(url, tmp_path / "backup")
    writer.next_block("photos", 100)
    writer.close()
    put_back(url, backup)

    server = TicketServer(url, on_rewind="refuse")
    tier = DatacenterTier(dc, server, timeout=TIMEOUT, backoff=0.05)
    cache = CachedSource(tier, timeout=TIMEOUT, backoff=0.05)
    try:
        with caplog.at_level(logging.INFO, logger="sqlalchemy_tickets"):
            refused_at_once(cache)
            retried(lambda: min(cache_failures(cache), int(tier.stats()["failures"])))
        assert len(refusals(caplog)) == 1, refusals(caplog)
    finally:
        cache.close()
        tier.close()
        server.close()


@pytest.mark.backend(*ALL)
def test_a_refusing_process_keeps_refusing_until_an_operator_syncs(
    backend: str, make_database: Callable[[str], str]
) -> None:
    """Two processes issued, in turns; the row is set back below both. The one that refuses
    knows only its own ids: each refusal used to burn a block, and once the burned blocks
    walked the sequence past its own highest id it issued again, unsynced, on the other's.
    Now it refuses without taking until an operator's ``sync --above`` moves the sequence."""
    url = make_database(backend)
    refusing = TicketServer(url, on_rewind="refuse")
    other = TicketServer(url)
    try:
        issued = []
        for _ in range(3):
            issued += list(refusing.next_block("photos", 10))
            issued += list(other.next_block("photos", 10))
        assert_distinct(issued)  # 1..60, the other's last block 51..60
        set_back(url, 10)
        for _ in range(20):  # 20 burned blocks of 10 would have reached 211
            with pytest.raises(RewindError):
                refusing.next_block("photos", 10)
        synced = run("sync", "--url", url, "--above", str(max(issued)), "photos")
        assert synced.returncode == 0, synced.stderr
        after = refusing.next_block("photos", 10)
        assert after.start > max(issued)
    finally:
        refusing.close()
        other.close()
