"""postroom commands as subprocesses, with commands that need no service: --version and --help."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from postroom import __version__
from postroom.devkit.processes import PostroomProcesses, run_postroom, start_postroom, stop_process


def test_run_postroom_returns_what_the_command_printed() -> None:
    done = run_postroom("--version", env=os.environ, timeout_s=60)
    assert (done.returncode, done.stdout) == (0, f"postroom {__version__}\n")
    refused = run_postroom("no-such-command", env=os.environ, timeout_s=60)
    assert refused.returncode == 2
    assert "invalid choice: 'no-such-command'" in refused.stderr


def test_start_postroom_appends_both_streams_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "version.log"
    log.write_text("earlier run\n")
    assert start_postroom("--version", env=os.environ, log=log).wait(60) == 0
    finished = start_postroom("nothing", env=os.environ, log=log)
    finished.wait(60)
    assert stop_process(finished) == 2  # exited already: its status, no signal
    text = log.read_text()
    assert text.startswith(f"earlier run\npostroom {__version__}\n")
    assert "invalid choice: 'nothing'" in text  # stderr, in the same file


def test_an_exited_process_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    processes = PostroomProcesses(os.environ, tmp_path, {"bad": ["status", "--limit", "x"]})
    with processes:
        processes.processes["bad"].wait(60)
        with pytest.raises(ChildProcessError, match=r"postroom bad exited with status 2:\n"
                                                    r"(.|\n)*not a whole number: 'x'"):
            processes.check_alive()
        with pytest.raises(ChildProcessError):
            processes.wait_logged("never printed", timeout_s=60)
    assert processes.stop_all() == {"bad": 2}
    assert "not a whole number" in processes.log("bad")  # still readable once stopped


def test_a_process_started_with_its_own_env_gets_it_on_top_of_the_shared_one(
        tmp_path: Path) -> None:
    shared = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    with PostroomProcesses(shared, tmp_path) as processes:
        processes.start("plain", "status")
        processes.start("own", "status", env={"POSTROOM_METRICS_PORT": "notaport"})
        for name in ("plain", "own"):
            processes.processes[name].wait(60)
    assert "POSTROOM_DATABASE_URL: is not set" in processes.log("plain")
    assert "POSTROOM_METRICS_PORT: expected a whole number" in processes.log("own")


class _Exited:
    """A started command that has exited 0."""

    pid = 1
    returncode = 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def send_signal(self, signum: int, /) -> None:
        raise AssertionError("an exited process is not signalled")

    def kill(self) -> None:
        raise AssertionError("an exited process is not killed")


def test_the_processes_are_started_by_the_starter_given(tmp_path: Path) -> None:
    calls: list[tuple[tuple[str, ...], str, str | None, Path]] = []

    def starter(*args: str, env: Mapping[str, str], log: Path) -> _Exited:
        calls.append((args, env["SHARED"], env.get("OWN"), log))
        return _Exited()

    with PostroomProcesses({"SHARED": "s"}, tmp_path, {"first": "relay"},
                           starter=starter) as processes:
        processes.start("second", "sender", "--x", env={"OWN": "o"})
    assert calls == [(("relay",), "s", None, tmp_path / "first.log"),
                     (("sender", "--x"), "s", "o", tmp_path / "second.log")]
    assert processes.stop_all() == {"first": 0, "second": 0}
