"""Retry-safe units of work: the same objects, with the same ids, until the rows are there.

Ids are on the objects before any SQL runs, so when a COMMIT times out or its reply is lost the
unit can be sent again as it was: if the first attempt never committed, the replay inserts the
rows; if it did, the replay meets its own primary keys, checks that every row of the unit is
stored, and finishes. No duplicate, nothing lost, no idempotency-key column.

What is guaranteed, by where the failure happened:

* inside ``work`` or the flush (before COMMIT was sent): the transaction is known to be rolled
  back; ``work`` runs again in a fresh session (an insert-only unit whose ``work`` already
  returned is replayed instead, without calling ``work`` again);
* at COMMIT (the outcome is unknown): an insert-only unit is replayed with the same objects and
  ids and verified as above; a unit that also updated or deleted rows cannot be replayed safely
  (the update may have been applied) nor re-run blindly (it may be applied twice), so
  :class:`CommitOutcomeUnknownError` is raised — never a silently lost or doubled update.

Errors a retry cannot cure (a constraint violation, a data error, an exception from ``work``)
are raised at once.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast, overload

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, make_transient_to_detached

from ._backoff import Backoff
from .dialects._registry import every_backend
from .errors import CommitOutcomeUnknownError, DatabaseUnavailable, TicketsError

if TYPE_CHECKING:
    # Only for annotations: sqlalchemy.ext.asyncio needs greenlet, which only the asyncio
    # extra installs; importing it here would break `import sqlalchemy_tickets` without it.
    from sqlalchemy.ext.asyncio import AsyncSession

logger = logging.getLogger("sqlalchemy_tickets")

T = TypeVar("T")
P = ParamSpec("P")

__all__ = [
    "CommitOutcomeUnknownError",
    "RetryState",
    "async_retry_session",
    "is_retryable",
    "retry_session",
]


def is_retryable(error: BaseException) -> bool:
    """Whether a retry can cure ``error``: a lost or refused connection, a timeout, a deadlock,
    a serialization failure — as each backend module classifies its own driver's errors — and
    :class:`DatabaseUnavailable` (a ticket server or worker-lease database that refused,
    dropped or did not answer).

    A :class:`TicketsError` raised *from* such an error (a ticket or lease database that could
    not be reached, say) is retryable too: the outage is what a retry waits out.
    """
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:  # a bounded walk: a cause chain may be cyclic
        if isinstance(current, DatabaseUnavailable):  # a ticket server or lease database
            return True
        if isinstance(current, DBAPIError):
            if current.connection_invalidated:
                return True
            orig = current.orig
            return orig is not None and any(b.is_retryable(orig) for b in every_backend())
        if not isinstance(current, TicketsError):
            return False
        current = current.__cause__
        seen += 1
    return False


class _Outcome(concurrent.futures.Future[Any]):
    """A failed attempt, shaped like tenacity's ``Future`` (strategies such as
    ``wait_exception`` read ``outcome.failed`` and ``outcome.exception()``)."""

    def __init__(self, attempt_number: int, error: BaseException) -> None:
        super().__init__()
        self.attempt_number = attempt_number
        self.set_exception(error)

    @property
    def failed(self) -> bool:
        return self.exception() is not None


class RetryState:
    """What a tenacity ``stop``/``wait`` strategy reads, as tenacity's ``RetryCallState`` has it.

    ``attempt_number`` counts from 1 and names the attempt that just failed while the strategies
    run; ``seconds_since_start`` is measured when that attempt failed; ``upcoming_sleep`` is the
    pause ``wait`` chose (``wait`` runs before ``stop``, as in tenacity, so ``stop_before_delay``
    can look at it); ``idle_for`` is the time paused so far.
    """

    def __init__(self, clock: Callable[[], float], fn: Callable[..., Any] | None = None) -> None:
        self._clock = clock
        self.fn = fn
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.start_time = clock()
        self.attempt_number = 1
        self.outcome: _Outcome | None = None
        self.outcome_timestamp: float | None = None
        self.idle_for = 0.0
        self.upcoming_sleep = 0.0
        self.next_action: Any = None

    @property
    def seconds_since_start(self) -> float | None:
        if self.outcome_timestamp is None:
            return None
        return self.outcome_timestamp - self.start_time

    def failed(self, error: BaseException) -> None:
        self.outcome = _Outcome(self.attempt_number, error)
        self.outcome_timestamp = self._clock()

    def __repr__(self) -> str:
        return (
            f"<RetryState attempt #{self.attempt_number}; slept for {self.idle_for:.2f}; "
            f"last error: {self.outcome.exception() if self.outcome else None!r}>"
        )


@dataclass
class _Policy:
    attempts: int
    backoff: float
    max_backoff: float
    stop: Callable[[Any], bool] | None
    wait: Callable[[Any], float] | None
    clock: Callable[[], float]

    def __post_init__(self) -> None:
        if self.stop is None and (
            not isinstance(self.attempts, int) or isinstance(self.attempts, bool)
            or self.attempts < 1
        ):
            raise TicketsError(f"attempts must be an integer of at least 1, not {self.attempts!r}")
        if not (self.backoff >= 0 and self.max_backoff >= 0):
            raise TicketsError("backoff and max_backoff must be non-negative numbers of seconds")
        for name in ("stop", "wait", "clock"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TicketsError(f"{name} must be callable, not {value!r}")

    def pause(self, state: RetryState, error: BaseException) -> float | None:
        """Seconds to wait before the next attempt, or ``None`` to give up."""
        state.failed(error)
        if self.wait is not None:
            state.upcoming_sleep = float(self.wait(state))
        else:
            # Doubling, capped, with jitter between half and all of it.
            state.upcoming_sleep = Backoff(self.backoff, self.max_backoff, jitter=0.5).pause(
                state.attempt_number)
        done = self.stop(state) if self.stop is not None else state.attempt_number >= self.attempts
        if done:
            return None
        state.idle_for += state.upcoming_sleep
        state.attempt_number += 1
        return state.upcoming_sleep


class _Unit:
    """What one attempt wrote, recorded at every flush of its session."""

    def __init__(self, session: Session) -> None:
        self.inserted: list[Any] = []
        self.changes_rows = False
        self._seen: set[int] = set()
        event.listen(session, "before_flush", self._record)

    def _record(self, session: Session, flush_context: Any, instances: Any) -> None:
        for obj in session.new:
            if id(obj) not in self._seen:
                self._seen.add(id(obj))
                self.inserted.append(obj)
        if session.deleted or any(session.is_modified(obj) for obj in session.dirty):
            self.changes_rows = True

    def verify(self, session: Session) -> bool:
        """Whether every row this unit inserted is stored (by primary key)."""
        wanted: dict[Any, list[Any]] = defaultdict(list)
        for obj in self.inserted:
            mapper = sa.inspect(obj).mapper
            wanted[mapper].append(mapper.primary_key_from_instance(obj))
        for mapper, keys in wanted.items():
            columns = mapper.primary_key
            if len(columns) == 1:
                found = session.scalar(
                    sa.select(sa.func.count())
                    .select_from(mapper.local_table)
                    .where(columns[0].in_([k[0] for k in keys]))
                )
            else:
                found = session.scalar(
                    sa.select(sa.func.count())
                    .select_from(mapper.local_table)
                    .where(sa.tuple_(*columns).in_([tuple(k) for k in keys]))
                )
            if found != len(set(map(tuple, keys))):
                return False
        return True


@dataclass
class _Attempt:
    """Where the last attempt stood when it failed."""

    unit: _Unit | None = None  # set once ``work`` returned and its flush succeeded
    committing: bool = False  # COMMIT was sent


def _next_step(
    attempt: _Attempt, error: BaseException, state: RetryState, policy: _Policy
) -> tuple[str, float]:
    """After a failed attempt: ``("rerun"`` work or ``"replay"`` the unit, pause``)``; raises
    when no retry can help or none is left."""
    if not is_retryable(error):
        raise error
    unit = attempt.unit
    if unit is None:
        plan = "rerun"
    elif not unit.changes_rows:
        plan = "replay"
    elif attempt.committing:
        raise CommitOutcomeUnknownError(
            "the COMMIT of a unit that updated or deleted rows got no answer: it may or may "
            "not have been applied; check the data before running it again"
        ) from error
    else:
        plan = "rerun"
    pause = policy.pause(state, error)
    if pause is None:
        raise error
    logger.warning(
        "attempt %d failed (%s); %s in %.2f s",
        state.attempt_number - 1, _first_line(error), plan, pause,
    )
    return plan, pause


def _commit_keeping_state(session: Session) -> None:
    """Commit without expiring: the session is closed right after, and what ``work`` returns
    must stay readable (an expired attribute of a detached object cannot be loaded again)."""
    session.expire_on_commit = False
    session.commit()


@overload
def retry_session(
    session_factory: Callable[[], Session],
    work: Callable[[Session], T],
    *,
    attempts: int = ...,
    backoff: float = ...,
    max_backoff: float = ...,
    stop: Callable[[Any], bool] | None = ...,
    wait: Callable[[Any], float] | None = ...,
    sleep: Callable[[float], Any] = ...,
    clock: Callable[[], float] = ...,
) -> T: ...


@overload
def retry_session(
    session_factory: Callable[[], Session],
    work: None = ...,
    *,
    attempts: int = ...,
    backoff: float = ...,
    max_backoff: float = ...,
    stop: Callable[[Any], bool] | None = ...,
    wait: Callable[[Any], float] | None = ...,
    sleep: Callable[[float], Any] = ...,
    clock: Callable[[], float] = ...,
) -> Callable[[Callable[Concatenate[Session, P], T]], Callable[P, T]]: ...


def retry_session(
    session_factory: Callable[[], Session],
    work: Callable[[Session], T] | None = None,
    *,
    attempts: int = 5,
    backoff: float = 0.1,
    max_backoff: float = 5.0,
    stop: Callable[[Any], bool] | None = None,
    wait: Callable[[Any], float] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Run ``work(session)`` and commit, retrying lost connections, timeouts and deadlocks.

    The objects ``work`` returns can be read after it returns, whatever path the retry took:
    the unit is committed without expiring them (the session is closed right after).

    Args:
        session_factory: makes a fresh ``Session`` per attempt (a ``sessionmaker``).
        work: the unit of work; its return value is returned. Without it, ``retry_session``
            is a decorator: ``@retry_session(Session)`` over ``def work(session, *args): ...``
            gives ``work(*args)``.
        attempts: attempts in all, the first included.
        backoff: first pause in seconds; it doubles per attempt, with jitter, up to
            ``max_backoff``.
        stop, wait: tenacity strategies (``stop_after_delay(10)``, ``wait_random_exponential()``
            ...) to use instead of ``attempts`` and ``backoff``; they are given a
            :class:`RetryState`, ``wait`` before ``stop`` as tenacity does.
        sleep: how to pause (a parameter so tests need not wait).
        clock: monotonic seconds, read for ``seconds_since_start``.

    Raises:
        CommitOutcomeUnknownError: a unit that updated or deleted rows lost its COMMIT reply.
        The last error, when attempts run out; any error a retry cannot cure, at once.
    """
    policy = _Policy(attempts, backoff, max_backoff, stop, wait, clock)
    if work is None:
        return functools.partial(_decorate, session_factory, policy, sleep)
    return _run(session_factory, work, policy, sleep)


