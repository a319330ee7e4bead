"""Snowflake ids: milliseconds since an epoch, a worker id and a per-millisecond sequence.

Default layout (Twitter's), most significant first, in a positive 64-bit integer::

    0 | 41 bits: ms since epoch | 10 bits: worker | 12 bits: sequence

The three widths are configurable (``timestamp_bits + worker_bits + sequence_bits <= 63``, so
ids stay positive in a signed BIGINT). 41 bits of milliseconds last 69.7 years from the epoch;
the default epoch is Twitter's, 2010-11-04T01:42:54.657Z (good until 2080). Each worker issues
``2**sequence_bits`` ids per millisecond (4,096,000 per second by default).

Guarantees of one :class:`SnowflakeGenerator`:

* ``new_id()`` always returns an ``int`` — never ``None`` — and is safe from many threads.
* Ids are strictly increasing: a call that begins after another ended gets a larger id.
* Sequence exhausted within a millisecond: the call waits for the next millisecond.
* Wall clock stepping back by at most ``max_backward_ms`` (default 5): the remaining sequence of
  the last millisecond is used, then the call waits until the clock has caught up. Further back:
  :class:`TicketsError`, and nothing is issued — never a duplicate or a smaller id.

  Why 5 ms: NTP daemons slew the clock (it never runs backwards) unless the error exceeds
  128 ms, when they step it, so small backward steps come from VM migrations, clocks read on
  different cores, or leap-second handling, and are a few milliseconds at most. Waiting that
  long costs one request a few milliseconds; waiting out a 128 ms+ step would stall every
  writer, so that is an error an operator should see. 5 ms is also Meituan Leaf's threshold.

Worker ids come from the caller (``worker_id=``) or from a
:class:`~sqlalchemy_tickets.sources.lease.WorkerLease`
(``lease=``), acquired on first use and renewed by a heartbeat thread; a leased generator issues
only timestamps above the worker's recorded past and below its renewed bound (see ``lease``).

Speed: ``new_id`` reads the clock, then takes the next number of the current millisecond's
counter (``itertools.count``, atomic under the GIL) without a lock; the lock is taken once per
millisecond to open the next one, and whenever anything unusual happens. On a free-threaded
build (no GIL) every call takes the lock.

Forking: a leased generator in a forked child drops the parent's lease and leases its own id on
first use. A generator with a fixed ``worker_id`` cannot do that: parent and child would share
the worker id, so give each process its own (or use a lease); a warning is logged if the parent
had already issued ids.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple

from .. import _process
from .._deprecation import time_ns_keyword
from ..errors import ExhaustedError, TicketsError

# A lease needs a database: sources.lease (and with it every source and the dialect modules) is
# imported when a leased generator first takes its worker id, not with the generators.
if TYPE_CHECKING:
    from ..sources.lease import Heartbeat, LeaseGrant, WorkerLease

__all__ = [
    "TWITTER_EPOCH_MS",
    "SnowflakeGenerator",
    "SnowflakeLayout",
    "SnowflakeParts",
    "epoch_ms",
]

log = logging.getLogger("sqlalchemy_tickets")

#: Twitter's Snowflake epoch, 2010-11-04T01:42:54.657Z, in Unix milliseconds.
TWITTER_EPOCH_MS = 1288834974657
DEFAULT_MAX_BACKWARD_MS = 5

# (start ns, end ns, counter, limit): the ids of one millisecond.
_Window = tuple[int, int, Iterator[int], int]
# Matches no clock reading and issues nothing (its iterator yields 0, never below limit 0).
_CLOSED: _Window = (0, 0, itertools.repeat(0), 0)


def wait(seconds: float) -> None:
    """Wait ``seconds``: spin for waits under 2 ms (``time.sleep`` would overshoot a
    millisecond's remainder by tens of microseconds), sleep for longer ones."""
    if seconds > 0.002:
        time.sleep(seconds)
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        time.sleep(0)  # lets other threads run


@dataclass(frozen=True)
class SnowflakeLayout:
    """Bit widths of the three fields; validated, at most 63 bits in all."""

    timestamp_bits: int = 41
    worker_bits: int = 10
    sequence_bits: int = 12

    def __post_init__(self) -> None:
        for name, low in (("timestamp_bits", 30), ("worker_bits", 0), ("sequence_bits", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TicketsError(f"{name} must be an integer >= {low}, not {value!r}")
        total = self.timestamp_bits + self.worker_bits + self.sequence_bits
        if total > 63:
            raise TicketsError(
                f"timestamp_bits + worker_bits + sequence_bits = {total}: at most 63, so ids "
                "stay positive in a signed BIGINT"
            )

    @property
    def max_worker(self) -> int:
        return (1 << self.worker_bits) - 1

    @property
    def max_sequence(self) -> int:
        return (1 << self.sequence_bits) - 1

    @property
    def max_timestamp(self) -> int:
        return (1 << self.timestamp_bits) - 1

    @property
    def timestamp_shift(self) -> int:
        return self.worker_bits + self.sequence_bits


class SnowflakeParts(NamedTuple):
    """What a Snowflake id says: when, which worker, which of that millisecond's ids."""

    time: datetime
    worker: int
    sequence: int
    #: Unix milliseconds.
    timestamp_ms: int


def epoch_ms(epoch: int | datetime) -> int:
    """An epoch as Unix milliseconds (a naive ``datetime`` is taken as UTC)."""
    if isinstance(epoch, datetime):
        if epoch.tzinfo is None:
            epoch = epoch.replace(tzinfo=timezone.utc)
        value = int(epoch.timestamp() * 1000)
    elif isinstance(epoch, int) and not isinstance(epoch, bool):
        value = epoch
    else:
        raise TicketsError(f"epoch must be Unix milliseconds or a datetime, not {epoch!r}")
    if not 0 <= value < 1 << 48:
        raise TicketsError(f"epoch {epoch!r} is outside 1970..10889")
    return value


class SnowflakeGenerator:
    """Thread-safe Snowflake ids for one worker id (fixed or leased).

    Args:
        worker_id: this process's worker id, ``0 <= worker_id < 2**worker_bits``; unique among
            every process issuing ids into the same tables. ``None``: lease one (``lease=``).
        lease: where to lease a worker id when ``worker_id`` is ``None``.
        epoch: Unix milliseconds or a ``datetime``; default Twitter's (2010-11-04).
        layout: bit widths (default 41/10/12).
        max_backward_ms: largest backward clock step waited out; larger ones raise.
        time_ns: reads the time, as integer nanoseconds since the Unix epoch (default
            ``time.time_ns``; tests inject one). ``clock=`` is a deprecated alias.
        sleep: how to wait, in seconds (default :func:`wait`: spins under 2 ms, else
            ``time.sleep``); tests pass one that moves their clock.
    """

    def __init__(
        self,
        worker_id: int | None = None,
        *,
        lease: WorkerLease | None = None,
        epoch: int | datetime = TWITTER_EPOCH_MS,
        layout: SnowflakeLayout | None = None,
        max_backward_ms: int = DEFAULT_MAX_BACKWARD_MS,
        time_ns: Callable[[], int] | None = None,
        clock: Callable[[], int] | None = None,
        sleep: Callable[[float], None] = wait,
    ) -> None:
        self.layout = layout if layout is not None else SnowflakeLayout()
        self.epoch_ms = epoch_ms(epoch)
        if (
            isinstance(max_backward_ms, bool)
            or not isinstance(max_backward_ms, int)
            or max_backward_ms < 0
        ):
            raise TicketsError(f"max_backward_ms must be an integer >= 0, not {max_backward_ms!r}")
        self.max_backward_ms = max_backward_ms
        if worker_id is None and lease is None:
            raise TicketsError(
                "a Snowflake generator needs a worker id: pass worker_id=N (unique per process) "
                "or lease=WorkerLease(url) to lease one from a database"
            )
        if worker_id is not None and lease is not None:
            raise TicketsError("pass worker_id or lease, not both")
        if worker_id is not None:
            if isinstance(worker_id, bool) or not isinstance(worker_id, int):
                raise TicketsError(f"worker_id must be an integer, not {worker_id!r}")
            if not 0 <= worker_id <= self.layout.max_worker:
                raise TicketsError(
                    f"worker_id {worker_id} is outside 0..{self.layout.max_worker} "
                    f"({self.layout.worker_bits} worker bits)"
                )
        self.lease = lease
        self.time_ns = time_ns_keyword("SnowflakeGenerator", time_ns, clock)
        self.sleep = sleep

        self._lock = threading.Lock()
        self._worker: int | None = worker_id
        self._worker_part = 0 if worker_id is None else worker_id << self.layout.sequence_bits
        self._grant: LeaseGrant | None = None
        self._heartbeat: Heartbeat | None = None
        self._floor_ms = -1  # lease: ids must carry timestamps above this (Unix ms)
        self._limit_ms = (1 << 62) if lease is None else -1  # lease: ... and not above this
        self._last_ms = -1  # Unix ms of the newest window
        self._window: _Window = _CLOSED
        self._closed = False
        self.new_id: Callable[[], int]
        self._publish: Callable[[_Window], None]
        self._build()
        _process.track(self)

    # -- the hot path ------------------------------------------------------------------------

    def _build(self) -> None:
        clock = self.time_ns
        slow = self._slow
        window = _CLOSED

        def new_id() -> int:
            """The next Snowflake id."""
            now = clock()
            w = window
            if w[0] <= now < w[1]:
                v = next(w[2])
                if v < w[3]:
                    return v
            return slow(now)

        def new_id_locked() -> int:
            """The next Snowflake id (free-threaded build: always under the lock)."""
            return slow(clock())

        def publish(w: _Window) -> None:
            nonlocal window
            window = w

        self.new_id = new_id if _process.gil_enabled() else new_id_locked
        self._publish = publish

    def new_ids(self, count: int) -> list[int]:
        """``count`` fresh ids, increasing."""
        new_id = self.new_id
        return [new_id() for _ in range(count)]

    # -- everything else, under the lock ------------------------------------------------------

    def _slow(self, now: int) -> int:
        self._lock.acquire()
        try:
            # The caller's reading may be stale: a thread preempted between reading the clock
            # and getting here (the GIL switches every 5 ms) must not look like a clock that
            # stepped back. Readings taken under the lock are ordered like the windows.
            now = self.time_ns()
            while True:
                w = self._window
                if w[0] <= now < w[1]:
                    v = next(w[2])
                    if v < w[3]:
                        return v
                    now = self._pause(w[1], now)  # this millisecond's sequence is used up
                    continue
                if self._closed:
                    raise TicketsError(f"{self!r} is closed")
                ms = now // 1_000_000
                last = self._last_ms
                if ms <= last:
                    behind = last - ms
                    if behind > self.max_backward_ms:
                        raise TicketsError(
                            f"the clock stepped back {behind} ms (more than max_backward_ms="
                            f"{self.max_backward_ms}) behind ids already issued; nothing was "
                            "issued. Fix the clock (NTP) or wait until it passes "
                            f"{_iso(last)}"
                        )
                    v = next(w[2])
                    if v < w[3]:
                        return v  # the last millisecond still has sequence numbers
                    now = self._pause((last + 1) * 1_000_000, now)
                    continue
                if self._worker is None:
                    self._acquire(ms)
                    now = self.time_ns()  # the round trips took time
                    continue
                floor = self._floor_ms
                if ms <= floor:
                    behind = floor + 1 - ms
                    if behind > self.max_backward_ms:
                        self._refuse(ms, floor)
                    now = self._pause((floor + 1) * 1_000_000, now)
                    continue
                if ms > self._limit_ms:
                    self._renew_now(ms)
                    now = self.time_ns()
                    continue
                t = ms - self.epoch_ms
                layout = self.layout
                if t > layout.max_timestamp:
                    raise ExhaustedError(
                        f"the {layout.timestamp_bits}-bit timestamp from epoch "
                        f"{_iso(self.epoch_ms)} ran out at "
                        f"{_iso(self.epoch_ms + layout.max_timestamp)}; use a later epoch or "
                        "more timestamp bits"
                    )
                if t < 0:
                    raise TicketsError(
                        f"the clock ({_iso(ms)}) is before the Snowflake epoch "
                        f"({_iso(self.epoch_ms)}); fix the clock or use an earlier epoch"
                    )
                base = (t << layout.timestamp_shift) | self._worker_part
                start = ms * 1_000_000
                w = (
                    start,
                    start + 1_000_000,
                    itertools.count(base + 1),
                    base + (1 << layout.sequence_bits),
                )
                self._window = w
                self._last_ms = ms
                self._publish(w)
                return base
        finally:
            self._lock.release()

    def _pause(self, until_ns: int, now: int) -> int:
        """Wait until the clock reads ``until_ns`` (roughly); return the new reading."""
        self.sleep(max(until_ns - now, 1000) / 1e9)
        return self.time_ns()

    def _retire(self) -> None:
        """Stop the lock-free path from issuing more ids of the current window."""
        self._window = _CLOSED
        self._publish(_CLOSED)

    # -- leases --------------------------------------------------------------------------------

    def _acquire(self, ms: int) -> None:
        from ..sources.lease import Heartbeat

        lease = self.lease
        if lease is None:  # pragma: no cover - the constructor prevents it
            raise TicketsError("no worker id and no lease")
        grant = lease.acquire(self.layout.max_worker + 1)
        floor = max(grant.issued_until_ms, self._last_ms)
        until = max(ms + lease.ttl_ms, floor)
        try:
            renewed = lease.renew(grant, until)
        except Exception as error:
            self._release_quietly(lease, grant, grant.issued_until_ms)
            raise TicketsError(
                f"leased worker id {grant.worker_id} but could not record its lease: {error}"
            ) from error
        if not renewed:
            raise TicketsError(f"lost worker id {grant.worker_id} right after leasing it")
        self._grant = grant
        self._worker = grant.worker_id
        self._worker_part = grant.worker_id << self.layout.sequence_bits
        self._floor_ms = floor
        self._limit_ms = until
        heartbeat = Heartbeat(
            lease.heartbeat, self._beat, name=f"sqlalchemy-tickets-lease-{grant.worker_id}"
        )
        self._heartbeat = heartbeat
        heartbeat.start()

    def _refuse(self, ms: int, floor: int) -> None:
        grant, lease = self._grant, self.lease
        self._drop_lease()
        if grant is not None and lease is not None:
            self._release_quietly(lease, grant, grant.issued_until_ms)
        raise TicketsError(
            f"worker id {grant.worker_id if grant else '?'} has issued ids up to {_iso(floor)}, "
            f"{floor + 1 - ms} ms ahead of this machine's clock ({_iso(ms)}); refusing to issue "
            "ids that could repeat them. Fix this machine's clock (NTP)"
        )

    def _renew_now(self, ms: int) -> None:
        """The heartbeat has not extended the lease in time: try once ourselves."""
        grant, lease = self._grant, self.lease
        if grant is None or lease is None:  # pragma: no cover - limit only binds leased workers
            raise TicketsError("worker id limit reached without a lease")
        until = max(ms + lease.ttl_ms, self._limit_ms)
        try:
            renewed = lease.renew(grant, until)
        except Exception as error:
            raise TicketsError(
                f"the lease of worker id {grant.worker_id} ran out and could not be renewed "
                f"({error}); no id issued. Is {lease.url.render_as_string()} reachable?"
            ) from error
        if not renewed:
            self._lost(grant)
            return
        self._limit_ms = until

    def _beat(self) -> bool:
        """One heartbeat: extend the lease. ``False`` stops the heartbeat thread."""
        with self._lock:
            grant, lease = self._grant, self.lease
            if grant is None or lease is None or self._closed:
                return False
            until = max(self.time_ns() // 1_000_000 + lease.ttl_ms, self._limit_ms)
        try:
            renewed = lease.renew(grant, until)
        except Exception as error:
            log.warning("could not renew Snowflake worker lease %d: %s", grant.worker_id, error)
            return True
        with self._lock:
            if self._grant is not grant:
                return False
            if renewed:
                self._limit_ms = max(self._limit_ms, until)
                return True
            self._lost(grant)
            return False

    def _lost(self, grant: LeaseGrant) -> None:
        log.error(
            "lost the lease of Snowflake worker id %d (expired and taken by another process); "
            "leasing a new id",
            grant.worker_id,
        )
        self._drop_lease()

    def _drop_lease(self) -> None:
        self._retire()
        heartbeat = self._heartbeat
        self._grant = None
        self._heartbeat = None
        self._worker = None
        self._worker_part = 0
        self._limit_ms = -1
        if heartbeat is not None:
            heartbeat.stop()

    @staticmethod
    def _release_quietly(lease: WorkerLease, grant: LeaseGrant, until: int) -> None:
        try:
            lease.release(grant, until)
        except Exception as error:  # it expires on its own
            log.warning("could not release Snowflake worker lease %d: %s", grant.worker_id, error)

    @property
    def worker_id(self) -> int | None:
        """The worker id in use (``None``: a lease not taken yet, or lost)."""
        return self._worker

    def close(self) -> None:
        """Stop issuing; give a leased worker id back at once, recording the last timestamp."""
        with self._lock:
            self._closed = True
            grant, lease = self._grant, self.lease
            last = max(self._last_ms, self._floor_ms)
            self._drop_lease()
        if grant is not None and lease is not None:
            self._release_quietly(lease, grant, last)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        if self.lease is not None:
            self.lease._after_fork_in_child()
            self._grant = None
            self._heartbeat = None  # its thread does not exist here
            self._worker = None
            self._worker_part = 0
            self._limit_ms = -1
            self._retire()
        elif self._last_ms >= 0:
            log.warning(
                "process %d forked from a process that issued Snowflake ids as worker %s: "
                "if both go on issuing, ids can repeat; give each process its own worker_id "
                "or use a worker lease",
                os.getpid(),
                self._worker,
            )

    # -- reading ids ---------------------------------------------------------------------------

    def parse(self, snowflake: int) -> SnowflakeParts:
        """Time, worker and sequence of an id made with this generator's epoch and layout."""
        return parse(snowflake, epoch=self.epoch_ms, layout=self.layout)

    def __repr__(self) -> str:
        who = f"worker_id={self._worker}" if self.lease is None else f"lease={self.lease!r}"
        return f"SnowflakeGenerator({who})"


def parse(
    snowflake: int,
    *,
    epoch: int | datetime = TWITTER_EPOCH_MS,
    layout: SnowflakeLayout | None = None,
) -> SnowflakeParts:
    """Split a Snowflake id into time (UTC), worker and sequence."""
    layout = layout if layout is not None else SnowflakeLayout()
    if isinstance(snowflake, bool) or not isinstance(snowflake, int) or snowflake < 0:
        raise TicketsError(f"a Snowflake id is a non-negative integer, not {snowflake!r}")
    total = layout.timestamp_bits + layout.worker_bits + layout.sequence_bits
    if snowflake >> total:
        raise TicketsError(f"{snowflake} has more than {total} bits: not an id of this layout")
    ms = (snowflake >> layout.timestamp_shift) + epoch_ms(epoch)
    return SnowflakeParts(
        time=datetime.fromtimestamp(ms / 1000, tz=timezone.utc),
        worker=(snowflake >> layout.sequence_bits) & layout.max_worker,
        sequence=snowflake & layout.max_sequence,
        timestamp_ms=ms,
    )


def _iso(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms since 1970"


def _release_all_at_exit() -> None:
    for generator in _process.tracked(SnowflakeGenerator):
        if generator.lease is not None:
            try:
                generator.close()
            except Exception:  # pragma: no cover - best effort at exit
                pass


_process.at_exit(_release_all_at_exit)
