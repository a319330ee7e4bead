"""Whether a missing server or package fails the run or skips its tests: with
``TICKETS_TEST_REQUIRE_ALL=1`` or ``CI`` set every backend and every server the fixtures start
(Galera, ZooKeeper, PgBouncer, Patroni) must be there, and a missing one is a failure; on a
developer machine its tests are skipped with the reason."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["require_all", "unavailable"]


def require_all() -> bool:
    """True when something unavailable must fail the run instead of skipping its tests."""
    if os.environ.get("TICKETS_TEST_REQUIRE_ALL", "").strip() == "1":
        return True
    return os.environ.get("CI", "").strip().lower() in ("1", "true")


def unavailable(reason: str, what_to_do: str = "") -> NoReturn:
    """Fail (CI / require-all) or skip (a developer machine) because of ``reason``;
    ``what_to_do``, said on failure, ends with ``"; "`` or ``", so "``."""
    if require_all():
        pytest.fail(
            f"{reason}\n(TICKETS_TEST_REQUIRE_ALL=1 or CI is set: {what_to_do}this is a "
            "failure, not a skip)",
            pytrace=False,
        )
    pytest.skip(reason)
