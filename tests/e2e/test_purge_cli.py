"""`postroom purge` as an operator runs it: an age needs a unit, the plan (cutoff in UTC, rows by
state) is printed before anything is deleted, and a cutoff younger than the topics' retention is
refused without --force. Judged by exit code, output and the rows left in the database."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from postroom.devkit.scratch import scratch_env
from postroom.relay.db import make_engine
from postroom.relay.outbox import enqueue
from postroom.settings import Settings
from support.commands import run_postroom

pytestmark = pytest.mark.e2e

# recipient -> (status, how long ago it ended)
ROWS = {"sent-old@example.com": ("sent", "40 days"), "failed-old@example.com": ("failed", "40 days"),
        "dead-old@example.com": ("dead", "40 days"), "sent-recent@example.com": ("sent", "1 hour"),
        "pending@example.com": ("pending", "40 days")}


CUTOFF_LINE = re.compile(r"cutoff (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC \(30 days ago\): outbox "
                         r"rows that ended sent, bounced, failed, dead or suppressed before it and "
                         r"are not queued "
                         r"again")


@pytest.fixture
def engine(settings: Settings) -> Iterator[sa.Engine]:
    eng = make_engine(settings)
    yield eng
    eng.dispose()


def purge(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_postroom("purge", *args, env={**os.environ, **scratch_env(settings)},
                        timeout_s=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def left(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT recipient FROM outbox")).scalars())


@pytest.fixture
def aged_rows(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="k", subject="S", body="b", recipients=list(ROWS))
        for recipient, (status, age) in ROWS.items():
            conn.execute(sa.text("""
                UPDATE outbox SET status = :status,
                       sent_at = CASE WHEN :status = 'sent' THEN now() - CAST(:age AS interval) END,
                       updated_at = now() - CAST(:age AS interval),
                       created_at = now() - CAST(:age AS interval)
                WHERE recipient = :recipient"""), {"status": status, "age": age,
                                                   "recipient": recipient})
            if status != "pending":
                conn.execute(sa.text("DELETE FROM outbox_queue WHERE id = (SELECT id FROM outbox"
                                     " WHERE recipient = :r)"), {"r": recipient})


@pytest.mark.usefixtures("aged_rows")
@pytest.mark.parametrize("age", ["30", "30.5", " 30 ", "30x", "thirty days", "-30d", "0d", "1mo", "1M"])
def test_an_age_without_a_unit_or_with_a_bad_one_is_refused_and_deletes_nothing(
        settings: Settings, engine: sa.Engine, age: str) -> None:
    proc = purge(settings, f"--older-than={age}")
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("postroom purge: error: --older-than: ")
    if age.strip() in {"30", "30.5"}:
        assert "has no unit" in error
    if age != "0d":
        assert "30d or 30days (days), 12h (hours), 90m (minutes)" in error  # names the forms
    assert proc.stdout == ""
    assert left(engine) == set(ROWS)


@pytest.mark.usefixtures("aged_rows")
def test_purge_prints_its_plan_then_deletes_only_final_rows_past_the_cutoff(
        settings: Settings, engine: sa.Engine) -> None:
    before = dt.datetime.now(dt.UTC)
    dry = purge(settings, "--older-than", "30 days", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    match = CUTOFF_LINE.fullmatch(lines[0])
    assert match, lines[0]
    cutoff = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
    assert abs(cutoff - (before - dt.timedelta(days=30))) < dt.timedelta(minutes=1)
    assert lines[1] == "outbox: 3 row(s) to delete (1 sent, 1 failed, 1 dead)"
    assert lines[2].startswith("ledger: 0 row(s) to delete; ")
    assert lines[3] == "dry run: nothing deleted"
    assert left(engine) == set(ROWS)

    done = purge(settings, "--older-than", "30days")
    assert done.returncode == 0, done.stderr
    assert CUTOFF_LINE.fullmatch(done.stdout.splitlines()[0])
    assert done.stdout.splitlines()[1] == lines[1]  # the plan is printed before deleting
    assert done.stdout.splitlines()[-1] == "deleted 3 outbox row(s) and 0 ledger row(s)"
    assert left(engine) == {"sent-recent@example.com", "pending@example.com"}


@pytest.mark.usefixtures("aged_rows")
def test_a_cutoff_younger_than_the_retention_is_refused_without_force(
        settings: Settings, engine: sa.Engine) -> None:
    refused = purge(settings, "--older-than", "30m")
    assert refused.returncode == 1
    [error] = refused.stderr.strip().splitlines()
    assert error.startswith("postroom purge: error: --older-than 30m is younger than ")
    assert "--force" in error
    assert left(engine) == set(ROWS)

    # A dry run still shows what it would take, and says the real run needs --force.
    dry = purge(settings, "--older-than", "30m", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[1] == "outbox: 4 row(s) to delete (2 sent, 1 failed, 1 dead)"
    assert dry.stdout.splitlines()[-1].startswith("dry run: nothing deleted; --older-than 30m ")
    # One thing is called the topics' retention (retention.ms), once: the ledger's line named
    # retention.ms + segment.ms so too (issue 45 item 12: "14 days" and "7 days").
    assert len(set(re.findall(r"the topics' retention \(([^):]+)", dry.stdout))) == 1, dry.stdout
    assert left(engine) == set(ROWS)

    forced = purge(settings, "--older-than", "30m", "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[-1] == "deleted 4 outbox row(s) and 0 ledger row(s)"
    assert left(engine) == {"pending@example.com"}  # a live row never goes


def test_a_row_sent_long_ago_and_bounced_lately_is_aged_by_its_bounce(
        settings: Settings, engine: sa.Engine) -> None:
    """The age is the row's last change: sent 40 days ago, bounced an hour ago, it stays."""
    with engine.begin() as conn:
        enqueue(conn, key="b", subject="S", body="b",
                recipients=["bounced@example.com", "sent@example.com"])
        conn.execute(sa.text("""
            UPDATE outbox SET status = CASE WHEN recipient LIKE 'bounced%' THEN 'bounced'
                                             ELSE 'sent' END,
                   sent_at = now() - interval '40 days', created_at = now() - interval '40 days',
                   updated_at = CASE WHEN recipient LIKE 'bounced%' THEN now() - interval '1 hour'
                                     ELSE now() - interval '40 days' END"""))
        conn.execute(sa.text("DELETE FROM outbox_queue"))
    done = purge(settings, "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert left(engine) == {"bounced@example.com"}
