"""Many processes using fresh sequences at the same moment: the tables are created on first use,
and every caller must get ids (none twice) however the creations interleave."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy_tickets import TicketServer
from support.processes import WORKERS

PROCESSES = 4
SEQUENCES = 24
ROUNDS = 8


def _first_use(url: str, rounds: list[list[str]], barrier: Any, queue: Any) -> None:
    """In a child: one thread per fresh sequence; every thread of every process waits at the
    barrier, then takes ids, so the first uses of each sequence collide across processes.
    Then the next round, with other fresh sequences."""
    server = TicketServer(url, timeout=20.0, pool_size=3)
    ids: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(k: int) -> None:
        for names in rounds:
            name = names[k]
            got: list[int] = []
            barrier.wait(timeout=120)
            try:
                got.append(server.next_id(name))
                got.extend(server.next_block(name, 3))
            except Exception as error:  # reported to the parent, which fails the test
                with lock:
                    errors.append(f"{name}: {type(error).__name__}: {error}")
            with lock:
                ids.extend(got)

    try:
        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(rounds[0]))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        queue.put((ids, errors))
        server.close()


def test_fresh_sequences_used_by_many_processes_at_once(
    make_database: Callable[[str], str], backend: str
) -> None:
    url = make_database(backend)
    rounds = [[f"fresh{r}_{k}" for k in range(SEQUENCES)] for r in range(ROUNDS)]
    names = [name for names in rounds for name in names]
    ctx = WORKERS
    barrier = ctx.Barrier(PROCESSES * SEQUENCES)
    queue = ctx.Queue()
    children = [
        ctx.Process(target=_first_use, args=(url, rounds, barrier, queue)) for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    errors = [e for _, errs in results for e in errs]
    assert errors == []
    # Per sequence: every process got its 4 ids, none twice, none skipped.
    per_sequence = PROCESSES * 4
    ids = [i for got, _ in results for i in got]
    assert sorted(ids) == sorted(list(range(1, per_sequence + 1)) * len(names))
    server = TicketServer(url)
    try:
        for name in names:
            info = server.describe(name)
            assert info is not None and info.last_id == per_sequence
    finally:
        # One statement per table: dropping the database with its hundreds of tables at once
        # can outlast the fixture's timeout on a busy MariaDB.
        with server.engine.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS tickets__{name}")
        server.close()
