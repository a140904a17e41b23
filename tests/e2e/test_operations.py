"""The operators' commands on the real stack: dlq list and replay, requeue, report failures and
purge, run as a user runs them (subprocesses), against a pipeline delivering to a dev SMTP
server. Each says what it will do and what it did, and running it twice changes nothing more."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import email
import email.message
import email.policy
import io
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.relay.report import BODY_MAX_LINES
from postroom.settings import Settings, TlsMode
from support.commands import run_postroom
from support.pipeline import Pipeline, fast_pipeline, outbox_rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FINAL = {"sent", "failed", "dead"}


def postroom(settings: Settings, *args: str,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POSTROOM_DATABASE_SCHEMA": settings.database_schema or "",
           "POSTROOM_TOPIC_PREFIX": settings.topic_prefix,
           "POSTROOM_RETRY_DELAYS": ",".join(f"{d}s" for d in settings.retry_delays_s),
           **(extra_env or {})}
    proc = run_postroom(*args, env=env, timeout_s=90)
    assert proc.returncode == 0, f"postroom {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def lines(settings: Settings, *args: str) -> list[str]:
    return postroom(settings, *args).stdout.splitlines()


@pytest.fixture
def server() -> Iterator[DevSmtpServer]:
    # old@ is refused (550: failed), slow@ is deferred four times (dead after three attempts).
    with DevSmtpServer(port=0, reject={"old@example.com"}, defer={"slow@example.com": 4}) as s:
        yield s


@pytest.fixture
def pipeline(settings: Settings, engine: sa.Engine, server: DevSmtpServer) -> Iterator[Pipeline]:
    running = fast_pipeline(settings, engine, server.port, "ops")
    yield running
    running.stop()


def statuses(engine: sa.Engine, key: str) -> dict[str, tuple[str, int, str | None]]:
    return {r.recipient: (r.status, r.attempts, r.last_error) for r in outbox_rows(engine, key)}


def settle(engine: sa.Engine, key: str, expected: dict[str, str]) -> dict[str, Any]:
    return wait_until(lambda: (s := statuses(engine, key)) and {
        k: v[0] for k, v in s.items()} == expected and s, 60, f"rows of {key} to be {expected}")


def test_dlq_list_replay_and_requeue_send_once_with_a_fresh_budget(
        pipeline: Pipeline, engine: sa.Engine, server: DevSmtpServer) -> None:
    settings = pipeline.settings
    with engine.begin() as conn:
        enqueue(conn, key="report-11", subject="Report", body="b",
                recipients=["ok@example.com", "old@example.com", "slow@example.com"])
    rows = settle(engine, "report-11", {"ok@example.com": "sent", "old@example.com": "failed",
                                        "slow@example.com": "dead"})
    assert rows["slow@example.com"][1] == 3  # the first try and two tiers

    # dlq list: both dead letters, why, and that their rows can be replayed.
    listed = [json.loads(line) for line in lines(settings, "dlq", "list", "--json")]
    by_key = {row["key"]: row for row in listed}
    assert set(by_key) == {"report-11|old@example.com", "report-11|slow@example.com"}
    assert (by_key["report-11|old@example.com"]["classification"],
            by_key["report-11|old@example.com"]["row_status"]) == ("permanent", "failed")
    slow = by_key["report-11|slow@example.com"]
    assert (slow["classification"], slow["attempts"], slow["replayable"]) == (
        "transient-exhausted", 3, True)
    text = lines(settings, "dlq", "list")
    assert text[-1] == "2 dead letter(s), 2 replayable with `postroom dlq replay`"

    # A dry run says what it would do and does nothing.
    dry = lines(settings, "dlq", "replay", "--key", "report-11|slow@example.com", "--dry-run")
    assert dry == ["will replay 1 row(s):",
                   "  report-11|slow@example.com (dead after 3 attempt(s))",
                   "dry run: nothing changed"]
    assert statuses(engine, "report-11")["slow@example.com"][0] == "dead"

    # Replay: slow@ is deferred once more (its fourth attempt) and needs its fresh budget: the
    # retry tier of attempt 4 is tier 1 again, and attempt 5 is accepted.
    done = lines(settings, "dlq", "replay", "--key", "report-11|slow@example.com")
    assert done[-1].startswith("replayed 1 row(s)")
    again = lines(settings, "dlq", "replay", "--key", "report-11|slow@example.com")
    assert (again[0], again[-1]) == ("will replay 0 row(s)", "replayed nothing")
    assert again[1].startswith("  skip report-11|slow@example.com: row is ")
    # The row is on its way again: the skip says its state, not that it was replayed.
    assert again[1].split(": ", 1)[1].startswith((
        "row is pending: queued to be sent again already", "row is published: no final state",
        "row is retrying: a retry is scheduled", "row is sent: delivered since")), again[1]
    rows = settle(engine, "report-11", {"ok@example.com": "sent", "old@example.com": "failed",
                                        "slow@example.com": "sent"})
    _status, attempts, last_error = rows["slow@example.com"]
    assert attempts == 5  # the history goes on: three attempts, then two more
    assert last_error is not None and "451" in last_error
    assert server.count("slow@example.com") == 1

    # The address of old@ was fixed; requeue sends it once, and a second requeue does nothing.
    with server._handler.lock:
        server._handler.reject.clear()
    dry = lines(settings, "requeue", "--key", "report-11", "--recipient", "OLD@example.com",
                "--dry-run")
    assert dry == ["will requeue 1 row(s):", "  report-11|old@example.com (failed after 1 "
                   "attempt(s))", "dry run: nothing changed"]
    assert lines(settings, "requeue", "--key", "report-11")[-1].startswith("requeued 1 row(s)")
    again = lines(settings, "requeue", "--key", "report-11")
    assert (again[0], again[-1]) == ("will requeue 0 row(s)", "requeued nothing")
    # It says what the rows are now (old@'s requeued row may be pending, published or sent).
    assert again[1].startswith(
        "  skip report-11: no failed or dead row (nothing to send again; "), again
    rows = settle(engine, "report-11", {"ok@example.com": "sent", "old@example.com": "sent",
                                        "slow@example.com": "sent"})
    assert rows["old@example.com"][1] == 2
    assert [server.count(a) for a in ("ok@example.com", "old@example.com",
                                      "slow@example.com")] == [1, 1, 1]
    # Nothing left to replay: every dead letter's row is sent now.
    assert lines(settings, "dlq", "replay", "--all")[-1] == "replayed nothing"
    assert lines(settings, "dlq", "list")[-1] == (
        "2 dead letter(s), 0 replayable with `postroom dlq replay`")


def test_report_failures_prints_and_mails_once_through_the_outbox(
        pipeline: Pipeline, engine: sa.Engine, server: DevSmtpServer) -> None:
    settings = pipeline.settings
    with engine.begin() as conn:
        enqueue(conn, key="newsletter", subject="News", body="b",
                recipients=["ok@example.com", "old@example.com"])
    settle(engine, "newsletter", {"ok@example.com": "sent", "old@example.com": "failed"})

    rows = [json.loads(line) for line in lines(settings, "report", "failures", "--json")]
    assert [(r["recipient"], r["message_key"], r["subject"], r["status"], r["attempts"])
            for r in rows] == [("old@example.com", "newsletter", "News", "failed", 1)]
    assert "550" in rows[0]["last_error"]
    text = lines(settings, "report", "failures")
    assert text[0].startswith("1 email(s) ended failed, dead, bounced or suppressed since ")
    assert text[1].startswith("old@example.com | newsletter | News | failed | attempts=1 | 550")
    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).date().isoformat()
    assert lines(settings, "report", "failures", "--since", tomorrow) == [
        f"no email ended failed, dead, bounced or suppressed since {tomorrow} 00:00 UTC"]

    first = lines(settings, "report", "failures", "--to", "owner@example.com")
    assert first[0] == "mailing 1 failure(s) to owner@example.com through the outbox ..."
    assert first[1].startswith("queued the report as postroom-failures-")
    second = lines(settings, "report", "failures", "--to", "owner@example.com")
    assert second[1].endswith("was queued before; not queued again")
    wait_until(lambda: server.count("owner@example.com") == 1, 60, "the report to be delivered")
    [mail] = [m for m in server.messages if m.rcpt == "owner@example.com"]
    parsed = email.message_from_bytes(mail.raw, policy=email.policy.default)
    assert parsed["Subject"].startswith("postroom: 1 undeliverable email(s) since ")
    body = parsed.get_body()
    assert body is not None
    assert "old@example.com | newsletter | News | failed" in body.get_content()
    assert server.count("owner@example.com") == 1


def test_a_mass_bounce_report_lists_what_fits_and_attaches_every_failure_as_csv(
        settings: Settings, engine: sa.Engine, server: DevSmtpServer, tmp_path: Path) -> None:
    # The mass-bounce day the report exists for: 4,000 failures made the body too large and the
    # command failed, naming POSTROOM_BODY_MAX_BYTES, a setting the report did not even read.
    failures = 4000
    with engine.begin() as conn:
        enqueue(conn, key="bounce", subject="News", body="b",
                recipients=[f"r{n}@example.com" for n in range(failures)])
        conn.execute(sa.text("UPDATE outbox SET status = 'failed', attempts = 1, "
                             "updated_at = now(), last_error = '550 5.1.1 <' || recipient || "
                             "'>: Recipient address rejected: User unknown in virtual mailbox "
                             "table'"))
        conn.execute(sa.text("DELETE FROM outbox_queue"))

    # Without an attachments root: the body lists what fits and says how to get the rest.
    small = postroom(settings, "report", "failures", "--to", "first@example.com",
                     extra_env={"POSTROOM_BODY_MAX_BYTES": "60000"}).stdout.splitlines()
    assert small[0] == f"mailing {failures} failure(s) to first@example.com through the outbox ..."
    assert small[1].startswith("the body lists ")
    assert small[1].endswith(" of them and counts the rest; set POSTROOM_ATTACHMENTS_ROOT to "
                             "attach them all")
    assert small[2].startswith("queued the report as postroom-failures-")
    with engine.connect() as conn:
        [row] = conn.execute(sa.text("SELECT body, attachments FROM outbox WHERE message_key = :k"),
                             {"k": small[2].rsplit(" ", 1)[1]}).all()
    assert len(row.body.encode()) <= 60000  # the setting is the report's cap too
    listed = int(small[1].split()[3])
    assert f"... and {failures - listed} more; `postroom report failures --since " in row.body
    assert row.attachments == []

    # With one, shared with the sender: every failure in a CSV, delivered as an attachment.
    root = tmp_path / "attachments"
    root.mkdir()
    sending = dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
        attachments_root=root, sender_group=f"ops-{uuid.uuid4().hex[:8]}",
        recorder_group=f"rec-{uuid.uuid4().hex[:8]}")
    running = Pipeline(sending, engine).start()
    try:
        out = postroom(settings, "report", "failures", "--to", "owner@example.com",
                       extra_env={"POSTROOM_ATTACHMENTS_ROOT": str(root)}).stdout.splitlines()
        assert out[1] == f"the body lists {BODY_MAX_LINES} of them and counts the rest"
        csv_path = root / "postroom-reports" / (out[3].rsplit(" ", 1)[1] + ".csv")
        assert out[2] == f"attached {failures} as CSV: {csv_path}"
        wait_until(lambda: server.count("owner@example.com") == 1, 60, "the report to be sent")
    finally:
        running.stop()
    [mail] = [m for m in server.messages if m.rcpt == "owner@example.com"]
    parsed = email.message_from_bytes(mail.raw, policy=email.policy.default)
    assert isinstance(parsed, email.message.EmailMessage)
    body = parsed.get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    assert f"... and {failures - BODY_MAX_LINES} more; every one of them is in the attached " \
           f"{csv_path.name}" in text
    [attachment] = list(parsed.iter_attachments())
    assert attachment.get_filename() == csv_path.name
    table = list(csv.reader(io.StringIO(attachment.get_content() if isinstance(
        attachment.get_content(), str) else attachment.get_content().decode())))
    assert table[0] == ["recipient", "message_key", "idempotency_key", "subject", "status",
                        "attempts", "last_error", "updated_at"]
    assert sorted(r[0] for r in table[1:]) == sorted(f"r{n}@example.com" for n in range(failures))


def test_purge_deletes_final_rows_in_batches_and_keeps_what_is_still_needed(
        pipeline: Pipeline, engine: sa.Engine) -> None:
    settings = pipeline.settings
    with engine.begin() as conn:
        enqueue(conn, key="old", subject="S", body="b",
                recipients=[f"r{n}@example.com" for n in range(5)])
        enqueue(conn, key="waiting", subject="S", body="b", recipients=["later@example.com"],
                send_after=dt.datetime.now(dt.UTC) + dt.timedelta(days=30))
    settle(engine, "old", {f"r{n}@example.com": "sent" for n in range(5)})
    with engine.begin() as conn:
        # r0 and r1 and their ledger rows are 40 days old, r2 and its ledger row 3 days, the
        # unsent row 40 days.
        for recipients, age in ((("r0", "r1", "later"), "40 days"), (("r2",), "3 days")):
            conn.execute(sa.text("""
                UPDATE outbox SET sent_at = now() - CAST(:age AS interval),
                                  updated_at = now() - CAST(:age AS interval),
                                  created_at = now() - CAST(:age AS interval)
                WHERE recipient = ANY(:who)"""), {"age": age,
                                                   "who": [f"{r}@example.com" for r in recipients]})
            conn.execute(sa.text("""
                UPDATE sender_ledger SET updated_at = now() - CAST(:age AS interval)
                WHERE idempotency_key = ANY(:keys)"""), {
                    "age": age, "keys": [f"old|{r}@example.com" for r in recipients]})

    # 2 days is younger than the topics' retention: purge takes it only with --force.
    dry = lines(settings, "purge", "--older-than", "2d", "--dry-run", "--force")
    assert dry[1] == "outbox: 3 row(s) to delete (3 sent, 0 failed, 0 dead)"
    # The local broker keeps records 7 days and rolls segments weekly (its defaults): a record
    # may stay 14 days, and r2's ledger row, 3 days old, stays.
    assert dry[2] == ("ledger: 2 row(s) to delete; ledger rows younger than the longest a "
                      "topic may keep a record (14 days: retention.ms + segment.ms) are kept: "
                      "a consumer "
                      "group reset to the beginning "
                      "must find each key it already sent")
    assert dry[3] == "dry run: nothing deleted"
    assert len(outbox_rows(engine, "old")) == 5

    done = lines(settings, "purge", "--older-than", "2d", "--force")
    assert done[-1] == "deleted 3 outbox row(s) and 2 ledger row(s)"
    assert sorted(r.recipient for r in outbox_rows(engine, "old")) == [
        "r3@example.com", "r4@example.com"]
    assert [r.status for r in outbox_rows(engine, "waiting")] == ["pending"]  # never a live row
    with engine.connect() as conn:
        ledger = set(conn.execute(sa.text("SELECT idempotency_key FROM sender_ledger")).scalars())
    assert ledger == {"old|r2@example.com", "old|r3@example.com", "old|r4@example.com"}
    assert lines(settings, "purge", "--older-than", "2d", "--force")[-1] == (
        "deleted 0 outbox row(s) and 0 ledger row(s)")
