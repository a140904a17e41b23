"""The chaos harness starts a role again, as its supervisor would, when it exited at its start on
a refused database connection, and only then (docs/operations.md: a refused connection stops a
role at once; a supervisor restarts it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.harness import REFUSED_AT_START, SUPERVISED_STARTS, Role, Run


def _exited(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str, code: int) -> tuple[Run, list[str]]:
    run = Run.__new__(Run)  # only what supervise() reads: no stack
    run.name, run.log_dir = "scenario", tmp_path
    run.roles = {"recorder": Role("recorder", "recorder", proc=_exited(code), starts=1)}
    (tmp_path / "recorder.1.log").write_text(log)
    started: list[str] = []
    monkeypatch.setattr(Run, "start_role", lambda self, name: started.append(name))
    monkeypatch.setattr("chaos.harness.time.sleep", lambda _: None)
    return run, started


def test_a_role_refused_at_start_is_started_again_a_bounded_number_of_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, started = _run(tmp_path, monkeypatch, f"postroom recorder: {REFUSED_AT_START}: "
                        "connection to server at 127.0.0.1 failed: Connection refused\n", 1)
    for _ in range(SUPERVISED_STARTS + 2):
        run.supervise()
    assert started == ["recorder"] * SUPERVISED_STARTS


@pytest.mark.parametrize(("log", "code"), [
    ("Traceback (most recent call last):\nKeyError: 'x'\n", 1),  # a crash is the test's failure
    (f"postroom recorder: {REFUSED_AT_START}\n", 2),
])
def test_any_other_exit_is_left_for_the_run_to_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str, code: int) -> None:
    run, started = _run(tmp_path, monkeypatch, log, code)
    run.supervise()
    assert started == []
