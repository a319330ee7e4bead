"""What a cache promises beyond uniqueness: the restart bound (real processes, killed), the
share a short-lived process burns, and the order of ids mixing ``next_id`` and ``next_block``."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import CachedSource, TicketId, TicketServer, configure
from support.processes import WORKERS


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "rows"
    id: Mapped[int] = mapped_column(TicketId("rows"), primary_key=True)


def _insert(engine: sa.Engine, bursts: list[int]) -> int:
    """Insert ``sum(bursts)`` rows, one flush per burst; the highest id inserted."""
    highest = 0
    for size in bursts:
        with Session(engine) as session:
            rows = [Row() for _ in range(size)]
            session.add_all(rows)
            session.flush()
            highest = max(highest, max(r.id for r in rows))
            session.commit()
    return highest


def _cached_then_killed(url: str, options: dict[str, Any], queue: Any, stop: Any) -> None:
    """In a child: draw ids from a cache (singles and large blocks), report the highest, then
    wait to be killed with everything the cache holds."""
    cache = CachedSource(TicketServer(url), **options)
    rng = random.Random(7)
    highest = 0
    for i in range(400):
        if i % 3 == 0:
            block = cache.next_block("bound", rng.choice([1, 50, 3_000, 40_000]))
            highest = max(highest, block[-1])
        else:
            for _ in range(rng.choice([1, 100, 2_000])):
                highest = max(highest, cache.next_id("bound"))
    cache.wait_idle(10)  # a refill still in flight would be burned too: let it land first
    queue.put(highest)
    stop.wait(60)


@pytest.mark.parametrize(
    "options",
    [
        {"waste_budget": 1_000, "max_block": 100_000, "supply": 3600.0},
        {"waste_budget": 5_000, "max_block": 5_000},
        {"waste_budget": 300, "min_block": 200},
    ],
    ids=["max-block-above", "max-block-equal", "min-block-near"],
)
def test_a_killed_process_burns_at_most_the_waste_budget(
    make_database: Callable[[str], str], options: dict[str, Any]
) -> None:
    url = make_database("sqlite")
    ctx = WORKERS
    queue, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_cached_then_killed, args=(url, options, queue, stop))
    child.start()
    highest = queue.get(timeout=120)
    child.kill()  # SIGKILL: nothing is given back, everything held is burned
    child.join(30)
    server = TicketServer(url)
    try:
        after = server.next_id("bound")
    finally:
        server.close()
    burned = after - highest - 1
    assert 0 <= burned <= options["waste_budget"]


def _embedded_then_killed(url: str, bursts: list[int], queue: Any, stop: Any) -> None:
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    queue.put(_insert(engine, bursts))
    stop.wait(60)


def _embedded_once(url: str, queue: Any) -> None:
    engine = sa.create_engine(url)
    queue.put(_insert(engine, [1]))


@pytest.mark.backend("sqlite", "postgresql")
def test_a_restart_of_the_embedded_default_burns_at_most_ten_thousand(
    make_database: Callable[[str], str], backend: str
) -> None:
    """README: a restart burns never more than 10,000 ids per sequence, whatever was held."""
    url = make_database(backend)
    ctx = WORKERS
    queue, stop = ctx.Queue(), ctx.Event()
    # Quick large flushes: the rate estimate (and, before, the block size) shoots up.
    child = ctx.Process(
        target=_embedded_then_killed, args=(url, [1, 8_000, 8_000, 1, 4_000], queue, stop)
    )
    child.start()
    last = queue.get(timeout=300)
    child.kill()
    child.join(30)
    # A queue of its own: the killed child may have died holding the first one's write lock.
    queue = ctx.Queue()
    child = ctx.Process(target=_embedded_once, args=(url, queue))
    child.start()
    after = queue.get(timeout=120)
    child.join(30)
    assert 0 <= after - last - 1 <= 10_000


def _short_lived(url: str, ticket_url: str, bursts: list[int], queue: Any) -> None:
    """A cron job: ids from a dedicated ticket server (``configure(url)``), rows inserted in
    bursts, then a normal exit (which gives what the cache held back to the server)."""
    configure(ticket_url)
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        first = Row()
        session.add(first)
        session.flush()
        lowest = first.id
        session.commit()
    queue.put((lowest, _insert(engine, bursts)))


def test_short_lived_processes_burn_a_small_share_of_what_they_use(
    make_database: Callable[[str], str], backend: str
) -> None:
    """Three processes in a row, each inserting 30,000 rows in bursts: each exit burns at most
    10 % of what the process inserted (before: a burst drove blocks to ``max_block``)."""
    url, ticket_url = make_database("sqlite"), make_database(backend)
    ctx = WORKERS
    queue = ctx.Queue()
    bursts = [50, 2_000, 10_000, 100, 7_849, 10_000]  # + 1 row first: 30,000 rows
    spans = []
    for _ in range(3):
        child = ctx.Process(target=_short_lived, args=(url, ticket_url, bursts, queue))
        child.start()
        spans.append(queue.get(timeout=300))
        child.join(60)
        assert child.exitcode == 0
    for (_, last), (next_first, _) in zip(spans, spans[1:], strict=False):
        assert next_first - last - 1 <= 3_000, spans


def _mixed(cache: CachedSource, rng: random.Random, calls: int) -> list[int]:
    got: list[int] = []
    for _ in range(calls):
        if rng.random() < 0.3:
            got.extend(cache.next_block("mixed", rng.choice([1, 2, 7, 64, 500])))
        else:
            got.append(cache.next_id("mixed"))
    return got


def test_ids_from_one_cache_increase_across_next_id_and_next_block(
    make_database: Callable[[str], str], backend: str
) -> None:
    server = TicketServer(make_database(backend))
    cache = CachedSource(server)
    try:
        alone = _mixed(cache, random.Random(1), 5_000)
        assert all(a < b for a, b in zip(alone, alone[1:], strict=False))
        # Four threads at once: each sees its own ids increase; no id is seen twice.
        seen: list[list[int]] = [[] for _ in range(4)]
        threads = [
            threading.Thread(
                target=lambda k=k: seen[k].extend(_mixed(cache, random.Random(k), 3_000))
            )
            for k in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for mine in seen:
            assert all(a < b for a, b in zip(mine, mine[1:], strict=False))
        every = alone + [i for mine in seen for i in mine]
        assert len(every) == len(set(every))
    finally:
        cache.close()
        server.close()
