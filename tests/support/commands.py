"""``postroom`` commands for the tests, each a process of its own forked from a server that has
imported postroom and its libraries once: one-shot commands run to their end (run_postroom,
run_all), long-running roles started and left running (start_postroom, a PostroomProcesses
starter).

A ``postroom`` start spends most of its CPU importing SQLAlchemy, Alembic, psycopg and
confluent-kafka, and the suite runs a few hundred commands. Here each is a fork of
multiprocessing's fork server (one per pytest worker, started at the first command, with those
modules preloaded and no thread running), given its own argv, environment, working directory and
standard streams (made anew, as a starting interpreter makes them), with the signal dispositions
a fresh interpreter has, and ended with ``os._exit`` after its atexit handlers have run. What a
fork does not show, and where the tests start ``postroom`` for real (postroom.devkit.processes):

- what the interpreter does at its start and its end: the imports a command makes (a job's
  light install, the roles extra missing), what librdkafka prints as its clients are finalized
  at exit (test_quiet_output, test_quiet_commands);
- an environment that changes how Python starts (``PYTHON*``, the locale): such a call runs as a
  real process here too.

``POSTROOM_TEST_REAL_PROCESSES=1`` runs every command as a real process (to compare the two).
test_forked_commands and test_forked_roles compare forked and real starts.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import io
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from postroom.devkit.processes import Started, postroom_command
from postroom.devkit.processes import run_postroom as run_real
from postroom.devkit.processes import start_postroom as start_real

# What the commands import when they run: loaded once by the fork server.
PRELOAD = ["support.commands", "postroom.entry", "postroom.cli", "postroom.cli.roles",
           "postroom.cli.admin", "postroom.cli.services", "postroom.settings", "postroom.kafka",
           "postroom.relay.db", "postroom.relay.publisher", "postroom.relay.outbox",
           "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql.psycopg", "psycopg",
           "alembic.command", "alembic.config", "alembic.runtime.migration",
           "alembic.runtime.environment", "confluent_kafka", "confluent_kafka.admin", "fastavro",
           "prometheus_client", "httpx", "aiosmtplib"]
# Read by the interpreter as it starts: a call that sets them otherwise than the server's
# environment runs as a real process.
_START_KEYS = ("PYTHON", "LC_", "LANG")

_lock = threading.Lock()
_server_env: dict[str, str] | None = None


def run_postroom(*args: str, env: Mapping[str, str], timeout_s: float | None = None,
                 input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``postroom ARGS`` to its end, as postroom.devkit.processes.run_postroom runs it (standard
    input empty unless ``input``; stdout and stderr captured as text)."""
    if not _forkable(env):
        return _run_real(args, env, timeout_s, input)
    argv = postroom_command(*args)
    with tempfile.TemporaryDirectory(prefix="postroom-command-") as tmp:
        streams = [Path(tmp, name) for name in ("stdin", "stdout", "stderr")]
        streams[0].write_text(input or "")
        for path in streams[1:]:
            path.touch()
        opened = [(str(path), flags) for path, flags in zip(
            streams, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY), strict=True)]
        process = multiprocessing.get_context("forkserver").Process(
            target=_child, args=(argv, dict(env), os.getcwd(), opened),
            name=f"postroom {' '.join(args[:1])}")
        process.start()
        process.join(timeout_s)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout_s or 0, streams[1].read_text(),
                                            streams[2].read_text())
        return subprocess.CompletedProcess(argv, process.exitcode, streams[1].read_text(),
                                           streams[2].read_text())


def run_all(runs: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout_s: float,
            ) -> list[tuple[subprocess.CompletedProcess[str], float]]:
    """Each (args, env) as run_postroom runs it, all at once; in order, each one's result and the
    seconds from the start until it ended (one killed at ``timeout_s`` ends with -SIGKILL and the
    output it had written)."""
    started = time.monotonic()

    def one(args: Sequence[str], env: Mapping[str, str],
            ) -> tuple[subprocess.CompletedProcess[str], float]:
        try:
            done = run_postroom(*args, env=env, timeout_s=timeout_s)
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(exc.cmd, -signal.SIGKILL, _text(exc.output),
                                               _text(exc.stderr))
        return done, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(max(1, len(runs))) as pool:
        return list(pool.map(lambda run: one(*run), runs))


