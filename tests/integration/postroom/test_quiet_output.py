"""A command prints its result and nothing a library says beside it: no INFO line from enqueue, no
httpx request lines from `schemas register` or `check`, no librdkafka line at the end of a command.
The real CLI as a subprocess against the local stack, its stderr counted."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import support.registry
from postroom.devkit.processes import run_postroom
from postroom.devkit.scratch import scratch_env
from postroom.settings import Settings

pytestmark = pytest.mark.integration

RUNS = 12  # librdkafka's "Purging 1 unserved events" ended 3 of 16 purge and check runs


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **scratch_env(settings)}


@pytest.fixture
def registry_env(env: dict[str, str], settings: Settings) -> Iterator[dict[str, str]]:
    url = support.registry.registry_url()
    yield {**env, "POSTROOM_SCHEMA_REGISTRY_URL": url}
    support.registry.delete_subjects(url, settings)


def test_enqueue_prints_its_result_and_no_log_line(env: dict[str, str]) -> None:
    proc = run_postroom("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S",
                        "--body", "b", env=env, timeout_s=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0, "queued 1 new of 1 recipient(s)\n", "")


def test_a_command_that_asks_the_broker_ends_without_a_librdkafka_line(env: dict[str, str]) -> None:
    # Real starts, since the line came at the interpreter's finalization; four at a time.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: run_postroom("purge", "--older-than", "30d", "--dry-run",
                                                    env=env, timeout_s=60), range(RUNS)))
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""


def test_schemas_register_and_check_print_no_http_request_lines(
        registry_env: dict[str, str]) -> None:
    register = run_postroom("schemas", "register", env=registry_env, timeout_s=60)
    assert register.returncode == 0, register.stderr
    assert len(register.stdout.splitlines()) == 9
    # Only the progress line: no `INFO httpx: HTTP Request: ...` (there were 45, 404s among them).
    assert [line.split(" ...")[0] for line in register.stderr.splitlines()] == [
        f"registering the contract for prefix {registry_env['POSTROOM_TOPIC_PREFIX']!r} at "
        f"{registry_env['POSTROOM_SCHEMA_REGISTRY_URL']} with compatibility BACKWARD"]
    check = run_postroom("check", env=registry_env, timeout_s=60)
    assert any(line.startswith("ok    registry: ") for line in check.stdout.splitlines())
    assert check.stderr == ""


def test_a_role_logs_no_http_request_lines_at_info() -> None:
    # The level a role runs at (INFO): httpx and httpcore still only say WARNING and above.
    code = ("import logging; from postroom import cli, logs; cli.configure_logging('INFO'); "
            "logs.set_level('INFO'); "
            "print([logging.getLogger(n).isEnabledFor(logging.INFO) "
            "for n in ('relay', 'httpx', 'httpcore', 'alembic')])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert proc.stdout.strip() == "[True, False, False, False]"
