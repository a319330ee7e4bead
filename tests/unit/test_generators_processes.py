"""Every generator, 4 processes x 8 threads: no id is ever issued twice, and each thread's
ids increase (real processes, started with ``spawn``; threads released together)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading
from itertools import pairwise
from typing import Any

import pytest

PROCESSES = 4
THREADS = 8
PER_THREAD = 10_000


def _generator(kind: str, process: int) -> Any:
    from sqlalchemy_tickets.generators import (
        ObjectIdGenerator,
        PrefixedIdGenerator,
        SnowflakeGenerator,
        uuid7,
    )

    if kind == "snowflake":
        return SnowflakeGenerator(process).new_id  # one worker id per process
    if kind == "uuid7":
        return lambda: uuid7().int
    if kind == "prefixed-ulid":
        return PrefixedIdGenerator("post").new_id
    if kind == "prefixed-typeid":
        return PrefixedIdGenerator("post", format="typeid").new_id
    if kind == "objectid":
        return ObjectIdGenerator().new_id
    raise AssertionError(kind)


def _run(kind: str, process: int) -> list[list[Any]]:
    new_id = _generator(kind, process)
    barrier = threading.Barrier(THREADS)
    out: list[list[Any]] = [[] for _ in range(THREADS)]

    def work(k: int) -> None:
        barrier.wait()
        out[k] = [new_id() for _ in range(PER_THREAD)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize(
    "kind", ["snowflake", "uuid7", "prefixed-ulid", "prefixed-typeid", "objectid"]
)
def test_four_processes_by_eight_threads(kind: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(PROCESSES, mp_context=ctx) as pool:
        results = list(pool.map(_run, [kind] * PROCESSES, range(PROCESSES)))
    chunks = [chunk for process in results for chunk in process]
    assert len(chunks) == PROCESSES * THREADS
    if kind != "objectid":  # ObjectId's counter is per process but wraps; order is per second
        for chunk in chunks:
            assert all(a < b for a, b in pairwise(chunk))
    flat = [value for chunk in chunks for value in chunk]
    assert len(flat) == PROCESSES * THREADS * PER_THREAD
    assert len(set(flat)) == len(flat)
