"""`python -m bench` stopped by SIGTERM cleans up as after Ctrl-C: the signal becomes an exception
that unwinds each part's scratch (its `finally`), not an exit on the spot."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from bench.__main__ import stop_on_sigterm


@pytest.fixture
def restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    # Ignored until the test installs its handler: without one the signal fails the test
    # instead of killing pytest.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_unwinds_the_run_with_the_signals_exit_status(
        restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    stop_on_sigterm()
    cleaned = []
    with pytest.raises(SystemExit) as stopped:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as this call returns
        finally:
            cleaned.append("scratch removed")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert cleaned == ["scratch removed"]
    assert "stopped by signal 15: removing what this run made" in capsys.readouterr().err
