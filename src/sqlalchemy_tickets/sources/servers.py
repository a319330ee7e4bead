"""Several ticket databases issuing interleaved ids, as Flickr's odd/even pair."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import URL, Engine

from .._backoff import Backoff
from .._deprecation import deprecated_alias
from .._naming import TicketTable, ticket_table
from ..errors import ExhaustedError, TicketsError, TicketServerUnavailable
from .base import Request, check_count, check_ids
from .server import TicketServer

logger = logging.getLogger("sqlalchemy_tickets")


@dataclass
class _Member:
    server: TicketServer
    failures: int = 0
    down_until: float = 0.0
    last_error: str = ""


class TicketServers:
    """N ticket databases; server *i* (0-based) issues ids ≡ *i+1* (mod N).

    Calls go round robin. A server that errors or does not answer within its timeout is skipped
    and tried again after a back-off that doubles per failure (``backoff`` up to
    ``max_backoff`` seconds); callers see no error while any server answers. Each server's
    increment/offset is checked against its position on first contact, before it issues an id.

    Args:
        servers: URLs, engines or :class:`TicketServer` objects, in position order.
        timeout: per-server connect/round-trip timeout for servers given as URLs or engines.
        backoff: first pause, in seconds, before a failed server is tried again.
        max_backoff: longest pause.
        clock: the monotonic clock, a parameter so tests can drive back-off without waiting.
    """

    def __init__(
        self,
        servers: Sequence[str | URL | Engine | TicketServer],
        *,
        timeout: float = 2.0,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        **server_options: object,
    ) -> None:
        if isinstance(servers, (str, URL, Engine)) or len(servers) == 0:
            raise TicketsError("TicketServers needs a non-empty list of servers")
        n = len(servers)
        members = []
        for i, server in enumerate(servers):
            if isinstance(server, TicketServer):
                member = server.with_stride(n, i + 1)
            else:
                member = TicketServer(
                    server, timeout=timeout, stride=(n, i + 1), **server_options  # type: ignore[arg-type]
                )
            members.append(_Member(member))
        self._members = members
        this = weakref.ref(self)
        for joined in members:
            joined.server.start_above = self._highest_elsewhere_many
            joined.server.floors.append(_peers_floor(this, joined.server))
            joined.server.after_heal.append(_raise_peers(this, joined.server))
        self._pauses = Backoff(backoff, max_backoff)
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0

    def __repr__(self) -> str:
        return f"TicketServers([{', '.join(repr(m.server) for m in self._members)}])"

    @property
    def servers(self) -> list[TicketServer]:
        return [m.server for m in self._members]

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """``count`` ids from the next server that answers and has them.

        A server that cannot issue ``count`` more ids is passed over like one that is down, so
        every id below the limit on every server is issued. :class:`ExhaustedError` comes when
        every server answered that it has fewer than ``count`` left; its ``remaining`` is the
        most any one of them still has (ask again with that many), ``0`` when none has any.
        """
        check_count(count, bits)  # before first contact: nothing is written for a count too big
        now = self._clock()
        with self._lock:
            first = self._next
            self._next = (self._next + 1) % len(self._members)
        order = self._members[first:] + self._members[:first]
        ready = [m for m in order if m.down_until <= now]
        resting = [m for m in order if m.down_until > now]
        errors: list[str] = []
        exhausted: list[ExhaustedError] = []
        # Servers still backing off are the last resort: their pause may be out of date.
        for member in ready + resting:
            try:
                block = member.server.next_block(sequence, count, bits=bits)
            except ExhaustedError as error:
                # This server answered; another may still have ids.
                if member.failures:
                    self._recovered(member)
                exhausted.append(error)
                continue
            except TicketServerUnavailable as error:
                self._failed(member, error)
                errors.append(str(error))
                continue
            if member.failures:
                self._recovered(member)
            return block
        label = sequence or f"Tickets{bits}"
        remaining = max((e.remaining or 0 for e in exhausted), default=0)
        if exhausted and (remaining or not errors):
            # Every server that answered is short of ``count``; the unreachable ones (if any)
            # may have ids, so "none left" is only said when every server answered.
            raise ExhaustedError(
                f"no ticket server can issue {count} more id(s) of {label}: "
                f"{remaining} left on the server with the most"
                + (f" ({len(errors)} server(s) did not answer)" if errors else "")
                + "; ask for fewer, or move to a 64-bit or a new sequence before it runs out",
                remaining=remaining,
            )
        raise TicketServerUnavailable(
            f"no ticket server answered for {label}: "
            + "; ".join(errors + [str(e) for e in exhausted])
        )

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """:meth:`next_block` for each ``(sequence, count, bits)``: the whole batch from the
        next server in turn that answers (in one round trip per few dozen sequences); what it
        could not serve (down, exhausted) from the others, then each request alone."""
        out: list[range | TicketsError | None] = [None] * len(requests)
        now = self._clock()
        with self._lock:
            first = self._next
            self._next = (self._next + 1) % len(self._members)
        order = self._members[first:] + self._members[:first]
        for member in [m for m in order if m.down_until <= now]:
            left = [i for i, done in enumerate(out) if done is None]
            if not left:
                break
            found = member.server.next_blocks([requests[i] for i in left])
            down = next((e for e in found if isinstance(e, TicketServerUnavailable)), None)
            if down is not None and all(isinstance(e, TicketsError) for e in found):
                self._failed(member, down)
                continue
            if member.failures:
                self._recovered(member)
            for i, block in zip(left, found, strict=True):
                if isinstance(block, range):
                    out[i] = block
        result: list[range | TicketsError] = []
        for i, (sequence, count, bits) in enumerate(requests):
            got = out[i]
            if got is None:  # every server failed it together: each in turn, alone
                try:
                    got = self.next_block(sequence, count, bits=bits)
                except TicketsError as error:
                    got = error
            result.append(got)
        return result

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None:
        """:meth:`TicketServer.prepare` on every server that answers (a server that does not
        makes first contact on its first block); raises when none answers."""
        names = list(sequences)
        errors: list[TicketsError] = []
        for member in self._members:
            try:
                member.server.prepare(names, bits=bits)
            except TicketServerUnavailable as error:
                self._failed(member, error)
                errors.append(error)
            except TicketsError as error:
                errors.append(error)
        if errors and (len(errors) == len(self._members) or not all(
            isinstance(e, TicketServerUnavailable) for e in errors
        )):
            raise errors[0]

    def give_back_many(self, items: Sequence[tuple[str | None, range, int]]) -> list[int]:
        """:meth:`give_back` of each ``(sequence, ids, bits)``, each server's share in one
        call."""
        n = len(self._members)
        out = [0] * len(items)
        shares: dict[int, list[int]] = {}
        for i, (_, ids, bits) in enumerate(items):
            check_ids(ids, bits)
            if ids and ids.step == n:
                shares.setdefault((ids.start - 1) % n, []).append(i)
        for position, indexes in shares.items():
            server = self._members[position].server
            try:
                taken = server.give_back_many([items[i] for i in indexes])
            except TicketsError as error:
                logger.warning("%s could not take back %d ranges: %s", server, len(indexes),
                               error)
                continue
            for i, n_taken in zip(indexes, taken, strict=True):
                out[i] = n_taken
        return out

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Give ``ids`` back to the server that issued them (server *i* issues ids ≡ *i+1*
        mod N, step N); how many it took back (see :meth:`TicketServer.give_back`), ``0``
        when no server's position matches."""
        check_ids(ids, bits)
        n = len(self._members)
        if not ids or ids.step != n:
            return 0
        return self._members[(ids.start - 1) % n].server.give_back(sequence, ids, bits=bits)

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id issued from now on by every server be above ``floor`` (see
        :meth:`TicketServer.ensure_above`), unless a server that answers already issued
        ``floor`` or above: the servers of a pair drift apart in normal use, and an id in use
        up to there is that server's, not a sign that the others went back in time (a
        restored server is caught by its identity and the others' floors). A server that does
        not answer keeps the floor and checks it on its next block. Returns whether any
        sequence had to move."""
        for member in self._members:
            try:
                info = member.server.describe(sequence, bits=bits)
            except TicketsError:
                continue
            if info is not None and info.last_id is not None and info.last_id >= floor:
                return False
        moved = False
        for member in self._members:
            try:
                moved = member.server.ensure_above(sequence, floor, bits=bits) or moved
            except TicketServerUnavailable as error:
                self._failed(member, error)
        return moved

    def _highest_elsewhere_many(
        self, tables: list[TicketTable], excluding: TicketServer | None = None
    ) -> dict[TicketTable, int]:
        """:meth:`_highest_elsewhere` of many tables, one round trip per server."""
        highest = dict.fromkeys(tables, 0)
        for member in self._members:
            if member.server is excluding:
                continue
            try:
                found = member.server.describe_many([t.sequence for t in tables],
                                                    bits=tables[0].bits)
            except TicketsError:
                continue
            for table, info in zip(tables, found, strict=True):
                if info is not None and info.last_id is not None:
                    highest[table] = max(highest[table], info.last_id)
        return highest

    def _highest_elsewhere(
        self, table: TicketTable, excluding: TicketServer | None = None
    ) -> int:
        """The highest id the servers that answer (but ``excluding``) have issued for
        ``table`` (0: none): a server that creates the table on first use starts above it, and
        a restored server heals above it."""
        highest = 0
        for member in self._members:
            if member.server is excluding:
                continue
            try:
                info = member.server.describe(table.sequence, bits=table.bits)
            except TicketsError:
                continue
            if info is not None and info.last_id is not None:
                highest = max(highest, info.last_id)
        return highest

    def stats(self) -> dict[str, int]:
        """Ids issued, round trips made and rewinds seen through these servers (all
        sequences): the counters of :meth:`TicketServer.stats`, summed over the servers."""
        total = {"issued": 0, "round_trips": 0, "rewinds": 0}
        for member in self._members:
            for key, value in member.server.stats().items():
                total[key] = total.get(key, 0) + value
        return total

    def status(self) -> list[dict[str, object]]:
        """Each server's health as this process sees it: whether it is being skipped, after
        how many failures, for how much longer, and the last error (counters are in
        :meth:`stats`)."""
        now = self._clock()
        with self._lock:
            return [
                {
                    "server": repr(m.server),
                    "up": m.down_until <= now,
                    "failures": m.failures,
                    "retry_in": max(0.0, m.down_until - now),
                    "last_error": m.last_error,
                }
                for m in self._members
            ]

    def close(self) -> None:
        """Close every server's connections."""
        for member in self._members:
            member.server.close()

    dispose = deprecated_alias(close, "dispose")

    def _failed(self, member: _Member, error: Exception) -> None:
        with self._lock:
            member.failures += 1
            pause = self._pauses.pause(member.failures)
            member.down_until = self._clock() + pause
            member.last_error = str(error)
        logger.warning("%s skipped for %.1f s: %s", member.server, pause, error)

    def _recovered(self, member: _Member) -> None:
        with self._lock:
            member.failures = 0
            member.down_until = 0.0
        logger.info("%s answers again", member.server)


