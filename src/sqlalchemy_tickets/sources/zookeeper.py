"""HubSpot's global tier on ZooKeeper: sequences as high-water marks kept in an ensemble.

HubSpot's global VTickets service kept "the highest ids that have been issued for each database
and table" in ZooKeeper and granted more "by incrementing the highest id stored". Here a
sequence is one node under ``path`` (``<path>/<name>-<bits>``; ``Tickets64``/``Tickets32`` for
``sequence=None``) whose data is a small JSON document: ``{"last": N, "bits": 64, ...}``, ``N``
the highest id ever granted. A block of ``count`` ids is one conditional write: the node is read
(its data and version), then set to ``last + count`` *with the version read*; a client that lost
the race to another gets ``BadVersion`` and reads again. ZooKeeper acknowledges a write only
once a quorum of the ensemble has logged it, and the range is returned only after that
acknowledgement: no id ever comes from a minority, and a write whose answer was lost (a
connection dropped, a session expired mid-write) is never taken as granted — the next attempt
reads again, and a block that had in fact landed is simply burned.

Rewinds (``docs/rewinds.md``): every source records, per node, its creation zxid (``czxid``:
the node's identity), the highest modification zxid seen (``mzxid``: zxids only grow in one
ensemble's history) and the highest id it issued or was told is in use (``ensure_above``; a
datacenter tier tells its upstream the marks it stored). A node made again (another ``czxid``),
an ensemble restored from an older snapshot (an ``mzxid`` below one seen, or a mark below ids
issued) is recognised on the next read, confirmed by a ``sync`` (a lagging follower is not a
rewind), and healed — the mark moves above the highest floor known plus ``rewind_margin``, one
WARNING, counted — or refused with :class:`~sqlalchemy_tickets.RewindError`.

kazoo (``pip install sqlalchemy-tickets[zookeeper]``) is imported when a source is made, never
by importing this module. A source connects on first use; a forked child drops its parent's
session (never closes it: that is the parent's) and opens its own.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import _process
from .._commands import init_command
from .._naming import TicketTable, check_seconds, max_id, normalize_sequence
from ..errors import (
    ExhaustedError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from . import _rewind
from ._rewind import DEFAULT_REWIND_MARGIN, RewindPolicy
from ._zookeeper_parts import (
    DEFAULT_PATH,
    NodeInfo,
    _document,
    _kazoo,
    _Node,
    _Session,
    check_path,
    node_name,
    parse_node_name,
    parse_url,
)
from .base import Request, check_count, check_ids

if TYPE_CHECKING:
    from kazoo.client import KazooClient

__all__ = [
    "DEFAULT_PATH",
    "NodeInfo",
    "ZooKeeperSource",
    "from_url",
    "node_name",
    "parse_node_name",
    "parse_url",
]

logger = logging.getLogger("sqlalchemy_tickets")

#: Pause between attempts while no server answers (the call's ``timeout`` bounds them all).
_PAUSE = 0.05

_sources: weakref.WeakSet[ZooKeeperSource] = weakref.WeakSet()


def from_url(text: str, **options: Any) -> ZooKeeperSource:
    """The source a ``zookeeper://`` URL names (``options`` override the URL's)."""
    return ZooKeeperSource(**{**parse_url(text), **options})


