"""The documentation, run as written: the operations guide's everyday procedure (dlq list, requeue,
dlq replay, lag, status, purge: its fenced block, parsed from docs/operations.md) on a pipeline
that refused and deferred the message it names, and README's `postroom status` example against
what the command prints. Docs and behaviour cannot drift apart without this failing."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.settings import Settings
from support.commands import run_postroom
from support.pipeline import Pipeline, fast_pipeline, outbox_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KEY = "sales-report-2026-09"
SUBJECT = "Sales report — September 2026"
TEAM = ["finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com"]


def fenced_blocks(markdown: str, section: str, language: str = "") -> list[list[str]]:
    """The lines of each fenced block (```language) under the heading ``section``."""
    body = markdown.split(f"\n{section}\n", 1)[1]
    body = re.split(r"\n## ", body, maxsplit=1)[0]
    return [block.splitlines() for block in
            re.findall(rf"^```{language}\n(.*?)^```$", body, re.MULTILINE | re.DOTALL)]


def procedure() -> list[list[str]]:
    """The commands of docs/operations.md's everyday procedure, each as argv after `postroom`."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    [block] = fenced_blocks(text, "## Redrive, requeue, reports, retention", "sh")
    commands = [shlex.split(line) for line in block if line.strip() and not line.startswith("#")]
    assert all(argv[0] == "postroom" for argv in commands), block
    return [argv[1:] for argv in commands]


@pytest.fixture
def server() -> Iterator[DevSmtpServer]:
    # old.manager@ is refused (failed), ops@ deferred past the two tiers (dead after 3 attempts).
    with DevSmtpServer(port=0, reject={"old.manager@example.com"},
                       defer={"ops@example.com": 3}) as s:
        yield s


@pytest.fixture
def pipeline(settings: Settings, engine: sa.Engine, server: DevSmtpServer) -> Iterator[Pipeline]:
    running = fast_pipeline(settings, engine, server.port, "doc")
    yield running
    running.stop()


def run(settings: Settings, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **scratch_env(settings),
           "POSTROOM_RETRY_DELAYS": ",".join(f"{d}s" for d in settings.retry_delays_s)}
    proc = run_postroom(*argv, env=env, timeout_s=90)
    shown = f"postroom {shlex.join(argv)}:\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stderr, shown
    return proc


def states(engine: sa.Engine) -> dict[str, str]:
    return {r.recipient: r.status for r in outbox_rows(engine, KEY)}


def test_the_operations_guides_procedure_runs_as_written(
        pipeline: Pipeline, engine: sa.Engine, server: DevSmtpServer) -> None:
    settings = pipeline.settings
    with engine.begin() as conn:
        enqueue(conn, key=KEY, recipients=TEAM, subject=SUBJECT, body="The report.")
    wait_until(lambda: states(engine) == {
        "finance@example.com": "sent", "ops@example.com": "dead",
        "old.manager@example.com": "failed", "ceo@example.com": "sent"}, 60,
        "the message to end as the guide describes it")
    with server._handler.lock:  # the causes are fixed, as the guide's comments say
        server._handler.reject.clear()

    outputs = {shlex.join(argv): run(settings, argv).stdout for argv in procedure()}
    assert [cmd.split()[0] for cmd in outputs] == [
        "dlq", "requeue", "dlq", "dlq", "lag", "status", "purge", "purge"]
    assert outputs[f"requeue --key {KEY} --recipient old.manager@example.com"].splitlines()[
        -1].startswith("requeued 1 row(s)")
    assert f"  {KEY}|ops@example.com (dead after 3 attempt(s))" in outputs[
        f"dlq replay --key {KEY} --dry-run"]
    assert outputs[f"dlq replay --key {KEY}"].splitlines()[-1].startswith("replayed 1 row(s)")
    assert outputs["purge --older-than 90d"].splitlines()[-1] == (
        "deleted 0 outbox row(s) and 0 ledger row(s)")  # nothing here is 90 days old

    wait_until(lambda: set(states(engine).values()) == {"sent"}, 60, "every row to be sent")
    assert sorted(m.rcpt for m in server.messages) == sorted(TEAM)  # each once


def test_readmes_status_example_is_what_status_prints(
        pipeline: Pipeline, engine: sa.Engine, server: DevSmtpServer) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = readme.split("```\n", 2)[1].splitlines()
    command, *shown = example
    assert command.startswith("$ postroom ")
    with server._handler.lock:  # README's ops@ went out at its third attempt
        server._handler.defer = {"ops@example.com": 2}
    with engine.begin() as conn:
        enqueue(conn, key=KEY, recipients=TEAM, subject=SUBJECT, body="The report.")
    wait_until(lambda: states(engine) == {
        "finance@example.com": "sent", "ops@example.com": "sent",
        "old.manager@example.com": "failed", "ceo@example.com": "sent"}, 60,
        "the message to end as README's example shows it")

    printed = run(pipeline.settings, shlex.split(command)[2:]).stdout.splitlines()
    assert printed[0] == shown[0]
    assert printed[1] == shown[1]  # the header, column widths and all
    assert len(printed) == len(shown)
    for got, want in zip(printed[2:], shown[2:], strict=True):
        # The same recipient, state, tries and error; the times are this run's.
        def cells(line: str) -> list[str]:
            return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "TIME", line).split()
        assert cells(got) == cells(want)
