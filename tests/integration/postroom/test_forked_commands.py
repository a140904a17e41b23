"""The tests' forked `postroom` commands (tests/support/commands.py) answer as a real start does:
same exit status, same stdout, same stderr, from the arguments, the environment, the working
directory and standard input the caller gave."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
from pathlib import Path

import pytest

from postroom.devkit.ports import free_port, listening
from postroom.devkit.processes import run_postroom as run_real
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.settings import Settings
from support.commands import run_postroom as run_forked

pytestmark = pytest.mark.integration


def both(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    return (run_forked(*args, env=env, timeout_s=60), run_real(*args, env=env, timeout_s=60))


@pytest.mark.parametrize("argv", [
    ["--version"],
    ["no-such-command"],
    ["enqueue", "--help"],
    ["enqueue", "--to", "a@example.com", "--subject", "S"],  # an argument missing: exit 2
    ["status", "--key", "nobody"],
    ["status", "--key", "k", "--json"],
], ids=lambda argv: " ".join(argv))
def test_a_forked_command_answers_as_a_real_start(db_settings: Settings, argv: list[str]) -> None:
    env = {**os.environ, **scratch_env(db_settings)}
    forked, real = both(*argv, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        real.returncode, real.stdout, real.stderr)


def test_the_callers_environment_is_the_commands_whole_environment(
        db_settings: Settings) -> None:
    """A variable the caller set is read (a bad port refused by name); one the server's
    environment has and the caller's lacks is not (the database URL: its own error)."""
    env = {**os.environ, **scratch_env(db_settings), "POSTROOM_SMTP_PORT": "abc"}
    forked, real = both("status", env=env)
    assert forked.returncode == real.returncode == 2
    assert forked.stderr == real.stderr
    assert "POSTROOM_SMTP_PORT" in forked.stderr
    without = {k: v for k, v in env.items() if k not in ("POSTROOM_DATABASE_URL",
                                                         "POSTROOM_SMTP_PORT")}
    forked, real = both("status", env=without)
    assert (forked.returncode, forked.stderr) == (real.returncode, real.stderr)
    assert "POSTROOM_DATABASE_URL" in forked.stderr


def test_standard_input_and_the_working_directory_are_the_callers(
        db_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("body.txt").write_text("from a file in the working directory\n")
    env = {**os.environ, **scratch_env(db_settings)}
    queued = [run_forked("enqueue", "--key", "k", "--to", f"{who}@example.com", "--subject", "S",
                         *source, env=env, timeout_s=60, input="from standard input\n")
              for who, source in (("a", ["--body-file", "body.txt"]),
                                  ("b", ["--body-file", "/dev/stdin"]))]
    assert [proc.returncode for proc in queued] == [0, 0], [proc.stderr for proc in queued]
    shown = run_forked("status", "--key", "k", "--json", env=env, timeout_s=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count('"recipient"') == 2


def test_a_command_past_its_timeout_is_killed() -> None:
    assert run_forked("--version", env=dict(os.environ), timeout_s=60).returncode == 0  # warm
    port = free_port()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_forked, "devsmtp", "--port", str(port), env=dict(os.environ),
                              timeout_s=10)
        wait_until(lambda: listening(port), 10, "the forked devsmtp to listen")
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            running.result()
    assert raised.value.timeout == 10
    with pytest.raises(ConnectionRefusedError):  # the server it ran is gone with it
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
