"""Prefixed ids: shape, order, prefix checks, TypeID and ULID interoperability."""

from __future__ import annotations

import multiprocessing
import re
import threading
import uuid

import pytest
import sqlalchemy as sa
from typeid import TypeID
from ulid import ULID

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.columns import PrefixedId
from sqlalchemy_tickets.generators import PrefixedIdGenerator, check_prefix, parse_prefixed
from sqlalchemy_tickets.generators.prefixed import ALPHABET, decode_base32, encode_base32

MS = 1_000_000
START_MS = 1_700_000_000_000
FORMATS = ["ulid", "typeid"]


class Clock:
    def __init__(self) -> None:
        self.ms = START_MS

    def __call__(self) -> int:
        return self.ms * MS


@pytest.mark.parametrize("prefix", ["post", "p", "user_key", "a_b_c", "x" * 63])
def test_valid_prefixes(prefix: str) -> None:
    assert check_prefix(prefix) == prefix
    assert PrefixedId(prefix).prefix == prefix


@pytest.mark.parametrize(
    "prefix", ["", "Post", "post_", "_post", "po-st", "po st", "x" * 64, "pöst", "p0st", None, 3]
)
def test_invalid_prefixes_are_refused_at_construction(prefix: object) -> None:
    with pytest.raises(TicketsError, match="prefix"):
        PrefixedId(prefix)  # type: ignore[arg-type]
    with pytest.raises(TicketsError, match="prefix"):
        PrefixedIdGenerator(prefix)  # type: ignore[arg-type]


def test_unknown_format_is_refused() -> None:
    with pytest.raises(TicketsError, match="format"):
        PrefixedIdGenerator("post", format="uuid")  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("secure", [True, False])
def test_shape(fmt: str, secure: bool) -> None:
    gen = PrefixedIdGenerator("post", format=fmt, secure=secure)  # type: ignore[arg-type]
    values = [gen.new_id() for _ in range(3000)]
    pattern = re.compile(r"post_[0-7][" + ALPHABET + r"]{25}\Z")
    assert all(pattern.match(v) for v in values)
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("fmt", FORMATS)
def test_lexicographic_order_is_creation_order_whatever_the_clock(fmt: str) -> None:
    clock = Clock()
    gen = PrefixedIdGenerator("post", format=fmt, time_ns=clock)  # type: ignore[arg-type]
    values = []
    for step in [0, 0, 0, 1, 1, 5, 3, 3, 4, 6, 6, 2, 7, 100, 99]:
        clock.ms = START_MS + step
        values.extend(gen.new_id() for _ in range(700))  # > 1024 per ms: the cached head rolls
    assert values == sorted(values) and len(set(values)) == len(values)
    parts = parse_prefixed(values[0])
    assert parts.prefix == "post" and parts.timestamp_ms == START_MS
    assert parse_prefixed(values[-1]).timestamp_ms == START_MS + 100


def test_counter_runs_within_a_millisecond_and_random_tail_is_fresh() -> None:
    clock = Clock()
    gen = PrefixedIdGenerator("post", time_ns=clock)
    a, b = parse_prefixed(gen.new_id()).value, parse_prefixed(gen.new_id()).value
    assert (b >> 40) == (a >> 40) + 1  # 40-bit counter, then 40 random bits
    assert (a & (2**40 - 1)) != (b & (2**40 - 1))
    assert ((a >> 40) & (2**40 - 1)) < 2**39  # the seed's top bit is zero


def test_typeid_format_round_trips_through_typeid_python() -> None:
    gen = PrefixedIdGenerator("post", format="typeid")
    for value in [gen.new_id() for _ in range(200)]:
        theirs = TypeID.from_string(value)
        assert theirs.prefix == "post" and str(theirs) == value
        ours = parse_prefixed(value)
        assert uuid.UUID(str(theirs.uuid)) == ours.uuid
        assert ours.uuid.version == 7 and ours.uuid.variant == uuid.RFC_4122
        assert ours.uuid.int >> 80 == ours.timestamp_ms
    # and the other way: typeid-python's ids are valid values of a typeid column
    column = PrefixedId("post", format="typeid")
    theirs_value = str(TypeID("post"))
    assert column.process_bind_param(theirs_value, sa.engine.default.DefaultDialect()) == (
        theirs_value
    )
    assert column.process_bind_param(TypeID("post"), sa.engine.default.DefaultDialect())