def _decorate(
    session_factory: Callable[[], Session],
    policy: _Policy,
    sleep: Callable[[float], Any],
    work: Callable[Concatenate[Session, P], T],
) -> Callable[P, T]:
    @functools.wraps(work)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return _run(session_factory, lambda session: work(session, *args, **kwargs), policy, sleep)

    return run


def _run(
    session_factory: Callable[[], Session],
    work: Callable[[Session], T],
    policy: _Policy,
    sleep: Callable[[float], Any],
) -> T:
    state = RetryState(policy.clock, work)
    attempt = _Attempt()
    result: Any = None
    plan = "rerun"
    while True:
        session = session_factory()
        try:
            if plan == "replay" and attempt.unit is not None:
                _replay(session, attempt.unit)
                return cast(T, result)
            attempt = _Attempt()
            unit = _Unit(session)
            result = work(session)
            session.flush()
            attempt.unit = unit
            attempt.committing = True
            _commit_keeping_state(session)
            return cast(T, result)
        except BaseException as error:
            _discard(session)
            plan, pause = _next_step(attempt, error, state, policy)
            sleep(pause)
        finally:
            session.close()


def _replay(session: Session, unit: _Unit) -> None:
    """Insert the same objects again; if their keys are already stored, check they all are."""
    session.add_all(unit.inserted)
    try:
        _commit_keeping_state(session)
    except IntegrityError:
        session.rollback()
        if unit.verify(session):
            logger.info("the lost commit had been applied: all %d rows are stored",
                        len(unit.inserted))
            # They are the stored rows: detach them as such (with their identity, as if loaded,
            # so adding one to a later session updates it rather than inserting it again).
            session.expunge_all()
            for obj in unit.inserted:
                make_transient_to_detached(obj)
            return
        raise


