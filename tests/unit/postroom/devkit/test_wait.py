"""wait_until: returns the condition's first truthy value, or names what it waited for."""

from __future__ import annotations

import pytest

from postroom.devkit.wait import wait_until


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, [], ["row"], ["later"]])
    calls: list[object] = []

    def condition() -> list[str] | None:
        calls.append(None)
        return next(answers)

    assert wait_until(condition, 60, "a row", poll_interval_s=0) == ["row"]
    assert len(calls) == 3


def test_a_condition_true_at_once_is_checked_once_even_without_time() -> None:
    calls: list[object] = []
    assert wait_until(lambda: calls.append(None) or 7, 0, "seven") == 7
    assert len(calls) == 1


def test_the_timeout_names_what_was_awaited() -> None:
    calls: list[object] = []
    with pytest.raises(TimeoutError, match=r"^timed out after 0s waiting for October to be sent$"):
        wait_until(lambda: calls.append(None), 0, "October to be sent")
    assert len(calls) == 1  # checked once before giving up
