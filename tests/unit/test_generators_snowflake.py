"""SnowflakeGenerator: layout, order, sequence exhaustion and a clock that steps back.

The clock is injected: ``FakeClock`` is read by the generator and moved by its ``sleep``, so
no test waits for real time.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from itertools import pairwise

import pytest
import snowflake as snowflake_id

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.errors import ExhaustedError
from sqlalchemy_tickets.generators import (
    TWITTER_EPOCH_MS,
    SnowflakeGenerator,
    SnowflakeLayout,
    parse_snowflake,
)
from sqlalchemy_tickets.generators import snowflake as snowflake_module

MS = 1_000_000
START_MS = 1_700_000_000_000  # 2023-11-14


class FakeClock:
    """Nanoseconds since 1970 that move only when told to (or when the generator sleeps)."""

    def __init__(self, ms: int = START_MS) -> None:
        self.now = ms * MS
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(int(seconds * 1e9), 1)

    def set_ms(self, ms: float) -> None:
        self.now = int(ms * MS)


def make(clock: FakeClock, worker_id: int = 5, **kw: object) -> SnowflakeGenerator:
    return SnowflakeGenerator(worker_id, time_ns=clock, sleep=clock.sleep, **kw)  # type: ignore[arg-type]


def test_default_layout_is_twitters() -> None:
    clock = FakeClock()
    gen = make(clock, worker_id=1023)
    first = gen.new_id()
    assert first == ((START_MS - TWITTER_EPOCH_MS) << 22) | (1023 << 12) | 0
    assert gen.new_id() == first + 1
    parts = gen.parse(first)
    assert parts.worker == 1023 and parts.sequence == 0 and parts.timestamp_ms == START_MS
    assert parts.time == datetime.fromtimestamp(START_MS / 1000, tz=timezone.utc)


def test_ids_agree_with_the_snowflake_id_package() -> None:
    clock = FakeClock()
    gen = make(clock, worker_id=7)
    gen.new_id()
    value = gen.new_id()
    theirs = snowflake_id.Snowflake.parse(value, epoch=TWITTER_EPOCH_MS)
    assert (theirs.milliseconds, theirs.instance, theirs.seq) == (START_MS, 7, 1)


def test_ids_increase_and_carry_the_clock() -> None:
    clock = FakeClock()
    gen = make(clock)
    ids = []
    for step in range(50):
        clock.set_ms(START_MS + step // 10)
        ids.append(gen.new_id())
    assert ids == sorted(ids) and len(set(ids)) == 50
    assert [gen.parse(i).timestamp_ms - START_MS for i in ids] == [s // 10 for s in range(50)]
    assert [gen.parse(i).sequence for i in ids[:12]] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]


def test_sequence_exhausted_waits_for_the_next_millisecond() -> None:
    clock = FakeClock()
    gen = make(clock, layout=SnowflakeLayout(41, 10, 2))  # four ids per millisecond
    ids = [gen.new_id() for _ in range(9)]
    assert ids == sorted(ids) and len(set(ids)) == 9
    stamps = [gen.parse(i).timestamp_ms - START_MS for i in ids]
    assert stamps == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert len(clock.sleeps) >= 2  # it waited (on the fake clock), it did not return None


def test_small_backward_step_uses_the_last_millisecond_then_waits() -> None:
    clock = FakeClock()
    gen = make(clock, layout=SnowflakeLayout(41, 10, 2))
    clock.set_ms(START_MS + 10)
    before = [gen.new_id(), gen.new_id()]
    clock.set_ms(START_MS + 7)  # 3 ms back: within the default 5 ms
    during = [gen.new_id(), gen.new_id()]  # the rest of millisecond +10, no wait
    assert clock.sleeps == []
    after = gen.new_id()  # +10 is used up: wait until the clock passes it
    assert clock.sleeps and clock.now >= (START_MS + 11) * MS
    ids = before + during + [after]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert gen.parse(after).timestamp_ms == START_MS + 11


def test_large_backward_step_raises_and_issues_nothing() -> None:
    clock = FakeClock()
    gen = make(clock)
    clock.set_ms(START_MS + 100)
    last = gen.new_id()
    clock.set_ms(START_MS + 94)  # 6 ms back
    with pytest.raises(TicketsError, match="clock stepped back 6 ms"):
        gen.new_id()
    clock.set_ms(START_MS + 95)  # 5 ms back: waited out
    assert gen.new_id() > last
    clock.set_ms(START_MS + 101)
    assert gen.new_id() > last


@pytest.mark.parametrize("tolerance", [0, 50])
def test_backward_tolerance_is_configurable(tolerance: int) -> None:
    clock = FakeClock()
    gen = make(clock, max_backward_ms=tolerance, layout=SnowflakeLayout(41, 10, 1))
    clock.set_ms(START_MS + 100)
    last = max(gen.new_id(), gen.new_id())  # millisecond +100 used up
    clock.set_ms(START_MS + 99)
    if tolerance == 0:
        with pytest.raises(TicketsError):
            gen.new_id()
    else:
        assert gen.new_id() > last


def test_never_returns_none_or_a_smaller_id_under_a_jittery_clock() -> None:
    clock = FakeClock()
    gen = make(clock, layout=SnowflakeLayout(41, 10, 3))
    offsets = [0, 3, -2, 1, 1, -1, 4, 8, 7, 3, 9, 12, 12, 8, 13]  # <= 5 ms back
    last = -1
    for round_ in range(30):
        for off in offsets:
            clock.set_ms(START_MS + round_ * 20 + off)
            value = gen.new_id()
            assert isinstance(value, int) and value > last
            last = value


def test_timestamp_bits_run_out_with_exhausted_error() -> None:
    clock = FakeClock()
    layout = SnowflakeLayout(30, 10, 12)
    epoch = START_MS - (1 << 30) + 2
    gen = make(clock, layout=layout, epoch=epoch)
    gen.new_id()
    clock.set_ms(START_MS + 5)
    with pytest.raises(ExhaustedError, match="ran out"):
        gen.new_id()


def test_clock_before_epoch_is_an_error() -> None:
    clock = FakeClock()
    gen = make(clock, epoch=START_MS + 60_000)
    with pytest.raises(TicketsError, match="before the Snowflake epoch"):
        gen.new_id()


def test_custom_layout_and_datetime_epoch() -> None:
    clock = FakeClock()
    epoch = datetime(2020, 1, 1, tzinfo=timezone.utc)
    layout = SnowflakeLayout(timestamp_bits=42, worker_bits=5, sequence_bits=16)
    gen = make(clock, worker_id=31, layout=layout, epoch=epoch)
    value = gen.new_id()
    parts = parse_snowflake(value, epoch=epoch, layout=layout)
    assert parts.worker == 31 and parts.sequence == 0 and parts.timestamp_ms == START_MS
    assert value >> 21 == START_MS - 1577836800000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timestamp_bits": 42, "worker_bits": 10, "sequence_bits": 12}, "at most 63"),
        ({"timestamp_bits": 20}, "timestamp_bits"),
        ({"sequence_bits": 0}, "sequence_bits"),
        ({"worker_bits": -1}, "worker_bits"),
        ({"worker_bits": True}, "worker_bits"),
    ],
)
def test_bad_layouts_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(TicketsError, match=message):
        SnowflakeLayout(**kwargs)


@pytest.mark.parametrize("worker_id", [-1, 1024, True, "3", 2.0])
def test_bad_worker_ids_are_refused(worker_id: object) -> None:
    with pytest.raises(TicketsError, match="worker_id"):
        SnowflakeGenerator(worker_id)  # type: ignore[arg-type]


def test_a_worker_id_or_a_lease_is_required() -> None:
    with pytest.raises(TicketsError, match="needs a worker id"):
        SnowflakeGenerator()


def test_parse_refuses_what_is_not_an_id() -> None:
    with pytest.raises(TicketsError):
        parse_snowflake(-1)
    with pytest.raises(TicketsError, match="more than 63 bits"):
        parse_snowflake(1 << 63)


def _hammer(gen: SnowflakeGenerator, threads: int, per_thread: int) -> list[list[int]]:
    barrier = threading.Barrier(threads)
    out: list[list[int]] = [[] for _ in range(threads)]

    def work(k: int) -> None:
        barrier.wait()
        new_id = gen.new_id
        out[k] = [new_id() for _ in range(per_thread)]

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out


def test_eight_threads_real_clock_unique_and_increasing_per_thread() -> None:
    gen = SnowflakeGenerator(3)
    chunks = _hammer(gen, 8, 20_000)
    for chunk in chunks:
        assert all(a < b for a, b in pairwise(chunk))
    flat = [i for c in chunks for i in c]
    assert len(set(flat)) == len(flat) == 160_000
    assert {gen.parse(i).worker for i in flat} == {3}


def test_the_locked_path_of_free_threaded_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snowflake_module._process, "gil_enabled", lambda: False)
    gen = SnowflakeGenerator(4, layout=SnowflakeLayout(41, 10, 8))
    assert gen.new_id.__name__ == "new_id_locked"
    chunks = _hammer(gen, 8, 5_000)
    flat = [i for c in chunks for i in c]
    assert len(set(flat)) == len(flat)
    for chunk in chunks:
        assert chunk == sorted(chunk)


def test_closed_generator_issues_nothing() -> None:
    gen = SnowflakeGenerator(9)
    gen.new_id()
    gen.close()
    with pytest.raises(TicketsError, match="closed"):
        # the current millisecond's window is retired too
        gen.new_id()


def test_the_column_default_lease_namespace_is_the_lease_module_one() -> None:
    """``SnowflakeId`` spells the default namespace out (its default argument cannot wait for
    ``sources.lease``, imported when a lease is first needed): the two must not drift apart."""
    import inspect

    from sqlalchemy_tickets import SnowflakeId
    from sqlalchemy_tickets.sources.lease import DEFAULT_NAMESPACE, WorkerLease

    column_default = inspect.signature(SnowflakeId).parameters["lease_namespace"].default
    lease_default = inspect.signature(WorkerLease).parameters["namespace"].default
    assert column_default == lease_default == DEFAULT_NAMESPACE
