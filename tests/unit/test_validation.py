"""Bad input is refused at construction, with a message that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import TicketId, TicketsError, TicketServer, TicketServers, configure
from sqlalchemy_tickets._naming import check_stride, first_id, ticket_table


@pytest.mark.parametrize(
    "name",
    ["", "bad-name", "1photos", "photos;drop table x", "x" * 41, "ph otos", "naïve", "_hidden"],
)
def test_invalid_sequence_names_are_refused(name: str) -> None:
    with pytest.raises(TicketsError, match="invalid sequence name"):
        TicketId(name)


@pytest.mark.parametrize("bits", [0, 16, 63, 128, True, "64", None])
def test_bits_other_than_32_or_64_are_refused(bits: object) -> None:
    with pytest.raises(TicketsError, match="bits must be 32 or 64"):
        TicketId("photos", bits=bits)  # type: ignore[arg-type]


def test_errors_are_value_errors() -> None:
    assert issubclass(TicketsError, ValueError)


def test_sequence_names_are_case_insensitive() -> None:
    assert ticket_table("Photos") == ticket_table("photos") == ticket_table("PHOTOS")
    assert ticket_table("Photos").name == "tickets__photos"


def test_flickr_tables_keep_flickr_names() -> None:
    assert ticket_table(None, 64).name == "Tickets64"
    assert ticket_table(None, 32).name == "Tickets32"


def test_ticket_tables_never_take_an_application_table_name() -> None:
    # An application table named exactly like the sequence, or with one underscore, stays free.
    assert ticket_table("photos").name not in {"photos", "tickets_photos", "Photos"}


@pytest.mark.parametrize("template", ["tickets", "{sequence}_{sequence}", "bad name {sequence}"])
def test_bad_table_templates_are_refused(template: str) -> None:
    with pytest.raises(TicketsError, match="template"):
        TicketServer("sqlite://", table_template=template)


def test_table_template_is_overridable() -> None:
    assert ticket_table("Photos", template="seq_{sequence}_ids").name == "seq_photos_ids"


@pytest.mark.parametrize("url", ["not a url", "nosuchdialect://x", ""])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(TicketsError):
        TicketServer(url)


def test_timeout_must_be_positive() -> None:
    with pytest.raises(TicketsError, match="timeout"):
        TicketServer("sqlite://", timeout=0)


def test_ticket_servers_need_a_list() -> None:
    with pytest.raises(TicketsError, match="non-empty list"):
        TicketServers([])
    with pytest.raises(TicketsError, match="non-empty list"):
        TicketServers("sqlite://")  # type: ignore[arg-type]


def test_configure_refuses_what_is_not_a_source() -> None:
    with pytest.raises(TicketsError, match="not a ticket source"):
        configure(42)  # type: ignore[arg-type]
    configure(None)


def test_source_must_be_a_source() -> None:
    with pytest.raises(TicketsError, match="not a ticket source"):
        TicketId("photos", source=object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "increment", "offset", "first"),
    [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 2), (10, 3, 2, 11), (11, 3, 2, 11), (5, 4, 4, 8)],
)
def test_first_id_is_smallest_at_or_above_start_with_the_offset(
    start: int, increment: int, offset: int, first: int
) -> None:
    assert first_id(start, increment, offset) == first
    assert first % increment == offset % increment and first >= start


@pytest.mark.parametrize(
    ("start", "increment", "offset", "message"),
    [(1, 0, 1, "increment"), (1, 2, 3, "offset"), (1, 2, 0, "offset"), (0, 1, 1, "start"),
     (2**31, 1, 1, "start")],
)
def test_bad_strides_are_refused(start: int, increment: int, offset: int, message: str) -> None:
    with pytest.raises(TicketsError, match=message):
        check_stride(start, increment, offset, 32)


def test_block_size_must_be_positive(tmp_path: Path) -> None:
    server = TicketServer(f"sqlite:///{tmp_path / 'tickets.db'}")
    for count in (0, -1, 1.5, True):
        with pytest.raises(TicketsError, match="count"):
            server.next_block("photos", count)  # type: ignore[arg-type]
    assert sa.inspect(server.engine).get_table_names() == []  # refused before anything was written
    server.close()


def test_storage_types_follow_bits() -> None:
    assert isinstance(TicketId("a").impl, sa.BigInteger)
    assert isinstance(TicketId("a", bits=32).impl, sa.Integer)
    assert not isinstance(TicketId("a", bits=32).impl, sa.BigInteger)
    assert repr(TicketId("Photos", bits=32)) == "TicketId('photos', bits=32)"
    assert repr(TicketId()) == "TicketId()"