def test_ulid_format_is_read_by_python_ulid() -> None:
    gen = PrefixedIdGenerator("post")
    value = gen.new_id()
    body = value.split("_")[-1]
    theirs = ULID.from_str(body.upper())
    ours = parse_prefixed(value)
    assert theirs.milliseconds == ours.timestamp_ms
    assert int(theirs) == ours.value
    # and a ULID made by python-ulid is a valid body
    other = f"post_{str(ULID()).lower()}"
    assert gen.check(other) == other


def test_base32_round_trip() -> None:
    for n in [0, 1, 31, 32, 2**128 - 1, 2**130 - 1, 123456789 * 2**70]:
        text = encode_base32(n)
        assert len(text) == 26 and decode_base32(text) == n
    with pytest.raises(TicketsError):
        encode_base32(2**130)
    with pytest.raises(TicketsError):
        decode_base32("0000000000000000000000000i")  # 'i' is not Crockford


@pytest.mark.parametrize(
    "value, message",
    [
        ("user_01hqz4x7j1f3tq6m9r2v8k5n0c", "is a 'user' id, not a 'post' id"),
        ("post_01HQZ4X7J1F3TQ6M9R2V8K5N0C", "not a 'post' id"),  # upper case
        ("post_81hqz4x7j1f3tq6m9r2v8k5n0c", "not a 'post' id"),  # > 128 bits
        ("post_01hqz4x7j1f3tq6m9r2v8k5n0", "not a 'post' id"),  # short
        ("post_01hqz4x7j1f3tq6m9r2v8k5n0u", "not a 'post' id"),  # 'u' is not Crockford
        ("posts_01hqz4x7j1f3tq6m9r2v8k5n0c", "is a 'posts' id"),
        ("01hqz4x7j1f3tq6m9r2v8k5n0c", "not a 'post' id"),
        (b"post_01hqz4x7j1f3tq6m9r2v8k5n0c", "must be a string"),
        (42, "must be a string"),
    ],
)
def test_values_of_another_kind_are_refused_when_bound(value: object, message: str) -> None:
    column = PrefixedId("post")
    with pytest.raises(TicketsError, match=re.escape(message)):
        column.process_bind_param(value, sa.engine.default.DefaultDialect())


def test_a_prefix_with_underscores_splits_at_the_last_one() -> None:
    gen = PrefixedIdGenerator("user_key")
    value = gen.new_id()
    assert parse_prefixed(value).prefix == "user_key"
    with pytest.raises(TicketsError, match="is a 'user_key' id, not a 'user' id"):
        PrefixedIdGenerator("user").check(value)


def test_threads_unique_and_ordered_per_thread() -> None:
    gen = PrefixedIdGenerator("post", format="typeid")
    out: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(k: int) -> None:
        barrier.wait()
        out[k] = [gen.new_id() for _ in range(20_000)]

    pool = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for chunk in out:
        assert chunk == sorted(chunk)
    flat = [v for c in out for v in c]
    assert len(set(flat)) == len(flat)


_FROZEN = PrefixedIdGenerator("post", time_ns=lambda: START_MS * MS)
_FROZEN_FAST = PrefixedIdGenerator("post", secure=False, time_ns=lambda: START_MS * MS)


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(([_FROZEN.new_id() for _ in range(300)], [_FROZEN_FAST.new_id() for _ in range(300)]))


def test_forked_child_gets_fresh_randomness() -> None:
    _FROZEN.new_id(), _FROZEN_FAST.new_id()  # parent state exists before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    theirs, theirs_fast = queue.get(timeout=60)
    child.join(timeout=60)
    mine = [_FROZEN.new_id() for _ in range(300)]
    mine_fast = [_FROZEN_FAST.new_id() for _ in range(300)]
    # Same frozen millisecond and counter in both: only re-seeded randomness keeps them apart.
    assert not set(mine) & set(theirs)
    assert not set(mine_fast) & set(theirs_fast)
