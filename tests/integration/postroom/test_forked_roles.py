"""The tests' forked long-running `postroom` roles (tests/support/commands.py start_postroom)
behave as a real start does: they run, log the same lines to their file, take the same signals,
stop on SIGTERM with the same status, die by SIGKILL as -9, and a role refused at its start
exits with the same status and log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from postroom.devkit.processes import Started, stop_process
from postroom.devkit.processes import start_postroom as start_real
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.settings import Settings
from support.commands import ForkedProcess
from support.commands import start_postroom as start_forked

pytestmark = pytest.mark.integration

STARTED = "relay started"
# A log line's time (the logging format's, to the millisecond) and a pid
VARYING = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} |\bpid=\d+")


def both(tmp_path: Path, *args: str, env: dict[str, str]) -> tuple[Started, Started]:
    """``postroom ARGS`` forked and real, logging to forked.log and real.log in ``tmp_path``."""
    forked = start_forked(*args, env=env, log=tmp_path / "forked.log")
    assert isinstance(forked, ForkedProcess)  # not the real fallback
    return forked, start_real(*args, env=env, log=tmp_path / "real.log")


def logs(tmp_path: Path) -> tuple[str, str]:
    forked, real = ((tmp_path / f"{name}.log").read_text(errors="replace")
                    for name in ("forked", "real"))
    return forked, real


def wait_started(tmp_path: Path, *processes: Started) -> None:
    def started() -> bool:
        assert all(process.poll() is None for process in processes), logs(tmp_path)
        return all(STARTED in log for log in logs(tmp_path))
    wait_until(started, 60, "both relays to start")


def lines(log: str) -> list[str]:
    return [VARYING.sub("", line) for line in log.splitlines()]


def signal_state(pid: int) -> dict[str, str]:
    """The kernel's view of a process's signals: blocked, ignored and caught, as bit masks."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in status
                if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


@pytest.fixture(autouse=True)
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked here even in a run with POSTROOM_TEST_REAL_PROCESSES=1: the fork is what is
    compared."""
    monkeypatch.delenv("POSTROOM_TEST_REAL_PROCESSES", raising=False)


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **scratch_env(settings), "POSTROOM_LOG_LEVEL": "INFO"}


def test_a_forked_relay_runs_and_stops_on_sigterm_as_a_real_one(
        env: dict[str, str], tmp_path: Path) -> None:
    forked, real = both(tmp_path, "relay", env=env)
    try:
        wait_started(tmp_path, forked, real)
        assert signal_state(forked.pid) == signal_state(real.pid)
    finally:
        codes = [stop_process(process, timeout_s=30) for process in (forked, real)]
    forked_log, real_log = logs(tmp_path)
    assert codes == [0, 0], (forked_log, real_log)
    assert lines(forked_log) == lines(real_log)
    assert "received SIGTERM, stopping cleanly" in forked_log


def test_a_forked_relay_killed_dies_by_sigkill(env: dict[str, str], tmp_path: Path) -> None:
    forked, real = both(tmp_path, "relay", env=env)
    try:
        wait_started(tmp_path, forked, real)
    finally:
        for process in (forked, real):
            process.kill()
    assert [process.wait(30) for process in (forked, real)] == [-signal.SIGKILL] * 2
    assert [process.returncode for process in (forked, real)] == [-signal.SIGKILL] * 2
    forked.send_signal(signal.SIGTERM)  # as Popen's: nothing, it has exited


def test_a_forked_role_refused_at_its_start_exits_and_logs_as_a_real_one(
        env: dict[str, str], tmp_path: Path) -> None:
    for name in ("forked", "real"):
        (tmp_path / f"{name}.log").write_text("an earlier run's line\n")
    forked, real = both(tmp_path, "relay", env={**env, "POSTROOM_RELAY_BATCH_SIZE": "many"})
    assert [process.wait(60) for process in (forked, real)] == [2, 2]
    forked_log, real_log = logs(tmp_path)
    assert forked_log == real_log
    assert forked_log.startswith("an earlier run's line\n")  # appended to
    assert "POSTROOM_RELAY_BATCH_SIZE" in forked_log


def test_a_forked_role_not_yet_ended_times_out_as_popen_does(tmp_path: Path) -> None:
    log = tmp_path / "devsmtp.log"
    started = start_forked("devsmtp", "--port", "0", env=dict(os.environ), log=log)
    try:
        wait_until(lambda: "listening" in log.read_text(), 60, "devsmtp to listen")
        with pytest.raises(subprocess.TimeoutExpired):
            started.wait(0.1)
        assert started.poll() is None
    finally:
        assert stop_process(started, timeout_s=30) == 0


def test_an_environment_that_changes_how_python_starts_starts_a_real_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "version.log"
    other = {**os.environ, "PYTHONHASHSEED": "7" if os.environ.get("PYTHONHASHSEED") != "7"
             else "8"}
    started = [start_forked("--version", env=other, log=log)]
    monkeypatch.setenv("POSTROOM_TEST_REAL_PROCESSES", "1")
    started.append(start_forked("--version", env=dict(os.environ), log=log))
    assert [type(process) for process in started] == [subprocess.Popen] * 2
    assert [process.wait(60) for process in started] == [0, 0]
