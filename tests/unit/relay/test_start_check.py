"""A role's start-up schema check asks again while the server ends its session, and only then."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import psycopg
import pytest
import sqlalchemy as sa

from postroom.relay.db import check_schema_at_start


def _failing(errors: list[Exception]) -> tuple[list[int], Callable[[sa.Engine], None]]:
    calls: list[int] = []

    def check(_: sa.Engine) -> None:
        calls.append(1)
        if errors:
            raise errors.pop(0)

    return calls, check


def _operational(orig: Exception) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, orig)


ENGINE = cast(sa.Engine, object())


def _no_pause(seconds: float) -> None:
    raise AssertionError(f"paused {seconds}s before raising")


@pytest.mark.parametrize("ended", [psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown])
def test_a_session_the_server_ended_is_checked_again(ended: type[Exception]) -> None:
    calls, check = _failing([_operational(ended("terminating connection"))] * 2)
    pauses: list[float] = []
    check_schema_at_start(ENGINE, check=check, sleep=pauses.append, pause_s=0.5)
    assert len(calls) == 3
    assert pauses == [0.5, 0.5]


@pytest.mark.parametrize("other", [
    psycopg.errors.InvalidPassword("password authentication failed"),
    psycopg.OperationalError("connection failed: connection refused"),  # no SQLSTATE
])
def test_any_other_failure_raises_at_once(other: Exception) -> None:
    refused = _operational(other)
    calls, check = _failing([refused])
    with pytest.raises(sa.exc.OperationalError) as raised:
        check_schema_at_start(ENGINE, check=check, sleep=_no_pause)
    assert raised.value is refused
    assert len(calls) == 1


def test_a_server_that_keeps_ending_the_session_fails_after_the_last_try() -> None:
    calls, check = _failing([_operational(psycopg.errors.AdminShutdown("x"))] * 10)
    with pytest.raises(sa.exc.OperationalError):
        check_schema_at_start(ENGINE, check=check, sleep=lambda _: None, tries=4)
    assert len(calls) == 4
