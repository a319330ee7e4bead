"""The library's own exceptions. Every one is a :class:`TicketsError`, itself a ``ValueError``
subclass so that bad arguments can be caught the way Python code usually catches them."""

from __future__ import annotations

__all__ = [
    "CommitOutcomeUnknownError",
    "DatabaseUnavailable",
    "DriverNotInstalledError",
    "ExhaustedError",
    "RewindError",
    "StrideMismatchError",
    "TicketServerUnavailable",
    "TicketsError",
    "UnknownSequenceError",
]


class TicketsError(ValueError):
    """Base class of every error raised by sqlalchemy-tickets."""


class ExhaustedError(TicketsError):
    """A sequence cannot issue the ids asked for without passing its bit width.

    ``remaining`` is how many ids the sequence can still issue, when the source knows it.
    """

    def __init__(self, message: str, *, remaining: int | None = None) -> None:
        super().__init__(message)
        self.remaining = remaining


class StrideMismatchError(TicketsError):
    """A ticket server's increment/offset disagrees with its position among its peers.

    Issuing ids from it could duplicate ids issued by another server, so nothing is issued.
    """


class UnknownSequenceError(TicketsError):
    """The ticket table of a sequence does not exist and the source may not create it."""


class DatabaseUnavailable(TicketsError):
    """A database the library reaches on connections of its own (a ticket server, a worker
    lease database) refused, dropped or did not answer within its timeout."""


class TicketServerUnavailable(DatabaseUnavailable):
    """A ticket server refused, dropped or did not answer within its timeout."""


class RewindError(TicketsError):
    """A ticket database went back in time (restored from a backup, replaced by a replica that
    had not seen its last writes, or behind ids already in use) and the source knows no floor it
    can trust to move the sequence above: nothing was issued.

    The message names the server, the sequence, what was seen and the command that fixes it
    (``sqlalchemy-tickets sync --url URL --above N SEQUENCE``); after it, issuing resumes, in
    running processes too.
    """

    #: Whether a cache or a tier logged it at WARNING already: the layers it reaches above
    #: (a cache over a tier, a cache over a cache) say it again at INFO, not WARNING.
    logged: bool = False


class DriverNotInstalledError(TicketsError):
    """The driver a database URL needs is not installed (the message says what to install):
    a matter of the environment, not of the URL."""


class CommitOutcomeUnknownError(TicketsError):
    """A COMMIT failed without an answer, and the unit updated or deleted rows: whether it was
    applied is unknown, and replaying or re-running it could lose or double an update."""