def _peers_floor(
    servers: weakref.ref[TicketServers], server: TicketServer
) -> Callable[[TicketTable], int | None]:
    """A floor for ``server`` kept outside its database: the highest id its peers issued. A
    server restored from a backup is behind the other servers of its pair, which issued ids
    beside it all along (a reference that is weak: the servers do not keep their list)."""

    def floor(table: TicketTable) -> int | None:
        found = servers()
        highest = found._highest_elsewhere(table, excluding=server) if found else 0
        return highest or None

    return floor


def _raise_peers(
    servers: weakref.ref[TicketServers], server: TicketServer
) -> Callable[[TicketTable, int], None]:
    """After ``server`` healed a rewind to ``target``, the other servers move above it too:
    their last ids are the floor the next heal of ``server`` reads (a second restore of the
    same backup), and ``server`` issued ids above ``target`` since."""

    def raise_peers(table: TicketTable, target: int) -> None:
        found = servers()
        if found is None:
            return
        for member in found._members:
            if member.server is server:
                continue
            try:
                member.server.db.raise_above(
                    ticket_table(table.sequence, table.bits, member.server.table_template),
                    target,
                )
            except TicketsError as error:
                logger.warning("%s: could not move %s above %d after a heal of %s: %s",
                               member.server, table.label, target, server, error)

    return raise_peers
