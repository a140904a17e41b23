"""postroom's own commands as processes of their own, as they run in production."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from bench.report import BenchError

STOP_TIMEOUT_S = 40.0


def postroom_command() -> list[str]:
    """The `postroom` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("postroom")
    return [str(script)] if script.exists() else [sys.executable, "-m", "postroom.cli"]


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop), then SIGKILL after STOP_TIMEOUT_S."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


class PostroomProcesses:
    """`postroom` commands as subprocesses, each logging to ``<log_dir>/<name>.log``: started in
    the order given, sent SIGTERM in the reverse order on exit, then waited for."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, commands: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._commands = dict(commands)  # name -> postroom subcommand
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> PostroomProcesses:
        for name, command in self._commands.items():
            with (self._log_dir / f"{name}.log").open("wb") as log:
                self.processes[name] = subprocess.Popen(
                    [*postroom_command(), command], env=self._env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for process in reversed(self.processes.values()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            stop_process(process)

    @property
    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise BenchError(f"postroom {name} exited with status {process.returncode}:\n  "
                                 + "\n  ".join(self.log_tail(name)))

    def wait_logged(self, text: str, timeout_s: float, poll_s: float = 0.05) -> None:
        """Until every process has logged ``text`` (e.g. that its loop runs)."""
        deadline = time.monotonic() + timeout_s
        while not all(text in self.log(name) for name in self.processes):
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"postroom {', '.join(self.processes)} did not log {text!r} "
                                 f"within {timeout_s:.0f}s:\n  " + "\n  ".join(self.log_tail()))
            time.sleep(poll_s)

    def log(self, name: str) -> str:
        try:
            return (self._log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, *names: str, lines: int = 5) -> list[str]:
        """The last ``lines`` of each named process's log (of all, without names)."""
        return [line for name in (names or self.processes)
                for line in self.log(name).strip().splitlines()[-lines:]]

    def complaints(self) -> dict[str, list[str]]:
        """WARNING and ERROR lines each process logged, without their timestamps."""
        found: dict[str, list[str]] = {}
        for name in self.processes:
            lines = [line.split(" ", 2)[-1] for line in self.log(name).splitlines()
                     if " WARNING " in line or " ERROR " in line]
            if lines:
                found[name] = lines
        return found
