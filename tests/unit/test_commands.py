"""The commands the library prints for an operator to paste are shell-quoted: ``shlex.split``
of each gives back the argv it means, a URL with ``&`` (a multi-host PostgreSQL URL) whole."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from sqlalchemy_tickets import RewindError, TicketServer
from sqlalchemy_tickets._commands import init_command, sync_command
from sqlalchemy_tickets._naming import ticket_table
from sqlalchemy_tickets.cli import main
from sqlalchemy_tickets.sources import _rewind

MULTI = "postgresql+psycopg://app@/tickets?host=h1:5432&host=h2:5432&target_session_attrs=any"


def shell_words(text: str) -> list[str]:
    """``text`` split as a POSIX shell splits it: ``shlex.split``, and the same with the
    shell's control operators (``&``, ``;``, ``|``...) as words of their own — where one is
    not quoted, the shell ends the command there (``&``: in the background)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    assert words == shlex.split(text), f"a control operator is not quoted in {text!r}"
    return words


def pasted(message: str, subcommand: str) -> list[str]:
    """The argv of the ``sqlalchemy-tickets SUBCOMMAND ...`` between backticks in
    ``message``, as a shell would split it."""
    found = re.findall(rf"`(sqlalchemy-tickets {subcommand}[^`]*)`", message)
    assert found, message
    return shell_words(found[0])


def test_sync_command_round_trips_through_a_shell() -> None:
    argv = ["sqlalchemy-tickets", "sync", "--url", MULTI, "--above", "N", "photos"]
    assert shell_words(sync_command(MULTI, "photos", 64)) == argv
    assert shell_words(sync_command(MULTI, "photos", 32, 7)) == [
        *argv[:5], "7", "--bits", "32", "photos"]
    assert shell_words(sync_command(MULTI, None, 64))[-3:] == ["--flickr", "--bits", "64"]
    assert shell_words(init_command(MULTI, "SEQUENCE", "...")) == [
        "sqlalchemy-tickets", "init", "--url", MULTI, "SEQUENCE", "..."]


@pytest.mark.parametrize("sequence", ["photos", None])
def test_a_refusal_names_a_command_that_pastes_whole(sequence: str | None) -> None:
    error = _rewind.refusal("server", MULTI, ticket_table(sequence, 64), "seen", [5])
    argv = pasted(str(error), "sync")
    assert argv[:6] == ["sqlalchemy-tickets", "sync", "--url", MULTI, "--above", "N"]
    assert argv[6:] == (["photos"] if sequence else ["--flickr", "--bits", "64"])


def test_a_refusal_and_status_in_a_directory_with_an_ampersand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real refusal (a fresh process on a replaced SQLite file) whose URL holds ``&``."""
    folder = tmp_path / "a&b c"
    folder.mkdir()
    url = f"sqlite:///{folder / 'tickets.db'}"
    writer = TicketServer(url)
    writer.next_block("photos", 10)
    writer.close()
    shutil.copy(folder / "tickets.db", folder / "copy.db")
    os.replace(folder / "copy.db", folder / "tickets.db")  # a new inode: another identity
    fresh = TicketServer(url)
    try:
        with pytest.raises(RewindError) as refused:
            fresh.next_id("photos")
    finally:
        fresh.close()
    argv = pasted(str(refused.value), "sync")
    assert argv[:3] == ["sqlalchemy-tickets", "sync", "--url"]
    assert make_url(argv[3]).database == str(folder / "tickets.db")  # the URL whole
    assert argv[4:] == ["--above", "N", "photos"]

    # status flags the changed identity with the same command.
    assert main(["status", "--url", url]) == 3
    argv = pasted(capsys.readouterr().err, "sync")
    assert make_url(argv[3]).database == str(folder / "tickets.db")
    assert argv[4:] == ["--above", "N", "photos"]