def _discard(session: Session) -> None:
    try:
        session.rollback()
    except Exception:  # the connection is gone; closing the session is what is left to do
        logger.debug("rollback after a failed attempt failed too", exc_info=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# -- asyncio ------------------------------------------------------------------------------------


@overload
def async_retry_session(
    session_factory: Callable[[], AsyncSession],
    work: Callable[[AsyncSession], Awaitable[T]],
    *,
    attempts: int = ...,
    backoff: float = ...,
    max_backoff: float = ...,
    stop: Callable[[Any], bool] | None = ...,
    wait: Callable[[Any], float] | None = ...,
    sleep: Callable[[float], Awaitable[Any]] | None = ...,
    clock: Callable[[], float] = ...,
) -> Coroutine[Any, Any, T]: ...


@overload
def async_retry_session(
    session_factory: Callable[[], AsyncSession],
    work: None = ...,
    *,
    attempts: int = ...,
    backoff: float = ...,
    max_backoff: float = ...,
    stop: Callable[[Any], bool] | None = ...,
    wait: Callable[[Any], float] | None = ...,
    sleep: Callable[[float], Awaitable[Any]] | None = ...,
    clock: Callable[[], float] = ...,
) -> Callable[
    [Callable[Concatenate[AsyncSession, P], Awaitable[T]]],
    Callable[P, Coroutine[Any, Any, T]],
]: ...


def async_retry_session(
    session_factory: Callable[[], AsyncSession],
    work: Callable[[AsyncSession], Awaitable[T]] | None = None,
    *,
    attempts: int = 5,
    backoff: float = 0.1,
    max_backoff: float = 5.0,
    stop: Callable[[Any], bool] | None = None,
    wait: Callable[[Any], float] | None = None,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """:func:`retry_session` for ``async_sessionmaker``: ``await work(session)`` and commit,
    with the same guarantees; ``await async_retry_session(factory, work)``.

    Without ``work`` it is a decorator: ``@async_retry_session(factory)`` over
    ``async def work(session, *args): ...`` gives ``await work(*args)``. ``sleep`` defaults to
    ``asyncio.sleep``.
    """
    policy = _Policy(attempts, backoff, max_backoff, stop, wait, clock)
    if work is None:
        return functools.partial(_decorate_async, session_factory, policy, sleep)
    return _run_async(session_factory, work, policy, sleep)


def _decorate_async(
    session_factory: Callable[[], AsyncSession],
    policy: _Policy,
    sleep: Callable[[float], Awaitable[Any]] | None,
    work: Callable[Concatenate[AsyncSession, P], Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(work)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await _run_async(
            session_factory, lambda session: work(session, *args, **kwargs), policy, sleep
        )

    return run


async def _run_async(
    session_factory: Callable[[], AsyncSession],
    work: Callable[[AsyncSession], Awaitable[T]],
    policy: _Policy,
    sleep: Callable[[float], Awaitable[Any]] | None,
) -> T:
    import asyncio

    pause_for = sleep or asyncio.sleep
    state = RetryState(policy.clock, work)
    attempt = _Attempt()
    result: Any = None
    plan = "rerun"
    while True:
        session = session_factory()
        try:
            if plan == "replay" and attempt.unit is not None:
                await session.run_sync(_replay, attempt.unit)
                return cast(T, result)
            attempt = _Attempt()
            unit = _Unit(session.sync_session)
            result = await work(session)
            await session.flush()
            attempt.unit = unit
            attempt.committing = True
            session.sync_session.expire_on_commit = False  # see _commit_keeping_state
            await session.commit()
            return cast(T, result)
        except BaseException as error:
            await session.run_sync(_discard)
            plan, pause = _next_step(attempt, error, state, policy)
            await pause_for(pause)
        finally:
            await session.close()
