"""`postroom suppression list/add/remove` as an operator runs them, and what a suppressed address
means downstream: `report failures` and `status` show the suppressed and bounced rows, and purge
takes them as final. Judged by exit codes, output and the rows in the database."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from postroom.devkit.scratch import scratch_env
from postroom.relay.db import make_engine
from postroom.relay.outbox import enqueue
from postroom.relay.publisher import Relay
from postroom.settings import Settings
from support.commands import run_postroom
from support.rounds import publish_round

pytestmark = pytest.mark.e2e


@pytest.fixture
def engine(settings: Settings) -> Iterator[sa.Engine]:
    eng = make_engine(settings)
    yield eng
    eng.dispose()


def postroom(settings: Settings, *args: str,
             **env: str) -> subprocess.CompletedProcess[str]:
    proc = run_postroom(*args, env={**os.environ, **scratch_env(settings), **env}, timeout_s=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_add_list_remove(settings: Settings) -> None:
    added = postroom(settings, "suppression", "add", " Old.Manager@Example.COM ", "--reason",
                     "left the company", "--expires", "90d")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("suppressed old.manager@example.com until ")
    assert added.stdout.rstrip().endswith(" UTC: left the company")
    assert postroom(settings, "suppression", "add", "ops@example.com").returncode == 0

    listed = postroom(settings, "suppression", "list")
    assert listed.returncode == 0
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["ADDRESS", "SOURCE", "SINCE", "(UTC)", "UNTIL", "(UTC)", "REASON"]
    assert [row.split()[:2] for row in rows] == [["old.manager@example.com", "operator"],
                                                ["ops@example.com", "operator"]]
    entries = [json.loads(line) for line in
               postroom(settings, "suppression", "list", "--json").stdout.splitlines()]
    first, second = entries
    assert (first["address"], first["reason"], first["source"]) == (
        "old.manager@example.com", "left the company", "operator")
    days = (dt.datetime.fromisoformat(first["expires_at"])
            - dt.datetime.fromisoformat(first["created_at"]))
    assert days == dt.timedelta(days=90)
    default = (dt.datetime.fromisoformat(second["expires_at"])
               - dt.datetime.fromisoformat(second["created_at"]))
    assert (second["reason"], default) == ("added by an operator", dt.timedelta(days=30))

    removed = postroom(settings, "suppression", "remove", "OLD.MANAGER@example.com")
    assert removed.returncode == 0
    assert removed.stdout.startswith("removed old.manager@example.com from the suppression list")
    again = postroom(settings, "suppression", "remove", "old.manager@example.com")
    assert again.returncode == 1
    assert again.stderr.strip() == ("postroom suppression: error: old.manager@example.com is "
                                    "not on the suppression list")
    assert [e["address"] for e in map(json.loads, postroom(
        settings, "suppression", "list", "--json").stdout.splitlines())] == ["ops@example.com"]


def test_the_expiry_follows_the_setting(settings: Settings) -> None:
    assert postroom(settings, "suppression", "add", "a@example.com",
                    POSTROOM_SUPPRESSION_EXPIRY="2d").returncode == 0
    [entry] = map(json.loads, postroom(settings, "suppression", "list", "--json").stdout.splitlines())
    assert (dt.datetime.fromisoformat(entry["expires_at"])
            - dt.datetime.fromisoformat(entry["created_at"])) == dt.timedelta(days=2)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["add", "not-an-address"], 1, "postroom suppression: error: address 'not-an-address' is "
                                   "not of the form local@domain"),
    (["add", "Name <a@example.com>"], 1, "has an invalid local part"),
    (["add", "a@example.com", "--expires", "soon"], 2, "--expires: not an age: 'soon'"),
    (["add", "a@example.com", "--expires", "0d"], 2, "--expires: an age must be more than 0"),
    # Issue 45 item 7: a bare 90 suppressed for 90 seconds; purge --older-than refused it.
    (["add", "a@example.com", "--expires", "90"], 2, "--expires: '90' has no unit; write it as "
                                                     "30d or 30days (days), 12h (hours), 90m "
                                                     "(minutes), 2w (weeks)"),
    (["add", "a@example.com", "--expires", "1mo"], 2, "--expires: '1mo': months and years have "
                                                      "no fixed length; write days, e.g. 90d"),
    (["add", "a@example.com", "--expires", "1M"], 2, "'M' reads as minutes or months"),
    (["remove", "a@@example"], 1, "postroom suppression: error: address"),
    (["remove", "nobody@example.com"], 1, "nobody@example.com is not on the suppression list"),
])
def test_bad_input_is_one_clear_line(settings: Settings, args: list[str], code: int,
                                     says: str) -> None:
    proc = postroom(settings, "suppression", *args)
    assert proc.returncode == code
    assert says in proc.stderr.strip().splitlines()[-1]
    assert postroom(settings, "suppression", "list").stdout.strip() == "no address is suppressed"


def test_suppressed_and_bounced_rows_are_reported_shown_and_purged(
        settings: Settings, engine: sa.Engine) -> None:
    assert postroom(settings, "suppression", "add", "gone@example.com", "--reason",
                    "mailbox deleted").returncode == 0
    with engine.begin() as conn:
        enqueue(conn, key="sep", recipients=["gone@example.com", "old@example.com",
                                             "ceo@example.com"], subject="September", body="b")
    assert publish_round(Relay(settings, engine)) == 2
    with engine.begin() as conn:  # as the recorder leaves a hard bounce
        conn.execute(sa.text("UPDATE outbox SET status = 'bounced', last_error = 'bounced "
                             "5.1.1: smtp; 550 5.1.1 user unknown', updated_at = now() "
                             "WHERE recipient = 'old@example.com'"))

    report = postroom(settings, "report", "failures")
    assert report.returncode == 0
    head, *lines = report.stdout.splitlines()
    assert head.startswith("2 email(s) ended failed, dead, bounced or suppressed since ")
    assert lines[0].startswith("gone@example.com | sep | September | suppressed | attempts=0 | "
                               "suppressed (operator, until ")
    assert lines[0].endswith(" UTC): mailbox deleted")
    assert lines[1] == ("old@example.com | sep | September | bounced | attempts=0 | "
                        "bounced 5.1.1: smtp; 550 5.1.1 user unknown")

    status = postroom(settings, "status", "--key", "sep").stdout
    assert "(earlier attempt)" not in status
    states = {line.split()[0]: line.split()[1] for line in status.splitlines()[2:]}
    assert states == {"gone@example.com": "suppressed", "old@example.com": "bounced",
                      "ceo@example.com": "published"}

    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET updated_at = now() - interval '40 days', "
                             "sent_at = now() - interval '40 days', "
                             "created_at = now() - interval '40 days'"))
    purged = postroom(settings, "purge", "--older-than", "30d", "--force")
    assert purged.returncode == 0, purged.stderr
    assert "(0 sent, 0 failed, 0 dead, 1 bounced, 1 suppressed)" in purged.stdout
    with engine.connect() as conn:
        assert set(conn.execute(sa.text("SELECT recipient FROM outbox")).scalars()) == {
            "ceo@example.com"}