def start_postroom(*args: str, env: Mapping[str, str], log: Path) -> Started:
    """``postroom ARGS`` started as postroom.devkit.processes.start_postroom starts it (standard
    input empty, stdout and stderr appended to ``log``), and left running: a PostroomProcesses
    starter."""
    if not _forkable(env):
        return start_real(*args, env=env, log=log)
    argv = postroom_command(*args)
    with log.open("ab"):  # created here, or refused with the real start's error
        pass
    process = multiprocessing.get_context("forkserver").Process(
        target=_child, args=(argv, dict(env), os.getcwd(),
                             [(os.devnull, os.O_RDWR), (str(log), os.O_WRONLY | os.O_APPEND),
                              None]),
        # Daemonic: one a test left running is sent SIGTERM as its pytest worker exits, where
        # multiprocessing would wait for any other child for ever.
        name=f"postroom {' '.join(args[:1])}", daemon=True)
    process.start()
    return ForkedProcess(argv, process)


class ForkedProcess:
    """A forked command as subprocess.Popen shows a started one: ``returncode`` is set by poll()
    and wait(), and is -N for a death by signal N."""

    def __init__(self, argv: list[str], process: multiprocessing.process.BaseProcess) -> None:
        assert process.pid is not None
        self.args = argv
        self.pid: int = process.pid
        self.returncode: int | None = None
        self._process = process
        # The exit status is read once from the fork server's pipe: a second reader would find
        # it empty (multiprocessing's status 255). Popen locks its waitpid the same way.
        self._reading = threading.Lock()

    def poll(self) -> int | None:
        """Its exit status, None while it runs (or while another thread reads the status)."""
        if self.returncode is None and self._reading.acquire(blocking=False):
            try:
                self._read_status()
            finally:
                self._reading.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            multiprocessing.connection.wait([self._process.sentinel], timeout)
            with self._reading:
                self._read_status()
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def _read_status(self) -> None:
        if self.returncode is None:
            self.returncode = self._process.exitcode

    def send_signal(self, sig: int) -> None:
        """As Popen's: nothing once it has exited."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it exited since
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _forkable(env: Mapping[str, str]) -> bool:
    global _server_env
    if os.environ.get("POSTROOM_TEST_REAL_PROCESSES") == "1":
        return False
    with _lock:
        if _server_env is None:  # the server starts with this process's environment
            _server_env = dict(os.environ)
            multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    keys = {key for key in {*env, *_server_env} if key.startswith(_START_KEYS)}
    return all(env.get(key) == _server_env.get(key) for key in keys)


def _run_real(args: tuple[str, ...], env: Mapping[str, str], timeout_s: float | None,
              input: str | None) -> subprocess.CompletedProcess[str]:
    if input is None:
        return run_real(*args, env=env, timeout_s=timeout_s)
    return subprocess.run(postroom_command(*args), env=dict(env), input=input,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def _child(argv: list[str], env: dict[str, str], cwd: str,
           streams: list[tuple[str, int] | None]) -> None:
    """In the forked process: become ``argv`` in ``env`` and ``cwd`` with its standard streams
    on ``streams`` (path and open flags for fd 0, 1, 2; None: the one before's open file, as
    Popen's stderr=STDOUT), run the console script's main, and exit with its status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, stream in enumerate(streams):
        if stream is None:
            os.dup2(fd - 1, fd)
            continue
        opened = os.open(*stream)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin, sys.stdout, sys.stderr = (_standard_stream(fd) for fd in range(3))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.argv = list(argv)
    code = 1
    try:
        from postroom.entry import main

        code = _exit_status(SystemExit(main()))
    except SystemExit as exc:
        code = _exit_status(exc)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught one
        traceback.print_exc()
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _standard_stream(fd: int) -> io.TextIOWrapper:
    """sys.stdin, stdout or stderr on ``fd`` as an interpreter starting in this environment makes
    it (CPython's create_stdio): the server's were made for its own descriptors, and a file is
    block-buffered where a terminal is line-buffered."""
    buffered = not os.environ.get("PYTHONUNBUFFERED")
    write = fd > 0
    binary = open(fd, "wb" if write else "rb", buffering=-1 if buffered or not write else 0,
                  closefd=False)
    raw = getattr(binary, "raw", binary)
    raw.name = f"<{('stdin', 'stdout', 'stderr')[fd]}>"  # type: ignore[misc]
    like = sys.__stderr__ if fd == 2 else sys.__stdout__  # the encoding this environment gives
    assert like is not None
    stream = io.TextIOWrapper(binary, like.encoding, like.errors, newline="\n",
                              line_buffering=buffered and (raw.isatty() or fd == 2),
                              write_through=not buffered)
    stream.mode = "w" if write else "r"  # type: ignore[misc]
    return stream


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
