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
import re
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _process
from .._naming import TicketTable, check_bits, check_seconds, max_id, normalize_sequence
from ..errors import (
    DriverNotInstalledError,
    ExhaustedError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from . import _rewind
from ._rewind import DEFAULT_REWIND_MARGIN, RewindPolicy
from .base import Request, check_count

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

#: Where sequences live unless ``path`` says otherwise.
DEFAULT_PATH = "/sqlalchemy-tickets"
#: The extra that brings kazoo.
EXTRA = "pip install sqlalchemy-tickets[zookeeper]"
#: Version of the node's JSON document.
FORMAT = 1
#: Pause between attempts while no server answers (the call's ``timeout`` bounds them all).
_PAUSE = 0.05

_sources: weakref.WeakSet[ZooKeeperSource] = weakref.WeakSet()


def _kazoo() -> Any:
    """The kazoo modules this source uses, or :class:`DriverNotInstalledError` naming the extra."""
    try:
        import kazoo.exceptions
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError
    except ImportError:
        raise DriverNotInstalledError(
            f"ZooKeeperSource needs kazoo, the ZooKeeper client: {EXTRA}"
        ) from None
    return KazooClient, kazoo.exceptions, KazooTimeoutError


def node_name(sequence: str | None, bits: int) -> str:
    """The node of ``sequence`` (validated, folded) at ``bits`` under the source's path:
    ``photos-64``; ``Tickets64`` for ``None``. The dash keeps 32- and 64-bit sequences of one
    name apart and never occurs in a sequence name."""
    bits = check_bits(bits)
    seq = normalize_sequence(sequence)
    return f"Tickets{bits}" if seq is None else f"{seq}-{bits}"


def parse_node_name(name: str) -> tuple[str | None, int] | None:
    """``(sequence, bits)`` of a node made by :func:`node_name` (``None``: not one of ours)."""
    if name in ("Tickets64", "Tickets32"):
        return None, int(name[-2:])
    seq, dash, bits = name.rpartition("-")
    if not dash or bits not in ("32", "64"):
        return None
    try:
        if normalize_sequence(seq) != seq:
            return None
    except TicketsError:
        return None
    return seq, int(bits)


def check_path(path: object) -> str:
    """An absolute ZooKeeper path other than the root, without a trailing slash."""
    if not isinstance(path, str) or not path.startswith("/") or path.rstrip("/") == "":
        raise TicketsError(
            f"path must be an absolute ZooKeeper path such as {DEFAULT_PATH!r}, not {path!r}"
        )
    path = path.rstrip("/")
    if "//" in path or any(part in (".", "..") for part in path.split("/")[1:]):
        raise TicketsError(f"path {path!r} is not a valid ZooKeeper path")
    if path == "/zookeeper" or path.startswith("/zookeeper/"):
        raise TicketsError(f"path {path!r} is ZooKeeper's own subtree; choose another")
    return path


_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?$")
_URL_OPTIONS = {"timeout", "session_timeout", "create_missing", "on_rewind", "rewind_margin"}


def parse_url(text: str) -> dict[str, Any]:
    """The keyword arguments of the source ``zookeeper://h1:2181,h2:2181/path?timeout=2``
    names, checked with no I/O (kazoo not needed). The path defaults to
    ``/sqlalchemy-tickets``; query options: ``timeout``, ``session_timeout`` (seconds),
    ``create_missing`` (true/false), ``on_rewind`` (heal/refuse), ``rewind_margin``."""
    example = "zookeeper://h1:2181,h2:2181,h3:2181/sqlalchemy-tickets"
    scheme, sep, rest = text.partition("://")
    if scheme.lower() != "zookeeper" or not sep:
        raise TicketsError(f"invalid ZooKeeper URL {text!r}: expected e.g. {example!r}")
    rest, _, query = rest.partition("?")
    hosts, slash, path = rest.partition("/")
    members = hosts.split(",")
    for member in members:
        found = _HOST_RE.match(member)
        if not found or (found.group(2) and not 0 < int(found.group(2)[1:]) < 65536):
            raise TicketsError(f"invalid ZooKeeper URL {text!r}: {member!r} is not host:port "
                               f"(expected e.g. {example!r})")
    try:
        where = check_path(f"/{path}") if path else DEFAULT_PATH
    except TicketsError as error:
        raise TicketsError(f"invalid ZooKeeper URL {text!r}: {error}") from None
    options: dict[str, Any] = {"hosts": hosts, "path": where}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        try:
            if key not in _URL_OPTIONS:
                known = ", ".join(sorted(_URL_OPTIONS))
                raise ValueError(f"unknown option {key!r} (known: {known})")
            if key in ("timeout", "session_timeout"):
                options[key] = check_seconds(key, float(value), finite=True)
            elif key == "create_missing":
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"create_missing={value!r} is not true or false")
                options[key] = value.lower() in ("true", "1")
            elif key == "on_rewind":
                options[key] = _rewind.check_policy(value)
            else:
                options[key] = _rewind.check_margin(int(value))
        except (ValueError, TicketsError) as error:
            raise TicketsError(f"invalid ZooKeeper URL {text!r}: {error}") from None
    return options


def from_url(text: str, **options: Any) -> ZooKeeperSource:
    """The source a ``zookeeper://`` URL names (``options`` override the URL's)."""
    return ZooKeeperSource(**{**parse_url(text), **options})


@dataclass(frozen=True)
class NodeInfo:
    """One sequence node as read: its mark and what identifies the node and the write."""

    sequence: str | None
    bits: int
    last: int
    version: int
    czxid: int
    mzxid: int
    document: dict[str, Any]

    @property
    def synced(self) -> int:
        """How many times ``sync`` moved the node (a running source accepts a node whose
        identity changed once ``sync`` moved it above what it issued)."""
        value = self.document.get("synced", 0)
        return value if isinstance(value, int) else 0


