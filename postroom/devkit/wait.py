"""Waiting for a condition on the local stack: polled until it holds, or a clear timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL_S = 0.1


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, *,
               poll_interval_s: float = POLL_INTERVAL_S) -> T:
    """Call ``condition`` until it returns something truthy and return that.

    Raises TimeoutError naming ``what`` (e.g. "October to be delivered") after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_interval_s)
