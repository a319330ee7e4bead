"""Which PostgreSQL replication settings make every commit wait for every standby a failover
may promote (``dialects/postgresql.protects``): what decides whether a failover is trusted to
have lost nothing. Tried against a real primary and standby in ``test_sync_failover.py``."""

from __future__ import annotations

import pytest

from sqlalchemy_tickets.dialects.postgresql import protects


@pytest.mark.parametrize("names", [
    "standby1", '"standby1"', "FIRST 1 (standby1)", "1 (standby1)", "ANY 2 (s1, s2)",
    "first 2 (s1, s2)", " ANY 1 ( s1 ) ",
])
@pytest.mark.parametrize("level", ["on", "remote_apply", "remote_write"])
def test_every_standby_waited_for(names: str, level: str) -> None:
    assert protects(names, level)


@pytest.mark.parametrize("names", [
    "", "  ", "*", "FIRST 1 (*)", "ANY 1 (s1, s2)", "FIRST 1 (s1, s2)", "s1, s2",
    "1 (s1, s2)", "ANY 1 (*, s1)",
])
def test_a_standby_that_may_not_have_every_commit(names: str) -> None:
    assert not protects(names, "on")


@pytest.mark.parametrize("level", ["local", "off"])
def test_commits_that_do_not_wait(level: str) -> None:
    assert not protects("standby1", level)
