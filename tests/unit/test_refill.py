"""The refill scheduler shared by caches and tiers: a few threads for many lanes, the shortest
runway first, no lane run twice at once, back-offs rescheduled rather than slept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from sqlalchemy_tickets.sources._refill import Refiller


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


class Lane:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Gate:
    """A job that records what it ran and can be held."""

    def __init__(self) -> None:
        self.ran: list[list[Lane]] = []
        self.open = threading.Event()
        self.open.set()
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()
        self.together: list[tuple[Lane, Lane]] = []
        self.active: set[Lane] = set()

    def __call__(self, lanes: list[Lane]) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            for lane in lanes:
                for other in self.active:
                    if other is lane:
                        self.together.append((lane, other))
                self.active.add(lane)
            self.ran.append(list(lanes))
        self.open.wait(10)
        with self.lock:
            self.running -= 1
            for lane in lanes:
                self.active.discard(lane)


def test_many_lanes_run_on_a_bounded_number_of_threads_and_never_twice_at_once() -> None:
    gate = Gate()
    gate.open.clear()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=3)
    before = threading.active_count()
    blockers = [Lane(f"b{i}") for i in range(3)]
    for lane in blockers:
        refiller.wake(lane)
    until(lambda: gate.running == 3)  # every thread busy: what comes next queues
    lanes = [Lane(f"l{i}") for i in range(500)]
    for lane in lanes:
        refiller.wake(lane)
        refiller.wake(lane)  # twice while queued: still one run
    gate.open.set()
    assert refiller.wait_idle(30)
    ran = [lane for batch in gate.ran for lane in batch if lane not in blockers]
    assert sorted(map(repr, ran)) == sorted(map(repr, lanes))  # each once
    assert refiller.threads() <= 3
    assert threading.active_count() - before <= 3
    assert gate.most <= 3
    assert not gate.together
    assert refiller.close(5)


def test_a_wake_while_running_runs_the_lane_once_more_afterwards() -> None:
    gate = Gate()
    gate.open.clear()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=2)
    lane = Lane("a")
    refiller.wake(lane)
    until(lambda: gate.running == 1)
    refiller.wake(lane)
    refiller.wake(lane)
    gate.open.set()
    assert refiller.wait_idle(10)
    assert len(gate.ran) == 2  # once more, not twice more
    assert not gate.together
    refiller.close()


def test_due_lanes_go_shortest_runway_first_and_in_batches() -> None:
    gate = Gate()
    gate.open.clear()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=1, batch=3)
    blocker = Lane("blocker")
    refiller.wake(blocker)
    until(lambda: gate.running == 1)  # the one thread is busy: the others queue up
    lanes = {runway: Lane(f"r{runway}") for runway in (50.0, 5.0, 500.0, 0.5, 20.0)}
    for runway, lane in lanes.items():
        refiller.wake(lane, runway=runway)
    gate.open.set()
    assert refiller.wait_idle(10)
    assert gate.ran[1] == [lanes[0.5], lanes[5.0], lanes[20.0]]
    assert gate.ran[2] == [lanes[50.0], lanes[500.0]]
    refiller.close()


def test_defer_waits_and_hurry_brings_it_forward_on_the_injected_clock() -> None:
    now = [1000.0]
    gate = Gate()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=1, clock=lambda: now[0])
    lane = Lane("backing-off")
    refiller.defer(lane, 30.0)
    refiller.wake(lane)  # a wake does not cut a back-off short
    # The worker went to wait for the lane's time, which never comes on a clock standing still.
    until(lambda: refiller._state.waiting == 1 and refiller.scheduled(lane))
    assert gate.ran == []
    refiller.hurry(lane, 0.0)  # a caller waits for it
    until(lambda: len(gate.ran) == 1)
    assert refiller.wait_idle(5)
    refiller.close()


def test_a_deferred_lane_runs_once_its_time_comes() -> None:
    gate = Gate()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=1)
    lane = Lane("later")
    started = time.monotonic()
    refiller.defer(lane, 0.2)
    assert refiller.wait_idle(5)
    assert len(gate.ran) == 1
    assert time.monotonic() - started >= 0.2
    refiller.close()


def test_a_stalled_job_holds_one_thread_and_the_others_go_on() -> None:
    stalled = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def job(lanes: list[Lane]) -> None:
        for lane in lanes:
            if lane.name == "stuck":
                stalled.set()
                release.wait(10)
            ran.append(lane.name)

    refiller: Refiller[Lane] = Refiller(job, name="t-refill", workers=2)
    refiller.wake(Lane("stuck"))
    assert stalled.wait(5)
    others = [Lane(f"o{i}") for i in range(50)]
    for lane in others:
        refiller.wake(lane)
    assert refiller.wait_idle(5, others)  # all served while one thread stays stuck
    assert "stuck" not in ran
    release.set()
    assert refiller.wait_idle(5)
    refiller.close()


def test_a_failing_job_is_logged_and_its_thread_serves_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def job(lanes: list[Lane]) -> None:
        calls.append(lanes[0].name)
        if lanes[0].name == "bad":
            raise RuntimeError("boom")

    refiller: Refiller[Lane] = Refiller(job, name="t-refill", workers=1)
    refiller.wake(Lane("bad"))
    assert refiller.wait_idle(5)
    refiller.wake(Lane("good"))
    assert refiller.wait_idle(5)
    assert calls == ["bad", "good"]
    assert "boom" in caplog.text
    refiller.close()


def test_close_runs_nothing_more_and_waits_for_the_running_job() -> None:
    gate = Gate()
    gate.open.clear()
    refiller: Refiller[Lane] = Refiller(gate, name="t-refill", workers=1)
    refiller.wake(Lane("running"))
    until(lambda: gate.running == 1)
    refiller.wake(Lane("queued"))
    assert not refiller.close(0.1)  # the running job is still running
    gate.open.set()
    assert refiller.close(5)
    assert [lane.name for batch in gate.ran for lane in batch] == ["running"]
    refiller.wake(Lane("after"))  # ignored once closed
    until(lambda: refiller.threads() == 0)
    assert len(gate.ran) == 1


def test_idle_threads_end_and_a_dropped_owner_is_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source dropped without close() (one per test in a user's suite) must not be kept alive
    for ever by its refill threads: they end once idle, and the next wake starts another."""
    import gc
    import weakref

    from sqlalchemy_tickets.sources import _refill

    monkeypatch.setattr(_refill, "IDLE_EXIT", 0.2)

    class Owner:
        def __init__(self) -> None:
            self.ran = 0
            self.refiller: Refiller[Lane] = Refiller(self.job, name="t-idle", workers=2)

        def job(self, lanes: list[Lane]) -> None:
            self.ran += len(lanes)

    owner = Owner()
    lane = Lane("a")
    refiller = owner.refiller

    def ended() -> bool:
        return not [t for t in threading.enumerate() if t.name.startswith("t-idle")]

    refiller.wake(lane)
    assert refiller.wait_idle(10)
    until(ended)
    assert refiller.threads() == 0
    refiller.wake(lane)  # a wake after they ended starts a thread again
    assert refiller.wait_idle(10) and owner.ran == 2
    until(ended)
    assert refiller.threads() == 0
    dropped = weakref.ref(owner)
    del owner, refiller
    gc.collect()
    assert dropped() is None
