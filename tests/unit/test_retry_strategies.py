"""retry_session with tenacity's own stop/wait strategies, on an injected clock and sleep.

The failures are real: another SQLite connection holds the database file locked, and the
application's busy timeout is zero, so each attempt fails at once with "database is locked"
(retryable) until the test's sleep lets go of the lock. Nothing really sleeps.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqlalchemy_tickets import (
    DatabaseUnavailable,
    TicketsError,
    TicketServerUnavailable,
    is_retryable,
    retry_session,
)


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(sa.String(40))


class LockedDatabase:
    """A SQLite file another connection keeps locked, and a fake clock that only moves when the
    retry pauses; after ``release_after`` pauses the lock is let go."""

    def __init__(self, path: Path, release_after: int | None = None) -> None:
        self.engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
        Base.metadata.create_all(self.engine)
        self.factory = sessionmaker(self.engine)
        self._holder: sqlite3.Connection | None = sqlite3.connect(path, isolation_level=None)
        self._holder.execute("BEGIN IMMEDIATE")  # writers wait, readers do not
        self.release_after = release_after
        self.now = 100.0
        self.pauses: list[float] = []
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        if self.release_after is not None and len(self.pauses) >= self.release_after:
            self.release()

    def release(self) -> None:
        if self._holder is not None:
            self._holder.rollback()
            self._holder.close()
            self._holder = None

    def work(self, session: Session) -> Note:
        self.calls += 1
        note = Note(text=f"attempt {self.calls}")
        session.add(note)
        return note

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.scalar(sa.select(sa.func.count()).select_from(Note)) or 0)

    def close(self) -> None:
        self.release()
        self.engine.dispose()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[LockedDatabase]:
    locked = LockedDatabase(tmp_path / "app.db")
    yield locked
    locked.close()


def test_the_lock_is_a_retryable_failure(db: LockedDatabase) -> None:
    with pytest.raises(sa.exc.OperationalError, match="locked") as caught:
        retry_session(db.factory, db.work, attempts=1, sleep=db.sleep)
    assert is_retryable(caught.value)
    assert db.calls == 1 and db.pauses == []


def test_stop_after_delay(db: LockedDatabase) -> None:
    # Failures at t = 0, 3, 6, 9, 12 (seconds since start): 12 >= 10 stops.
    with pytest.raises(sa.exc.OperationalError, match="locked"):
        retry_session(
            db.factory,
            db.work,
            stop=tenacity.stop_after_delay(10),
            wait=tenacity.wait_fixed(3),
            sleep=db.sleep,
            clock=db.clock,
        )
    assert db.pauses == [3, 3, 3, 3]
    assert db.calls == 5 and db.count() == 0


def test_stop_before_delay_sees_the_upcoming_sleep(db: LockedDatabase) -> None:
    # wait runs before stop, as in tenacity: at t = 9 the next pause would end at 12 >= 10.
    with pytest.raises(sa.exc.OperationalError, match="locked"):
        retry_session(
            db.factory,
            db.work,
            stop=tenacity.stop_before_delay(10),
            wait=tenacity.wait_fixed(3),
            sleep=db.sleep,
            clock=db.clock,
        )
    assert db.pauses == [3, 3, 3]
    assert db.calls == 4


def _tenacity_pauses(stop: tenacity.stop.stop_base, wait: tenacity.wait.wait_base) -> list[float]:
    """The pauses tenacity itself chooses for a function that always fails."""
    pauses: list[float] = []

    def always_fails() -> None:
        raise sa.exc.OperationalError("stmt", {}, sqlite3.OperationalError("database is locked"))

    retrying = tenacity.Retrying(stop=stop, wait=wait, sleep=pauses.append, reraise=True)
    with pytest.raises(sa.exc.OperationalError):
        retrying(always_fails)
    return pauses


@pytest.mark.parametrize(
    "wait",
    [
        tenacity.wait_exponential_jitter(max=4, jitter=1),
        tenacity.wait_random_exponential(multiplier=0.5, max=4),
        tenacity.wait_exponential(multiplier=0.25, max=2) + tenacity.wait_random(0, 0.1),
    ],
    ids=["wait_exponential_jitter", "wait_random_exponential", "combined"],
)
def test_wait_strategies_pause_as_tenacity_does(db: LockedDatabase, wait: object) -> None:
    random.seed(1234)
    expected = _tenacity_pauses(tenacity.stop_after_attempt(6), wait)  # type: ignore[arg-type]
    random.seed(1234)
    with pytest.raises(sa.exc.OperationalError, match="locked"):
        retry_session(
            db.factory,
            db.work,
            stop=tenacity.stop_after_attempt(6),
            wait=wait,  # type: ignore[arg-type]
            sleep=db.sleep,
            clock=db.clock,
        )
    assert len(expected) == 5
    assert db.pauses == expected
    assert db.calls == 6


def test_wait_exception_reads_the_outcome(db: LockedDatabase) -> None:
    def by_error(error: BaseException) -> float:
        return 0.25 if isinstance(error, sa.exc.OperationalError) else 9.0

    with pytest.raises(sa.exc.OperationalError):
        retry_session(
            db.factory,
            db.work,
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exception(by_error),
            sleep=db.sleep,
            clock=db.clock,
        )
    assert db.pauses == [0.25, 0.25]


def test_the_outage_ends_and_the_unit_commits(tmp_path: Path) -> None:
    db = LockedDatabase(tmp_path / "app.db", release_after=3)
    try:
        note = retry_session(
            db.factory,
            db.work,
            stop=tenacity.stop_after_delay(30) | tenacity.stop_after_attempt(10),
            wait=tenacity.wait_random_exponential(multiplier=0.5, max=4),
            sleep=db.sleep,
            clock=db.clock,
        )
        assert len(db.pauses) == 3 and all(0 <= p <= 4 for p in db.pauses)
        assert db.calls == 4 and db.count() == 1
        assert note.text == "attempt 4" and note.id == 1  # readable after the session closed
    finally:
        db.close()


def test_the_state_tenacity_strategies_read(db: LockedDatabase) -> None:
    seen: list[tuple[int, float | None, float, float, bool, str]] = []

    def stop(state: tenacity.RetryCallState) -> bool:
        assert state.outcome is not None
        seen.append(
            (
                state.attempt_number,
                state.seconds_since_start,
                state.idle_for,
                state.upcoming_sleep,
                state.outcome.failed,
                type(state.outcome.exception()).__name__,
            )
        )
        return state.attempt_number >= 3

    with pytest.raises(sa.exc.OperationalError):
        retry_session(
            db.factory, db.work, stop=stop, wait=tenacity.wait_fixed(2), sleep=db.sleep,
            clock=db.clock,
        )
    assert seen == [
        (1, 0.0, 0.0, 2.0, True, "OperationalError"),
        (2, 2.0, 2.0, 2.0, True, "OperationalError"),
        (3, 4.0, 4.0, 2.0, True, "OperationalError"),
    ]


def test_a_tickets_error_caused_by_a_lost_connection_is_retryable() -> None:
    # What a worker-lease outage raises: the library's error, from the driver's.
    try:
        try:
            sqlite3.connect("/nonexistent-dir/x.db")
        except sqlite3.OperationalError as driver_error:
            cause = sa.exc.OperationalError("SELECT 1", {}, driver_error)
            cause.connection_invalidated = True
            raise TicketsError("cannot lease a worker id from ...: unreachable") from cause
    except TicketsError as error:
        assert is_retryable(error)
    assert is_retryable(DatabaseUnavailable("the lease database did not answer in 5 s"))
    assert is_retryable(TicketServerUnavailable("the ticket server refused"))
    assert not is_retryable(TicketsError("all 1024 worker ids are leased"))
    assert not is_retryable(KeyError("bug"))


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"attempts": 2.5}, {"backoff": -1}, {"stop": 3}, {"wait": "fast"}],
)
def test_bad_policies_are_refused_before_anything_runs(
    db: LockedDatabase, kwargs: dict[str, object]
) -> None:
    with pytest.raises(TicketsError):
        retry_session(db.factory, db.work, **kwargs)  # type: ignore[arg-type]
    assert db.calls == 0
