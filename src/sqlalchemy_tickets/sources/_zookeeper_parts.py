"""The parts of :mod:`~sqlalchemy_tickets.sources.zookeeper` that need no connection: where a
sequence's node is and what it holds, the URL form, the kazoo import (on use only) and the
session listener."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from .._naming import check_bits, check_seconds, normalize_sequence
from ..errors import DriverNotInstalledError, TicketsError
from . import _rewind

#: Where sequences live unless ``path`` says otherwise.
DEFAULT_PATH = "/sqlalchemy-tickets"
#: The extra that brings kazoo.
EXTRA = "pip install sqlalchemy-tickets[zookeeper]"
#: Version of the node's JSON document.
FORMAT = 1
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

    __slots__ = ("czxid", "floor", "high", "mzxid", "synced", "tail")

    def __init__(self) -> None:
        self.czxid: int | None = None  # the node's identity when first read
        self.mzxid = 0  # the highest modification zxid seen
        self.high = 0  # the highest id issued here
        self.floor = 0  # the highest id told to be in use (ensure_above)
        self.synced = 0
        #: ``(version, last, first)`` of this source's latest block, while it is the latest
        #: it knows of: what ``give_back`` may undo.
        self.tail: tuple[int, int, int] | None = None

    def known(self) -> int:
        return max(self.high, self.floor)


def _document(last: int, bits: int, sequence: str | None, **more: Any) -> bytes:
    doc = {"format": FORMAT, "sequence": sequence, "bits": bits, "last": last, **more}
    return json.dumps(doc, separators=(",", ":")).encode()


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
