"""The commands the library prints for an operator to paste (in errors, warnings and
``status``): every argument shell-quoted, so that a URL with ``&`` or ``?`` (a multi-host
PostgreSQL URL: ``?host=h1:5432&host=h2:5432``) reaches the command whole."""

from __future__ import annotations

import shlex

PROGRAM = "sqlalchemy-tickets"


def command(*arguments: object) -> str:
    """``sqlalchemy-tickets`` with ``arguments``, each quoted for a POSIX shell."""
    return " ".join(shlex.quote(str(argument)) for argument in (PROGRAM, *arguments))


def sequence_arguments(sequence: str | None, bits: int) -> list[str]:
    """How ``sync`` names a sequence (``None``: Flickr's ``Tickets64``/``Tickets32``)."""
    if sequence is None:
        return ["--flickr", "--bits", str(bits)]
    return [sequence] if bits == 64 else ["--bits", str(bits), sequence]


def sync_command(url: str, sequence: str | None, bits: int, above: object = "N") -> str:
    """The ``sync --above`` that moves ``sequence`` on ``url`` above ``above``."""
    return command("sync", "--url", url, "--above", above, *sequence_arguments(sequence, bits))


def init_command(url: str, *arguments: str) -> str:
    """The ``init`` that makes tables on ``url``."""
    return command("init", "--url", url, *arguments)
