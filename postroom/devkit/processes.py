"""postroom's own commands as subprocesses, as a user or a process manager runs them: one-shot
commands with their output captured, long-running ones logging to a file and stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

# A sender finishes its in-flight deliveries before it exits (see docs/operations.md).
STOP_TIMEOUT_S = 40.0
KILL_TIMEOUT_S = 5.0


class Started(Protocol):
    """A started command as the callers here use it: the part of subprocess.Popen they call."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signum: int, /) -> None: ...
    def kill(self) -> None: ...


class Starter(Protocol):
    """start_postroom's signature: how PostroomProcesses starts each command."""

    def __call__(self, *args: str, env: Mapping[str, str], log: Path) -> Started: ...


def postroom_command(*args: str) -> list[str]:
    """The argv of ``postroom ARGS``: this environment's console script, else
    ``python -m postroom.cli`` of this interpreter."""
    script = Path(sys.executable).with_name("postroom")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "postroom.cli"]
    return [*command, *args]


def run_postroom(*args: str, env: Mapping[str, str],
                 timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``postroom ARGS`` to its end; its exit status, stdout and stderr (text) are the caller's
    to judge."""
    argv = postroom_command(*args)
    return subprocess.run(argv, env=dict(env), capture_output=True, text=True,  # noqa: S603 - ours
                          timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)


def start_postroom(*args: str, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``postroom ARGS`` with its stdout and stderr appended to ``log``."""
    argv = postroom_command(*args)
    with log.open("ab") as sink:
        return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL,  # noqa: S603 - ours
                                stdout=sink, stderr=subprocess.STDOUT)


def stop_process(process: Started, timeout_s: float = STOP_TIMEOUT_S, *,
                 signalled: bool = False) -> int:
    """SIGTERM (a clean stop) unless it has exited or was ``signalled`` already (a second SIGTERM
    would interrupt its clean stop), SIGKILL after ``timeout_s``; its exit status."""
    if not signalled and process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(KILL_TIMEOUT_S)


class PostroomProcesses:
    """Named `postroom` commands as subprocesses, each logging to ``<log_dir>/<name>.log``.

    ``commands`` (name -> subcommand or argv) start on entering the context, in order; start()
    adds one later, or starts a stopped one again. On exit, or stop_all(), every one still
    running is sent SIGTERM in the reverse order, then each is waited for. Stopped processes stay
    listed, so their logs can still be read. ``starter`` starts each one (start_postroom unless
    given: the tests give one that forks them).
    """

    def __init__(self, env: Mapping[str, str], log_dir: Path,
                 commands: Mapping[str, str | Sequence[str]] | None = None, *,
                 starter: Starter = start_postroom) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._commands = dict(commands or {})
        self._starter = starter
        self.processes: dict[str, Started] = {}

    def __enter__(self) -> PostroomProcesses:
        for name, command in self._commands.items():
            self.start(name, *([command] if isinstance(command, str) else command))
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.stop_all()

    def start(self, name: str, *args: str,
              env: Mapping[str, str] | None = None) -> Started:
        """Start ``postroom ARGS`` as ``name`` (a name stopped before may start again); ``env``
        adds to or overrides the shared environment for this one (its metrics port, say)."""
        if name in self.processes and self.processes[name].poll() is None:
            raise ValueError(f"postroom {name} is running already")
        process = self._starter(*args, env={**self._env, **(env or {})},
                                 log=self.log_path(name))
        self.processes[name] = process
        return process

    def stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Stop ``name`` (see stop_process); its exit status."""
        return stop_process(self.processes[name], timeout_s)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int]:
        """Stop every process, the last started first; their exit statuses by name."""
        for process in reversed(self.processes.values()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return {name: stop_process(process, timeout_s, signalled=True)
                for name, process in self.processes.items()}

    @property
    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}

    def check_alive(self) -> None:
        """Raise ChildProcessError, with the end of its log, if a process has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise ChildProcessError(f"postroom {name} exited with status {process.returncode}:"
                                        "\n  " + "\n  ".join(self.log_tail(name)))

    def wait_logged(self, text: str, timeout_s: float, poll_s: float = 0.05) -> None:
        """Until every process has logged ``text`` (e.g. that its loop runs); TimeoutError, with
        the end of the logs, if not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not all(text in self.log(name) for name in self.processes):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"postroom {', '.join(self.processes)} did not log {text!r} "
                                   f"within {timeout_s:.0f}s:\n  " + "\n  ".join(self.log_tail()))
            time.sleep(poll_s)

    def log_path(self, name: str) -> Path:
        return self._log_dir / f"{name}.log"

    def log(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
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