class _Node:
    """What this process knows of one sequence node. Guarded by the source's lock."""

    __slots__ = ("czxid", "floor", "high", "mzxid", "synced")

    def __init__(self) -> None:
        self.czxid: int | None = None  # the node's identity when first read
        self.mzxid = 0  # the highest modification zxid seen
        self.high = 0  # the highest id issued here
        self.floor = 0  # the highest id told to be in use (ensure_above)
        self.synced = 0

    def known(self) -> int:
        return max(self.high, self.floor)


def _document(last: int, bits: int, sequence: str | None, **more: Any) -> bytes:
    doc = {"format": FORMAT, "sequence": sequence, "bits": bits, "last": last, **more}
    return json.dumps(doc, separators=(",", ":")).encode()


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
        while True:
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
                continue  # another client won the race, or the answer was lost: read again
            block = range(info.last + 1, new + 1)
            with self._lock:
                node = self._node(path)
                node.high = max(node.high, new)
                node.mzxid = max(node.mzxid, stat.mzxid)
                self._issued += count
            return block

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
        deadline = time.monotonic() + self.timeout
        client = self._connected(deadline)
        pending = [(p, client.get_async(p)) for p in paths]
        for path, result in pending:
            try:
                self._outcome(result, deadline)
            except self._kazoo[1].NoNodeError:
                self._read(path, deadline, create=self.create_missing)

    def next_blocks(self, requests: Sequence[Request]) -> list[range | TicketsError]:
        """Blocks of many sequences; each request as :meth:`next_block` (one failing does
        not fail the others). Requests of different sequences run side by side on threads
        of their own only when there are several; the session pipelines them."""
        out: list[range | TicketsError] = []
        for sequence, count, bits in requests:
            try:
                out.append(self.next_block(sequence, count, bits=bits))
            except TicketsError as error:
                out.append(error)
        return out

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
        deadline = time.monotonic() + self.timeout
        client = self._connected(deadline)
        seq = normalize_sequence(sequence)
        try:
            self._outcome(client.create_async(
                path, _document(start - 1, bits, seq, created=time.time()), makepath=True,
            ), deadline)
        except self._kazoo[1].NodeExistsError:
            return False
        return True

    def sequences(self) -> list[tuple[str | None, int]]:
        """``(sequence, bits)`` of every sequence node under ``path``, sorted."""
        deadline = time.monotonic() + self.timeout
        client = self._connected(deadline)
        try:
            names = self._outcome(client.get_children_async(self.path), deadline)
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
        KazooTimeoutError = self._kazoo[2]
        try:
            value = result.get(timeout=max(0.001, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise self._unavailable("no answer") from None
        with self._lock:
            self._round_trips += 1
        return value

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
                        f"(no node {path}): create it with `sqlalchemy-tickets init --url "
                        f"{self.url} {sequence or ''}`".rstrip() + ", or create_missing=True"
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
        with self._lock:
            floor = self._nodes[path].known() if path in self._nodes else 0
        exc = self._kazoo[1]
        client = self._connected(deadline)
        try:
            # Above what this process knows to be in use: a node deleted under a running
            # process comes back above the ids it issued.
            start = min(floor + self.rewind_margin if floor else 0, max_id(bits))
            self._outcome(client.create_async(
                path, _document(start, bits, sequence, created=time.time()), makepath=True,
            ), deadline)
            logger.info("%s: created sequence %s/%d (%s)", self, sequence or "Tickets", bits,
                        path)
        except exc.NodeExistsError:
            pass  # another client made it first
        except self._transient() as error:
            self._retry(error, deadline)

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

    def _read_checked(self, path: str, deadline: float) -> NodeInfo:
        """The node, read for a block: a node that went back in time is healed first (or
        :class:`RewindError`)."""
        while True:
            with self._lock:
                node = self._node(path)
                # As they were before the read was sent: a block this process takes while
                # the read is on its way may land first and be higher.
                known, czxid, mzxid, synced = node.known(), node.czxid, node.mzxid, node.synced
            info = self._read(path, deadline, create=self.create_missing)
            seen = self._went_back(info, known, czxid, mzxid, synced)
            if seen is None:
                with self._lock:
                    node = self._node(path)
                    if node.czxid is None or node.synced != info.synced:
                        node.czxid, node.synced = info.czxid, info.synced
                    node.mzxid = max(node.mzxid, info.mzxid)
                return info
            # A follower that lags behind the leader shows an older state: sync it, read again,
            # and only a node still behind is a rewind.
            self._sync(path, deadline)
            info = self._read(path, deadline, create=self.create_missing)
            seen = self._went_back(info, known, czxid, mzxid, synced)
            if seen is not None:
                self._heal(path, info, seen, deadline)

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
        while True:
            client = self._connected(deadline)
            try:
                self._outcome(client.sync_async(path), deadline)
                return
            except self._transient() as error:
                self._retry(error, deadline)

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


class _Session:
    """A kazoo state listener (called on kazoo's thread): ``live`` is set while connected;
    ``lost`` counts sessions that expired (kazoo then opens a new one by itself)."""

    def __init__(self) -> None:
        self.live = threading.Event()
        self.lost = 0

    def __call__(self, state: str) -> None:
        if state == "CONNECTED":
            self.live.set()
        else:  # SUSPENDED (connection lost, the session may live on), LOST (expired)
            self.live.clear()
            if state == "LOST":
                self.lost += 1


def _close_all() -> None:
    for source in list(_sources):
        source.close()


_process.at_exit(_close_all)
