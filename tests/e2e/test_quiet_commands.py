"""A command a person runs prints its result and at most a progress line: no library log line at
INFO, no librdkafka chatter, and no traceback, whatever the input (good, bad, absurd)."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from postroom.devkit.processes import run_postroom
from postroom.devkit.scratch import scratch, scratch_env
from postroom.relay.db import make_engine, upgrade
from postroom.settings import Settings

pytestmark = pytest.mark.e2e

# A log record at DEBUG or INFO as postroom.logs formats it, or librdkafka's own line
# (%<level>|<time>|...).
LIBRARY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) |^%\d\|")

COMMANDS = [
    ["status"], ["status", "--key", "nosuch"], ["status", "--limit", "0"],
    ["status", "--limit", "99999999999999999999"], ["status", "--key", "\x01\u2028'; DROP"],
    ["dlq", "list"], ["dlq", "replay", "--all", "--dry-run"], ["dlq", "replay", "--key", "x"],
    ["requeue", "--key", "nosuch"], ["requeue", "--key", "k", "--recipient", "not an address"],
    ["report", "failures"], ["report", "failures", "--since", "2026-13-45"],
    ["report", "failures", "--since", "2020-01-01", "--json"],
    ["report", "failures", "--since", "0001-01-01T00:00:00+14:00"],
    ["report", "failures", "--since", "9999-12-31T23:59:59-14:00"], ["report", "failures",
                                                                    "--since", "0001-01-01"],
    ["enqueue", "--to", "a@example.com", "--subject", "S", "--body", "b", "--send-after",
     "0001-01-01T00:00:00+14:00"],
    ["purge", "--older-than", "30"], ["purge", "--older-than", "9" * 400 + "d", "--dry-run"],
    ["purge", "--older-than", "30d", "--dry-run"], ["purge", "--older-than", "1m"],
    ["lag"], ["lag", "--group", "nobody"], ["lag", "--watch", "-1"], ["lag", "--watch", "nan"],
    ["lag", "--watch", "inf"], ["lag", "--watch", "1e308"],
    ["acls"], ["acls", "--principal-prefix", ""],
    ["enqueue", "--to", "a@example.com", "--subject", "S", "--body", "b", "--priority", "urgent"],
    ["enqueue", "--to", "bad address", "--subject", "S", "--body", "b"],
    ["enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b"],
    ["enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b", "--json"],
]


@pytest.fixture(scope="module")
def shared_settings(stack_settings: Settings) -> Iterator[Settings]:
    """One schema, topic prefix and groups for every command of COMMANDS (per xdist worker): each
    asserts only that its command is quiet, whatever the commands before it left there, so they
    need not pay for a schema and topics each."""
    with scratch(stack_settings, "t") as settings:
        engine = make_engine(settings)
        upgrade(engine, settings.database_schema)
        engine.dispose()
        yield settings


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv)[:60])
def test_a_command_prints_no_library_log_line_and_no_traceback(
        shared_settings: Settings, argv: list[str]) -> None:
    proc = run_postroom(*argv, env={**os.environ, **scratch_env(shared_settings)}, timeout_s=90)
    assert_quiet(proc)


def assert_quiet(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    noise = [line for line in proc.stderr.splitlines() if LIBRARY_LINE.search(line)]
    assert noise == [], proc.stderr
    if proc.returncode != 0:
        # A refusal is one line (argparse's usage line may precede it).
        lines = [line for line in proc.stderr.splitlines()
                 if not line.startswith(("usage:", "  ", "reading "))]
        assert len(lines) == 1, proc.stderr


@pytest.fixture
def grantless_url(settings: Settings) -> Iterator[str]:
    """POSTROOM_DATABASE_URL as a role that may use the schema and touch none of its tables (a
    grant revoked, say)."""
    role = f"postroom_grantless_{uuid.uuid4().hex[:8]}"
    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD 'grantless'"))
            conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{settings.database_schema}" TO {role}'))
        url = sa.make_url(settings.require("database_url")).set(username=role,
                                                                password="grantless")  # noqa: S106 - a throwaway role
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'REVOKE ALL ON SCHEMA "{settings.database_schema}" FROM {role}'))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        engine.dispose()


@pytest.mark.parametrize("argv", [["enqueue", "--key", "ro", "--to", "a@example.com",
                                   "--subject", "S", "--body", "b"],
                                  ["requeue", "--key", "ro"], ["status"]],
                         ids=lambda argv: argv[0])
def test_a_database_that_refuses_the_role_is_one_line(
        settings: Settings, grantless_url: str, argv: list[str]) -> None:
    """A grant missing (or a read-only standby) is an error that is not an OperationalError:
    one line naming POSTROOM_DATABASE_URL, not a traceback."""
    proc = run_postroom(*argv, env={**os.environ, **scratch_env(settings),
                                    "POSTROOM_DATABASE_URL": grantless_url}, timeout_s=90)
    assert proc.returncode == 1, proc.stderr
    assert_quiet(proc)
    assert "cannot use the database (POSTROOM_DATABASE_URL)" in proc.stderr
    assert "permission denied" in proc.stderr
