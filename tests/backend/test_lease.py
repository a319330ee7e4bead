"""Worker-id leases on every backend: exclusivity, expiry and recycling with real processes
(one SIGKILLed), renewal, loss, refusal when the clock is behind a worker's past."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.generators import (
    SnowflakeGenerator,
    SnowflakeLayout,
    WorkerLease,
    lease_table,
    lease_table_statements,
)
from support.processes import WORKERS

LAYOUT = SnowflakeLayout(41, 2, 12)  # four worker ids
ONE_WORKER = SnowflakeLayout(41, 0, 12)  # a single worker id: every holder wants id 0


def _ns() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _until(deadline_s: float, attempt: Callable[[], Any], what: str) -> Any:
    """Poll ``attempt`` until it returns something other than None (or stops raising
    TicketsError); fail after ``deadline_s`` seconds."""
    deadline = time.monotonic() + deadline_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = attempt()
        except TicketsError as error:
            last = error
        else:
            if result is not None:
                return result
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {deadline_s} s (last error: {last})")


def test_ids_are_exclusive_and_a_released_id_comes_back_with_its_past(database_url: str) -> None:
    lease = WorkerLease(database_url, namespace=_ns())
    first, second = lease.acquire(4), lease.acquire(4)
    assert first.worker_id != second.worker_id
    assert {first.worker_id, second.worker_id} == {0, 1}
    assert lease.renew(first, 1234)
    lease.release(first, 1234)
    again = lease.acquire(4)
    assert again.worker_id == first.worker_id  # a free existing row before a new one
    assert again.issued_until_ms == 1234
    assert not lease.renew(first, 99)  # the old token no longer holds it
    lease.close()


def test_all_ids_held_is_an_error(database_url: str) -> None:
    lease = WorkerLease(database_url, namespace=_ns())
    lease.acquire(2), lease.acquire(2)
    with pytest.raises(TicketsError, match="all 2 worker ids"):
        lease.acquire(2)
    lease.close()


def test_an_unrenewed_lease_expires_and_is_taken_over(database_url: str) -> None:
    ns = _ns()
    # A lifetime long enough that the taker's first attempt (its first connection included)
    # lands inside it even on a loaded machine.
    holder = WorkerLease(database_url, namespace=ns, ttl=3.0)
    taker = WorkerLease(database_url, namespace=ns, ttl=3.0)
    grant = holder.acquire(1)
    start = time.monotonic()
    with pytest.raises(TicketsError, match="all 1 worker ids"):
        taker.acquire(1)
    taken = _until(20, lambda: taker.acquire(1), "take-over after expiry")
    assert taken.worker_id == grant.worker_id
    assert time.monotonic() - start > 2.0
    assert not holder.renew(grant, 0)  # the old holder learns it lost the id
    holder.close()
    taker.close()


def test_heartbeat_keeps_the_lease_and_a_stolen_lease_is_noticed(database_url: str) -> None:
    ns = _ns()
    lease = WorkerLease(database_url, namespace=ns, ttl=1.0)
    gen = SnowflakeGenerator(lease=lease, layout=ONE_WORKER)
    gen.new_id()
    assert gen.worker_id == 0
    other = WorkerLease(database_url, namespace=ns, ttl=1.0)
    # For three lease lifetimes nobody else can take it: the heartbeat renews it.
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        with pytest.raises(TicketsError, match="all 1 worker ids"):
            other.acquire(1)
        time.sleep(0.2)
    assert gen.new_id() > 0
    # Someone takes the row from under it: the next heartbeat notices and the generator
    # stops using worker 0.
    table = lease.table
    with lease.engine.connect() as conn:
        conn.execute(
            sa.update(table).where(table.c.namespace == ns).values(holder="thief", owner="test")
        )
    _until(5, lambda: True if gen.worker_id is None else None, "loss detection")
    with pytest.raises(TicketsError, match="all 1 worker ids"):
        gen.new_id()  # tries to lease again; the thief holds the only id
    gen.close()
    lease.close()
    other.close()


def test_a_worker_whose_clock_is_behind_its_own_past_refuses(database_url: str) -> None:
    ns = _ns()
    ten_minutes = 600 * 10**9

    def ahead() -> int:
        return time.time_ns() + ten_minutes

    fast = SnowflakeGenerator(
        lease=WorkerLease(database_url, namespace=ns), layout=ONE_WORKER, time_ns=ahead
    )
    issued = [fast.new_id() for _ in range(5)]
    fast.close()  # gives worker 0 back, recording the last timestamp it used
    restarted = SnowflakeGenerator(lease=WorkerLease(database_url, namespace=ns), layout=ONE_WORKER)
    with pytest.raises(TicketsError, match="ahead of this machine's clock"):
        restarted.new_id()
    assert restarted.worker_id is None
    # A process whose clock is right (here: as far ahead as the first) may use the id again,
    # and its ids are above everything issued before.
    fixed = SnowflakeGenerator(
        lease=WorkerLease(database_url, namespace=ns), layout=ONE_WORKER, time_ns=ahead
    )
    later = fixed.new_id()
    assert later > max(issued) and fixed.worker_id == 0
    fixed.close()


def test_a_generator_stops_when_its_lease_cannot_be_renewed(database_url: str) -> None:
    now = [time.time_ns()]
    lease = WorkerLease(database_url, namespace=_ns(), ttl=2.0, heartbeat=1.5)
    gen = SnowflakeGenerator(lease=lease, layout=ONE_WORKER, time_ns=lambda: now[0])
    gen.new_id()
    with lease.engine.connect() as conn:  # the lease database "goes away"
        for statement in [sa.schema.DropTable(lease.table)]:
            conn.execute(statement)
    now[0] += 1_000_000_000  # within the lease: still fine
    gen.new_id()
    now[0] += 2_000_000_000  # past what the last renewal covered
    with pytest.raises(TicketsError, match="could not be renewed"):
        gen.new_id()
    gen.close()
    lease.close()


def test_lease_table_ddl_for_alembic() -> None:
    table = lease_table(sa.MetaData())
    assert [c.name for c in table.primary_key] == ["namespace", "worker_id"]
    for dialect in ("postgresql", "mysql", "sqlite"):
        module = __import__(f"sqlalchemy.dialects.{dialect}", fromlist=["dialect"])
        ddl = str(lease_table_statements()[0].compile(dialect=module.dialect()))
        assert "CREATE TABLE IF NOT EXISTS tickets_worker_leases" in ddl
        assert "PRIMARY KEY (namespace, worker_id)" in ddl


# -- real processes -------------------------------------------------------------------------------


def _hold(url: str, ns: str, ttl: float, path: str, ready: Any, stop: Any) -> None:
    """Lease a worker id, report it, then keep issuing ids (written to ``path``) until a
    message arrives on the ``stop`` pipe. (A pipe per process: a multiprocessing.Event would
    deadlock ``set()`` on the sleeper we SIGKILL.)"""
    gen = SnowflakeGenerator(lease=WorkerLease(url, namespace=ns, ttl=ttl), layout=LAYOUT)
    with open(path, "a") as out:
        out.write(f"{gen.new_id()}\n")
        out.flush()
        ready.put((os.getpid(), gen.worker_id))
        while not stop.poll(0.02):
            out.write("".join(f"{gen.new_id()}\n" for _ in range(20)))
            out.flush()
    gen.close()


def test_processes_hold_distinct_ids_and_a_killed_ones_id_comes_back(
    database_url: str, tmp_path: Path
) -> None:
    ns, ttl = _ns(), 2.0
    WorkerLease(database_url, namespace=ns).ensure_table()  # avoid four racing CREATE TABLEs
    ctx = WORKERS
    ready = ctx.Queue()
    procs, stops = [], []
    for k in range(4):
        theirs, ours = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_hold, args=(database_url, ns, ttl, str(tmp_path / f"ids{k}"), ready, theirs)
        )
        p.start()
        procs.append(p)
        stops.append(ours)
    try:
        held = dict(ready.get(timeout=120) for _ in procs)  # pid -> worker id
        assert sorted(held.values()) == [0, 1, 2, 3]  # four live processes, four distinct ids

        lease = WorkerLease(database_url, namespace=ns, ttl=ttl)
        parent = SnowflakeGenerator(lease=lease, layout=LAYOUT)
        with pytest.raises(TicketsError, match="all 4 worker ids"):
            parent.new_id()  # no fifth holder while four are alive

        victim = procs[1]
        victim_worker = held[victim.pid]
        os.kill(victim.pid, signal.SIGKILL)  # no clean release: only expiry frees its id
        victim.join(timeout=30)
        killed_at = time.monotonic()
        first = _until(ttl + 15, parent.new_id, "recycling of the killed process's worker id")
        waited = time.monotonic() - killed_at
        assert parent.worker_id == victim_worker
        assert waited > ttl / 3  # it was not free before its lease ran out

        # The other three are still alive and still hold their ids.
        rows = {row.worker_id: row for row in lease.rows()}
        for pid, worker in held.items():
            if pid != victim.pid:
                assert rows[worker].expires_in_ms > 0 and rows[worker].holder != ""
        # Nothing the new holder issues repeats, or sorts before, what the dead one issued.
        theirs = [int(x) for x in (tmp_path / "ids1").read_text().split()]
        mine = [first] + parent.new_ids(500)
        assert theirs and max(theirs) < min(mine)
        assert {parent.parse(i).worker for i in theirs} == {victim_worker}
        parent.close()
        lease.close()
    finally:
        for p, stop in zip(procs, stops, strict=True):
            if p.is_alive():
                stop.send("stop")
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    everything = []
    for k in range(4):
        everything += [int(x) for x in (tmp_path / f"ids{k}").read_text().split()]
    assert len(everything) == len(set(everything))


def _forked_worker(gen: SnowflakeGenerator, queue: Any) -> None:
    try:
        gen.new_id()
        queue.put(gen.worker_id)
    except Exception as error:  # report, do not hang the parent
        queue.put(repr(error))
    finally:
        gen.close()


def test_a_forked_child_leases_its_own_worker_id(database_url: str) -> None:
    lease = WorkerLease(database_url, namespace=_ns())
    gen = SnowflakeGenerator(lease=lease, layout=LAYOUT)
    gen.new_id()
    mine = gen.worker_id
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_worker, args=(gen, queue))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(timeout=60)
    assert isinstance(theirs, int) and theirs != mine
    assert gen.worker_id == mine  # the parent keeps its own
    gen.new_id()
    gen.close()
    lease.close()
