"""``postroom`` one-shot commands for the tests, each a process of its own forked from a server that
has imported postroom and its libraries once.

A ``postroom`` start spends most of its CPU importing SQLAlchemy, Alembic, psycopg and
confluent-kafka, and the suite runs a few hundred one-shot commands. Here each is a fork of
multiprocessing's fork server (one per pytest worker, started at the first command, with those
modules preloaded and no thread running), given its own argv, environment, working directory and
standard streams, and ended with ``os._exit`` after its atexit handlers have run. What a fork
does not show, and where the tests start ``postroom`` for real (postroom.devkit.processes):

- what the interpreter does at its start and its end: the imports a command makes (a job's
  light install, the roles extra missing), what librdkafka prints as its clients are finalized
  at exit (test_quiet_output, test_quiet_commands);
- the long-running roles a test signals and kills (start_postroom, PostroomProcesses);
- an environment that changes how Python starts (``PYTHON*``, the locale): such a call runs as a
  real process here too.

``POSTROOM_TEST_REAL_PROCESSES=1`` runs every command as a real process (to compare the two).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
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

from postroom.devkit.processes import postroom_command
from postroom.devkit.processes import run_postroom as run_real

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
        process = multiprocessing.get_context("forkserver").Process(
            target=_child, args=(argv, dict(env), os.getcwd(), [str(p) for p in streams]),
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


def _child(argv: list[str], env: dict[str, str], cwd: str, streams: list[str]) -> None:
    """In the forked process: become ``argv`` in ``env`` and ``cwd`` with the three streams on
    files, run the console script's main, and exit with its status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, (path, flags) in enumerate(zip(streams, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY),
                                           strict=True)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
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


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1