class ZooKeeperSource:
    """A source whose sequences are high-water marks in a ZooKeeper ensemble (CONTRACT §10).

    Args:
        hosts: the ensemble, as kazoo takes it: ``"h1:2181,h2:2181,h3:2181"``.
        path: the node under which sequences live (made on first use).
        timeout: seconds a call may take: connecting, reading, writing and the attempts made
            again after a lost connection or a lost race. Past it,
            :class:`~sqlalchemy_tickets.TicketServerUnavailable` (an ensemble without a quorum
            never answers a write: never an id from a minority, never a hang).
        create_missing: create a sequence's node on first use (``False``: a missing one is
            :class:`~sqlalchemy_tickets.UnknownSequenceError`).
        session_timeout: the ZooKeeper session's timeout, in seconds (default: ``timeout``).
            kazoo pings a server every third of it and drops one silent for two thirds, so a
            stalled server is left within the call's ``timeout``. The ensemble bounds it
            (``minSessionTimeout``, 2 ``tickTime`` by default). An expired session costs
            nothing but a new one: this source keeps nothing in the session.
        on_rewind, rewind_margin: as for :class:`~sqlalchemy_tickets.TicketServer`: what to do
            when a node went back in time and how far above the floor a healed one starts.
    """

    def __init__(
        self,
        hosts: str,
        *,
        path: str = DEFAULT_PATH,
        timeout: float = 2.0,
        create_missing: bool = True,
        session_timeout: float | None = None,
        on_rewind: RewindPolicy = "heal",
        rewind_margin: int = DEFAULT_REWIND_MARGIN,
    ) -> None:
        if not isinstance(hosts, str) or not hosts.strip():
            raise TicketsError(f"hosts must be a string such as 'h1:2181,h2:2181', not {hosts!r}")
        self.hosts = hosts.strip()
        self.path = check_path(path)
        self.timeout = check_seconds("timeout", timeout, finite=True)
        self.session_timeout = (
            self.timeout if session_timeout is None
            else check_seconds("session_timeout", session_timeout, finite=True)
        )
        self.create_missing = bool(create_missing)
        self.on_rewind: RewindPolicy = _rewind.check_policy(on_rewind)
        self.rewind_margin = _rewind.check_margin(rewind_margin)
        self._kazoo = _kazoo()  # no kazoo, no source: the error names the extra
        self._client: KazooClient | None = None
        self._session = _Session()
        self._reset_state()
        _process.track(self)
        _sources.add(self)

    def _reset_state(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._issued = 0
        self._round_trips = 0
        self._conflicts = 0
        self._rewinds = 0
        self._retries = 0
        self._sessions = 0
        self._lost = 0

    def __repr__(self) -> str:
        return f"ZooKeeperSource({self.url!r})"

    @property
    def url(self) -> str:
        """The source as a URL: ``zookeeper://h1:2181,h2:2181/path``."""
        return f"zookeeper://{self.hosts}{self.path}"

    def node_path(self, sequence: str | None, bits: int = 64) -> str:
        """The node of ``sequence`` at ``bits``."""
        return f"{self.path}/{node_name(sequence, bits)}"

    # -- the source protocol ------------------------------------------------------------------

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        """One id of ``sequence``."""
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        """Exactly ``count`` ids, granted by one conditional write acknowledged by a quorum."""
        path = self.node_path(sequence, bits)  # validates the name and the bits
        check_count(count, bits)
        deadline = time.monotonic() + self.timeout
        lost = 0
        while True:
            if lost:
                # Many clients racing for one node: a short random pause, growing with the
                # races lost, spreads them out (each race lost costs everyone a round trip).
                time.sleep(min(random.uniform(0, 0.001 * 2**lost), 0.05,
                               max(0.0, deadline - time.monotonic())))
            info = self._read_checked(path, deadline)
            top = max_id(info.bits)
            if info.last + count > top:
                remaining = max(0, top - info.last)
                raise ExhaustedError(
                    f"{self._label(info)} on {self} has {remaining} ids left below "
                    f"{top} ({info.bits} bits), fewer than the {count} asked for: ask for "
                    f"fewer{', or move to a 64-bit sequence' if info.bits == 32 else ''}",
                    remaining=remaining,
                )
            new = info.last + count
            stat = self._write(path, info, new, deadline)
            if stat is None:
                lost += 1
                continue  # another client won the race, or the answer was lost: read again
            return self._granted(path, info, count, stat)

    def ensure_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> bool:
        """Make every id of ``sequence`` issued from now on be above ``floor`` (ids known to
        be in use: a datacenter tier's marks, the largest key of a table). A node at or below
        it went back in time: it is moved above ``floor`` plus ``rewind_margin`` (heal, one
        WARNING, counted) or :class:`~sqlalchemy_tickets.RewindError` (refuse). Returns
        whether it had to move; ``floor`` is remembered for later blocks."""
        path = self.node_path(sequence, bits)
        if type(floor) is not int or floor < 0:
            raise TicketsError(f"a floor is a number of ids >= 0, not {floor!r}")
        with self._lock:
            node = self._node(path)
            node.floor = max(node.floor, floor)
        deadline = time.monotonic() + self.timeout
        while True:
            info = self._read(path, deadline, create=self.create_missing)
            with self._lock:
                node = self._node(path)
                if node.czxid is None:
                    node.czxid = info.czxid
                node.mzxid = max(node.mzxid, info.mzxid)
            if info.last >= floor:
                return False
            seen = f"its mark ({info.last}) is below {floor}, an id already in use"
            if self._heal(path, info, seen, deadline):
                return True

    def prepare(self, sequences: Iterable[str | None], *, bits: int = 64) -> None:
        """Read (and, with ``create_missing``, create) many sequences' nodes at once: requests
        are pipelined on the session, so this costs about one round trip."""
        paths = list(dict.fromkeys(self.node_path(s, bits) for s in sequences))
        if not paths:
            return
        exc = self._kazoo[1]
        deadline = time.monotonic() + self.timeout
        client = self._connected(deadline)
        missing = self._read_many(client, paths, deadline)
        if missing and not self.create_missing:
            raise UnknownSequenceError(
                f"{len(missing)} sequence(s) do not exist on {self} (the first: {missing[0]}): "
                f"create them with `{init_command(str(self.url), 'SEQUENCE', '...')}`, "
                "or create_missing=True"
            )
        if missing:
            made = [(p, client.create_async(p, self._initial(p), makepath=True)) for p in missing]
            for _, result in made:
                try:
                    self._outcome(result, deadline)
                except (exc.NodeExistsError, *self._transient()):
                    pass  # made by another client, or read (and made) below
            self._read_many(client, missing, deadline)

    def _read_many(self, client: Any, paths: list[str], deadline: float) -> list[str]:
        """Read ``paths`` pipelined and record what each is; the paths found missing."""
        exc = self._kazoo[1]
        known = {path: self._snapshot(path) for path in paths}
        pending = [(path, client.get_async(path)) for path in paths]
        missing = []
        for path, result in pending:
            try:
                info = self._info(path, *self._outcome(result, deadline))
            except exc.NoNodeError:
                missing.append(path)
                continue
            except self._transient():
                info = self._read(path, deadline, create=self.create_missing)
            self._accepted(path, info, known[path])
        return missing

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """Blocks of many sequences; each request as :meth:`next_block` (one failing does
        not fail the others). The reads of every sequence, then their conditional writes,
        are pipelined on the session: about two round trips for the batch. A request whose
        pipelined attempt did not come through cleanly (a lost race, a node missing or gone
        back in time, a lost connection, the end of its id space) is made again on its own,
        as :meth:`next_block` makes it."""
        out: list[range | TicketsError | None] = [None] * len(requests)
        batch: list[tuple[int, str, int]] = []
        for i, (sequence, count, bits) in enumerate(requests):
            try:
                path = self.node_path(sequence, bits)
                check_count(count, bits)
                batch.append((i, path, count))
            except TicketsError as error:
                out[i] = error
        if len(batch) > 1:
            self._pipelined(batch, out)
        done: list[range | TicketsError] = []
        for i, found in enumerate(out):
            if found is None:
                sequence, count, bits = requests[i]
                try:
                    found = self.next_block(sequence, count, bits=bits)
                except TicketsError as error:
                    found = error
            done.append(found)
        return done

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        """Take back ``ids`` — ending with the latest block this source wrote for
        ``sequence`` — when no client wrote the node since: one conditional write moves the
        mark back to ``ids.start - 1`` (those ids are issued again). ``0`` otherwise: a block
        taken since by anyone, or ids that do not end this source's last block."""
        path = self.node_path(sequence, bits)
        check_ids(ids, bits)
        with self._lock:
            node = self._nodes.get(path)
            tail, floor = (node.tail, node.floor) if node is not None else (None, 0)
        # The end of this source's latest block (ids before it in the range are its earlier
        # blocks: contiguous, so nobody was granted ids between them), above every id told
        # to be in use.
        if not ids or tail is None or ids.step != 1 or ids[-1] != tail[1] or ids.start <= floor:
            return 0
        deadline = time.monotonic() + self.timeout
        info = self._read(path, deadline, create=False)
        if info.version != tail[0] or info.last != ids[-1]:
            return 0
        stat = self._write(path, info, ids.start - 1, deadline)
        if stat is None:
            return 0
        with self._lock:
            node = self._node(path)
            node.high = min(node.high, ids.start - 1)  # they may come out again: no rewind
            node.mzxid = max(node.mzxid, stat.mzxid)
            node.tail = None
        return len(ids)

    def stats(self) -> dict[str, int]:
        """Counters of this source: ``issued`` ids, ``round_trips`` (requests answered),
        ``conflicts`` (writes lost to another client, made again), ``retries`` (attempts made
        again after a lost connection or session), ``rewinds`` (healed or refused),
        ``sessions`` (clients started), ``sessions_lost`` (sessions that expired: kazoo
        opened a new one)."""
        with self._lock:
            return {
                "sessions_lost": self._lost + self._session.lost,
                "issued": self._issued,
                "round_trips": self._round_trips,
                "conflicts": self._conflicts,
                "retries": self._retries,
                "rewinds": self._rewinds,
                "sessions": self._sessions,
            }

    def close(self) -> None:
        """End the ZooKeeper session (a later call opens a new one)."""
        with self._lock:
            client, self._client = self._client, None
            self._lost += self._session.lost
            self._session = _Session()
        if client is not None:
            try:
                client.stop()
                client.close()
            except Exception:  # noqa: BLE001 - closing must not fail the caller
                logger.debug("closing %r", self, exc_info=True)

    # -- administration (the command line) ----------------------------------------------------

    def describe(self, sequence: str | None, *, bits: int = 64) -> NodeInfo | None:
        """The node of ``sequence`` as it is now (``None``: there is none). Creates nothing."""
        path = self.node_path(sequence, bits)
        try:
            return self._read(path, time.monotonic() + self.timeout, create=False)
        except UnknownSequenceError:
            return None

    def create(self, sequence: str | None, *, bits: int = 64, start: int = 1) -> bool:
        """Create ``sequence``'s node so that its first id is ``start``; ``False`` when it
        existed (left as it is)."""
        path = self.node_path(sequence, bits)
        if type(start) is not int or not 1 <= start <= max_id(bits):
            raise TicketsError(f"start must be between 1 and {max_id(bits)}, not {start!r}")
        seq = normalize_sequence(sequence)
        value = _document(start - 1, bits, seq, created=time.time())
        try:
            self._request(lambda c: c.create_async(path, value, makepath=True),
                          time.monotonic() + self.timeout)
        except self._kazoo[1].NodeExistsError:
            return False
        return True

    def sequences(self) -> list[tuple[str | None, int]]:
        """``(sequence, bits)`` of every sequence node under ``path``, sorted."""
        try:
            names = self._request(lambda c: c.get_children_async(self.path),
                                  time.monotonic() + self.timeout)
        except self._kazoo[1].NoNodeError:
            return []
        found = [parsed for name in names if (parsed := parse_node_name(name)) is not None]
        return sorted(found, key=lambda sb: (sb[0] or "", sb[1]))

    def sync_above(self, sequence: str | None, floor: int, *, bits: int = 64) -> NodeInfo:
        """Move ``sequence`` so every id issued from now on is above ``floor``: never down
        (:class:`TicketsError` and nothing changed when its mark is above ``floor`` already
        — ``floor`` below ids issued is a mistake worth stopping on). Records the move, so
        running sources that refused the node after a rewind accept it again."""
        path = self.node_path(sequence, bits)
        if type(floor) is not int or not 0 <= floor <= max_id(bits):
            raise TicketsError(f"a floor of a {bits}-bit sequence is 0 to {max_id(bits)}, "
                               f"not {floor!r}")
        deadline = time.monotonic() + self.timeout
        while True:
            info = self._read(path, deadline, create=False)
            if info.last > floor:
                raise TicketsError(
                    f"{self._label(info)} on {self} has issued up to {info.last}, above "
                    f"{floor}: sync never lowers a sequence; nothing changed (give --above N "
                    f"with N >= {info.last})"
                )
            doc = dict(info.document, last=floor, synced=info.synced + 1, synced_at=time.time())
            stat = self._set(path, json.dumps(doc, separators=(",", ":")).encode(),
                             info.version, deadline)
            if stat is not None:
                return NodeInfo(info.sequence, info.bits, floor, stat.version, stat.czxid,
                                stat.mzxid, doc)

    # -- internals ----------------------------------------------------------------------------

    def _label(self, info: NodeInfo) -> str:
        return f"{info.sequence or 'Tickets'}/{info.bits}"

    def _node(self, path: str) -> _Node:
        node = self._nodes.get(path)
        if node is None:
            node = self._nodes[path] = _Node()
        return node

    def _connected(self, deadline: float) -> KazooClient:
        """The client, connected: started on first use, waited for (until ``deadline``)."""
        with self._lock:
            client = self._client
            if client is None:
                KazooClient = self._kazoo[0]
                client = KazooClient(
                    hosts=self.hosts,
                    timeout=self.session_timeout,
                    # Reconnect for ever, soon: each call bounds its own wait.
                    connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2,
                                      "max_delay": 1.0, "max_jitter": 0.05},
                )
                session = _Session()
                client.add_listener(session)
                self._client, self._session = client, session
                self._sessions += 1
                client.start_async()
            live = self._session.live
        if not live.is_set() and not live.wait(max(0.0, deadline - time.monotonic())):
            raise self._unavailable("no server of the ensemble accepted a session")
        return client

    def _unavailable(self, why: str) -> TicketServerUnavailable:
        return TicketServerUnavailable(
            f"ZooKeeper ensemble {self.hosts} did not grant within {self.timeout:g} s "
            f"({why}): it has no quorum, or cannot be reached"
        )

    def _outcome(self, result: Any, deadline: float) -> Any:
        """What an asynchronous request answered, within ``deadline``."""
        exc, KazooTimeoutError = self._kazoo[1], self._kazoo[2]
        try:
            value = result.get(timeout=max(0.001, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise self._unavailable("no answer") from None
        except (exc.NoAuthError, exc.AuthFailedError, exc.InvalidACLError) as error:
            raise TicketsError(
                f"ZooKeeper ensemble {self.hosts} refused {self.path}: "
                f"{type(error).__name__} (grant this client read and write on it)"
            ) from None
        with self._lock:
            self._round_trips += 1
        return value

    def _request(self, make: Any, deadline: float) -> Any:
        """``make(client)``'s answer, made again after a lost connection or session until
        ``deadline`` (for requests whose repetition is harmless)."""
        while True:
            client = self._connected(deadline)
            try:
                return self._outcome(make(client), deadline)
            except self._transient() as error:
                self._retry(error, deadline)

    def _transient(self) -> tuple[type[BaseException], ...]:
        exc = self._kazoo[1]
        return (exc.ConnectionLoss, exc.SessionExpiredError, exc.ConnectionClosedError,
                exc.OperationTimeoutError, exc.SessionMovedError)

    def _retry(self, error: BaseException, deadline: float) -> None:
        """An attempt lost its connection or session: wait a moment and go on, or give up."""
        with self._lock:
            self._retries += 1
        if isinstance(error, self._kazoo[1].ConnectionClosedError):
            with self._lock:  # stopped under us (a fork, a close): a new client next time
                if self._client is not None and not self._client.connected:
                    self._client = None
        if time.monotonic() + _PAUSE >= deadline:
            raise self._unavailable(type(error).__name__) from None
        time.sleep(_PAUSE)

    def _read(self, path: str, deadline: float, *, create: bool) -> NodeInfo:
        """The node at ``path`` (created first if missing and ``create``)."""
        exc = self._kazoo[1]
        while True:
            client = self._connected(deadline)
            try:
                data, stat = self._outcome(client.get_async(path), deadline)
            except exc.NoNodeError:
                if not create:
                    sequence, bits = self._parts(path)
                    raise UnknownSequenceError(
                        f"sequence {sequence or 'Tickets'}/{bits} does not exist on {self} "
                        f"(no node {path}): create it with "
                        f"`{init_command(str(self.url), *([sequence] if sequence else []))}`"
                        ", or create_missing=True"
                    ) from None
                self._create_missing(path, deadline)
                continue
            except self._transient() as error:
                self._retry(error, deadline)
                continue
            return self._info(path, data, stat)

    def _parts(self, path: str) -> tuple[str | None, int]:
        parsed = parse_node_name(path.rsplit("/", 1)[1])
        assert parsed is not None
        return parsed

    def _create_missing(self, path: str, deadline: float) -> None:
        sequence, bits = self._parts(path)
        exc = self._kazoo[1]
        client = self._connected(deadline)
        try:
            self._outcome(client.create_async(path, self._initial(path), makepath=True),
                          deadline)
            logger.info("%s: created sequence %s/%d (%s)", self, sequence or "Tickets", bits,
                        path)
        except exc.NodeExistsError:
            pass  # another client made it first
        except self._transient() as error:
            self._retry(error, deadline)

    def _initial(self, path: str) -> bytes:
        """A new node's document: its mark above what this process knows to be in use (a
        node deleted under a running process comes back above the ids it issued)."""
        sequence, bits = self._parts(path)
        with self._lock:
            floor = self._nodes[path].known() if path in self._nodes else 0
        start = min(floor + self.rewind_margin if floor else 0, max_id(bits))
        return _document(start, bits, sequence, created=time.time())

    def _info(self, path: str, data: bytes, stat: Any) -> NodeInfo:
        sequence, bits = self._parts(path)
        try:
            document = json.loads(data.decode())
            last = document["last"]
            if type(last) is not int or last < 0 or document.get("bits", bits) != bits:
                raise ValueError(last)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
            raise TicketsError(
                f"node {path} on {self} does not hold a sqlalchemy-tickets mark "
                f"({data[:60]!r}): nothing was issued; move it away or choose another path"
            ) from None
        return NodeInfo(sequence, bits, last, stat.version, stat.czxid, stat.mzxid, document)

    def _snapshot(self, path: str) -> tuple[int, int | None, int, int]:
        """What this process knows of the node, taken before a read is sent: a block this
        process takes while the read is on its way may land first and be higher."""
        with self._lock:
            node = self._node(path)
            return node.known(), node.czxid, node.mzxid, node.synced

    def _accepted(self, path: str, info: NodeInfo, known: tuple[int, int | None, int, int]
                  ) -> bool:
        """Whether ``info`` is the node as it should be (not gone back in time), recording
        its identity if so."""
        if self._went_back(info, *known) is not None:
            return False
        with self._lock:
            node = self._node(path)
            if node.czxid is None or node.synced != info.synced:
                node.czxid, node.synced = info.czxid, info.synced
            node.mzxid = max(node.mzxid, info.mzxid)
        return True

    def _read_checked(self, path: str, deadline: float) -> NodeInfo:
        """The node, read for a block: a node that went back in time is healed first (or
        :class:`RewindError`)."""
        while True:
            known = self._snapshot(path)
            info = self._read(path, deadline, create=self.create_missing)
            if self._accepted(path, info, known):
                return info
            # A follower that lags behind the leader shows an older state: sync it, read again,
            # and only a node still behind is a rewind.
            self._sync(path, deadline)
            info = self._read(path, deadline, create=self.create_missing)
            if self._accepted(path, info, known):
                return info
            seen = self._went_back(info, *known)
            assert seen is not None
            self._heal(path, info, seen, deadline)

    def _pipelined(self, batch: list[tuple[int, str, int]],
                   out: list[range | TicketsError | None]) -> None:
        """One pipelined attempt at each ``(index, path, count)``: every read sent at once,
        then every conditional write; what came through cleanly is put in ``out``."""
        exc = self._kazoo[1]
        deadline = time.monotonic() + self.timeout
        try:
            client = self._connected(deadline)
        except TicketsError:
            return  # each request then meets the outage on its own
        reads = [(i, path, count, self._snapshot(path), client.get_async(path))
                 for i, path, count in batch]
        writes = []
        for i, path, count, known, result in reads:
            try:
                info = self._info(path, *self._outcome(result, deadline))
            except (exc.KazooException, TicketsError):
                continue
            if not self._accepted(path, info, known) or info.last + count > max_id(info.bits):
                continue
            doc = json.dumps(dict(info.document, last=info.last + count),
                             separators=(",", ":")).encode()
            writes.append((i, path, info, count, client.set_async(path, doc, info.version)))
        for i, path, info, count, result in writes:
            try:
                stat = self._outcome(result, deadline)
            except (exc.KazooException, TicketsError):
                continue  # lost a race, or the outcome is unknown: made again alone
            out[i] = self._granted(path, info, count, stat)

    def _granted(self, path: str, info: NodeInfo, count: int, stat: Any) -> range:
        """The block a write acknowledged by the ensemble covers, recorded."""
        new = info.last + count
        with self._lock:
            node = self._node(path)
            node.high = max(node.high, new)
            node.mzxid = max(node.mzxid, stat.mzxid)
            node.tail = (stat.version, new, info.last + 1)
            self._issued += count
        return range(info.last + 1, new + 1)

    def _went_back(
        self, info: NodeInfo, known: int, czxid: int | None, mzxid: int, synced: int
    ) -> str | None:
        """Why ``info`` shows the node went back in time (``None``: it did not)."""
        if info.synced > synced and info.last >= known:
            return None  # moved by `sync` since: taken as it is
        if czxid is not None and info.czxid != czxid:
            return (f"the node was made again (creation zxid {info.czxid:#x}, was {czxid:#x}); "
                    f"its mark is {info.last}")
        if info.last < known:
            return f"its mark ({info.last}) is below {known}, the highest id issued or in use"
        if info.mzxid < mzxid:
            return (f"its last write (zxid {info.mzxid:#x}) is older than one seen before "
                    f"({mzxid:#x}): the ensemble was restored from an older snapshot")
        return None

    def _sync(self, path: str, deadline: float) -> None:
        self._request(lambda c: c.sync_async(path), deadline)

    def _heal(self, path: str, info: NodeInfo, seen: str, deadline: float) -> bool:
        """Move the node above every floor known plus the margin (or refuse). ``False``: the
        write lost a race; the caller reads again."""
        with self._lock:
            node = self._node(path)
            floor = max(node.known(), info.last)
        table = TicketTable(info.sequence, info.bits, path)
        if self.on_rewind == "refuse":
            with self._lock:
                self._rewinds += 1
            _rewind.counted(table)
            raise _rewind.refusal(repr(self), self.url, table, seen, [floor])
        target = min(floor + self.rewind_margin, max_id(info.bits))
        doc = dict(info.document, last=target, healed_at=time.time())
        stat = self._set(path, json.dumps(doc, separators=(",", ":")).encode(), info.version,
                         deadline)
        if stat is None:
            return False
        with self._lock:
            self._rewinds += 1
            node = self._node(path)
            node.czxid, node.synced = stat.czxid, info.synced
            node.mzxid = max(node.mzxid, stat.mzxid)
        _rewind.counted(table)
        logger.warning(
            "%s: %s went back in time: %s; moved it to %d (above %d, the highest id known "
            "in use, plus %d): no id is issued twice", self, self._label(info), seen, target,
            floor, self.rewind_margin,
        )
        return True

    def _write(self, path: str, info: NodeInfo, new: int, deadline: float) -> Any:
        doc = dict(info.document, last=new)
        doc.pop("healed_at", None)
        return self._set(path, json.dumps(doc, separators=(",", ":")).encode(), info.version,
                         deadline)

    def _set(self, path: str, value: bytes, version: int, deadline: float) -> Any:
        """The conditional write: its stat once a quorum acknowledged it; ``None`` when it
        lost a race (another client's write came first) or its outcome is unknown (the
        connection or session was lost with it in flight: whatever it granted is burned)."""
        exc = self._kazoo[1]
        client = self._connected(deadline)
        try:
            return self._outcome(client.set_async(path, value, version), deadline)
        except exc.BadVersionError:
            with self._lock:
                self._conflicts += 1
            return None
        except exc.NoNodeError:
            return None  # deleted under us: read again (made again, or UnknownSequenceError)
        except self._transient() as error:
            self._retry(error, deadline)
            return None

    @property
    def session_id(self) -> int | None:
        """The ZooKeeper session this source is on now (``None``: none yet)."""
        client = self._client
        return None if client is None or client.client_id is None else client.client_id[0]

    # -- process lifecycle --------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # The parent's session, socket and threads are the parent's: forget them without a
        # word to the ensemble (closing would end the parent's session). What this process
        # knows of the nodes (marks issued, identities) holds in the child too.
        self._client = None
        self._session = _Session()
        self._lock = threading.Lock()


def _close_all() -> None:
    for source in list(_sources):
        source.close()


_process.at_exit(_close_all)
