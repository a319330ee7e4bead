"""ObjectId: MongoDB's layout, interoperable with ``bson.ObjectId`` both ways."""

from __future__ import annotations

import multiprocessing
from datetime import datetime, timezone

import bson
import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.columns import ObjectId
from sqlalchemy_tickets.generators import ObjectIdGenerator, check_object_id, object_id_time

START_S = 1_700_000_000


def test_layout_and_bson_reads_it() -> None:
    gen = ObjectIdGenerator(time_ns=lambda: START_S * 1_000_000_000 + 123)
    a, b = gen.new_id(), gen.new_id()
    assert len(a) == 24 and a == a.lower() and int(a, 16) >= 0
    assert a[:8] == f"{START_S:08x}"
    assert a[8:18] == b[8:18]  # 5 random bytes per process
    assert (int(b[18:], 16) - int(a[18:], 16)) % (1 << 24) == 1  # 3-byte counter
    theirs = bson.ObjectId(a)
    assert str(theirs) == a and theirs.binary == bytes.fromhex(a)
    assert theirs.generation_time == datetime.fromtimestamp(START_S, tz=timezone.utc)
    assert object_id_time(a) == theirs.generation_time


def test_bson_ids_are_accepted() -> None:
    dialect = sa.engine.default.DefaultDialect()
    column = ObjectId()
    theirs = bson.ObjectId()
    assert column.process_bind_param(str(theirs), dialect) == str(theirs)
    assert column.process_bind_param(theirs, dialect) == str(theirs)
    assert column.process_bind_param(str(theirs).upper(), dialect) == str(theirs)
    assert column.process_bind_param(theirs.binary, dialect) == str(theirs)


@pytest.mark.parametrize("value", ["", "xyz", "0" * 23, "g" * 24, "0" * 25, b"\0" * 11, 5])
def test_malformed_values_are_refused(value: object) -> None:
    with pytest.raises(TicketsError, match="ObjectId"):
        check_object_id(value)


def test_real_clock_ids_are_unique_and_bson_valid() -> None:
    gen = ObjectIdGenerator()
    values = [gen.new_id() for _ in range(50_000)]
    assert len(set(values)) == len(values)
    assert all(bson.ObjectId.is_valid(v) for v in values[:1000])


_FORKED = ObjectIdGenerator()


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(_FORKED.new_id())


def test_a_forked_child_draws_new_process_bytes() -> None:
    mine = _FORKED.new_id()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(timeout=60)
    assert theirs[8:18] != mine[8:18]
