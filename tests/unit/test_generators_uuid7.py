"""UUIDv7: the RFC 9562 test vector, the counter method, every implementation."""

from __future__ import annotations

import copy
import importlib
import multiprocessing
import pickle
import threading
import uuid
from datetime import datetime, timezone
from itertools import pairwise

import pytest
import uuid_utils

from sqlalchemy_tickets.generators import UUID7Generator, uuid7, uuid7_from_fields, uuid7_time

# The package exports the function ``uuid7``, which hides the submodule of the same name.
uuid7_module = importlib.import_module("sqlalchemy_tickets.generators.uuid7")

MS = 1_000_000
# RFC 9562 Appendix A.6: "Example of a UUIDv7 Value".
RFC_TS_MS = 0x017F22E279B0
RFC_RAND_A = 0xCC3
RFC_RAND_B = 0x18C4DC0C0C07398F
RFC_UUID = "017F22E2-79B0-7CC3-98C4-DC0C0C07398F"


def test_rfc_9562_test_vector() -> None:
    value = uuid7_from_fields(RFC_TS_MS, RFC_RAND_A, RFC_RAND_B)
    assert value == uuid.UUID(RFC_UUID)
    assert type(value) is uuid.UUID
    assert value.version == 7 and value.variant == uuid.RFC_4122
    # "Tuesday, February 22, 2022 2:22:22.00 PM GMT-05:00"
    assert uuid7_time(value) == datetime(2022, 2, 22, 19, 22, 22, tzinfo=timezone.utc)


def test_generated_at_the_rfc_timestamp_has_the_rfc_layout() -> None:
    gen = UUID7Generator(time_ns=lambda: RFC_TS_MS * MS)
    value = gen.new_id()
    assert value.int >> 80 == RFC_TS_MS
    assert str(value).upper().startswith("017F22E2-79B0-7")
    assert value.version == 7 and value.variant == uuid.RFC_4122
    assert uuid7_time(value) == uuid7_time(uuid.UUID(RFC_UUID))


def test_fields_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        uuid7_from_fields(1 << 48, 0, 0)
    with pytest.raises(ValueError):
        uuid7_from_fields(0, 1 << 12, 0)


class Bytes:
    """A deterministic randbytes: 0x01, 0x02, ... so the counter seed is known."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        return bytes((i + self.calls) % 256 for i in range(n))


def _counter(value: uuid.UUID) -> int:
    n = value.int
    return (((n >> 64) & 0xFFF) << 30) | ((n >> 32) & 0x3FFFFFFF)


def test_fallback_counter_method() -> None:
    now = [RFC_TS_MS * MS]
    gen = UUID7Generator(time_ns=lambda: now[0], randbytes=Bytes())
    a, b, c = gen.new_id(), gen.new_id(), gen.new_id()
    # Same millisecond: the 42-bit counter adds one; the last 32 bits are fresh random.
    assert _counter(b) == _counter(a) + 1 and _counter(c) == _counter(b) + 1
    assert len({a.int & 0xFFFFFFFF, b.int & 0xFFFFFFFF, c.int & 0xFFFFFFFF}) == 3
    # The seed's top bit is zero (RFC 9562 §6.2 rollover guard).
    assert _counter(a) < 1 << 41
    now[0] += 5 * MS
    d = gen.new_id()
    assert d.int >> 80 == RFC_TS_MS + 5 and d > c
    now[0] -= 3 * MS  # clock steps back: the timestamp is carried, the counter goes on
    e = gen.new_id()
    assert e.int >> 80 == RFC_TS_MS + 5 and _counter(e) == _counter(d) + 1 and e > d


def test_fallback_is_monotonic_unique_and_standard() -> None:
    gen = UUID7Generator()
    values = [gen.new_id() for _ in range(100_000)]
    assert all(a < b for a, b in pairwise(values))
    assert {v.version for v in values} == {7}
    assert {v.variant for v in values} == {uuid.RFC_4122}
    assert all(type(v) is uuid.UUID for v in values[:100])


def test_selected_implementation_is_uuid_utils_here() -> None:
    # uuid_utils is in the dev environment, so the fast path is what runs.
    assert uuid7_module.IMPLEMENTATION == "uuid_utils"


def test_uuid7_is_monotonic_standard_and_behaves_like_any_uuid() -> None:
    values = [uuid7() for _ in range(200_000)]
    assert all(a < b for a, b in pairwise(values))
    value = values[-1]
    assert type(value) is uuid.UUID and value.version == 7 and value.variant == uuid.RFC_4122
    assert value.is_safe is uuid.SafeUUID.unknown
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.copy(value) == value and copy.deepcopy(value) == value
    assert uuid.UUID(str(value)) == value and hash(uuid.UUID(str(value))) == hash(value)
    # uuid_utils reads the same timestamp.
    assert uuid_utils.UUID(str(value)).timestamp == value.int >> 80


def test_uuid7_threads_are_unique_and_increasing_per_thread() -> None:
    out: list[list[uuid.UUID]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(k: int) -> None:
        barrier.wait()
        out[k] = [uuid7() for _ in range(20_000)]

    pool = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for chunk in out:
        assert chunk == sorted(chunk)
    flat = [v for c in out for v in c]
    assert len(set(flat)) == len(flat)


def _child_values(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    gen = _FORKED
    queue.put([gen.new_id().int for _ in range(500)])


_FORKED = UUID7Generator(time_ns=lambda: RFC_TS_MS * MS)


def test_forked_child_draws_fresh_random_bits() -> None:
    ctx = multiprocessing.get_context("fork")
    _FORKED.new_id()  # parent has state (counter, random pool) before the fork
    queue = ctx.Queue()
    child = ctx.Process(target=_child_values, args=(queue,))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(timeout=60)
    mine = [_FORKED.new_id().int for _ in range(500)]
    # Same frozen millisecond, same counter: only the random bits keep them apart.
    assert not set(mine) & set(theirs)
