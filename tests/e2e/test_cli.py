"""The `postroom` command as a user runs it: a subprocess against the local stack, judged only by
its exit code, its output and what it left in the database and on the broker."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from postroom.devkit.ports import free_port
from postroom.devkit.processes import Started, postroom_command, stop_process
from postroom.devkit.scratch import scratch, scratch_env, unique_name
from postroom.devkit.wait import wait_until
from postroom.kafka import make_admin
from postroom.relay.db import make_engine
from postroom.relay.outbox import enqueue
from postroom.relay.publisher import Relay
from postroom.settings import Settings
from postroom.topics import Priority, all_topics, priority_topic, results_topic, retry_topic
from support.commands import run_postroom, start_postroom
from support.rounds import publish_round

pytestmark = pytest.mark.e2e

STATUS_FIELDS = {"message_key", "recipient", "subject", "priority", "status", "attempts",
                 "last_error", "created_at", "published_at", "sent_at"}
LAG_FIELDS = {"group", "topic", "partition", "committed", "end", "lag", "lag_seconds", "verdict",
              "group_state", "group_members", "group_idle_members", "group_verdict"}
RETRY_FIELDS = {"waiting", "overdue", "overdue_seconds"}
RUN_TIMEOUT_S = 60
# A role's start on a loaded machine (its imports, its database and broker checks) until its
# metrics port answers ready: waited for, so only a role that never gets there takes this long.
SERVED_WITHIN_S = 90.0

# The newest migration of this release (its files are numbered 0001, 0002, ...).
HEAD = max(path.name[:4] for path in (
    Path(__file__).resolve().parents[2] / "relay" / "migrations" / "versions").glob("0*.py"))
STOP_WITHIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class Cli:
    """Runs `postroom` with the stack's environment plus this test's names."""

    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = RUN_TIMEOUT_S,
                 **env: str) -> subprocess.CompletedProcess[str]:
        return run_postroom(*args, env={**self.env, **env}, timeout_s=timeout)

    def ok(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        proc = self(*args, **env)
        assert proc.returncode == 0, f"postroom {' '.join(args)} failed:\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def status(self, key: str) -> list[dict[str, Any]]:
        """The rows of ``key`` as `status --json` gives them; none when it says the key is
        unknown (exit 1)."""
        proc = self("status", "--key", key, "--json")
        if proc.returncode == 1 and proc.stderr.startswith(
                f"postroom status: no outbox rows for key {key!r}"):
            return []
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def start(self, *args: str, log: Path) -> Started:
        return start_postroom(*args, env=self.env, log=log)


def cli_for(schema: str, prefix: str, **extra: str) -> Cli:
    return Cli({**os.environ, "POSTROOM_DATABASE_SCHEMA": schema,
                "POSTROOM_TOPIC_PREFIX": prefix, **extra})


@pytest.fixture
def cli(db_settings: Settings) -> Cli:
    """A migrated schema of this test's own, and a topic prefix no topic has."""
    assert db_settings.database_schema
    return cli_for(db_settings.database_schema, unique_name("e2e_none") + ".")


@pytest.fixture
def stack_cli(settings: Settings) -> Cli:
    """A schema, created topics and consumer groups of this test's own."""
    return Cli({**os.environ, **scratch_env(settings)})


@pytest.fixture
def new_schema(stack_settings: Settings) -> Iterator[str]:
    """A schema name nothing has created; dropped afterwards if a test created it."""
    with scratch(stack_settings, "e2e", kafka=False) as settings:
        assert settings.database_schema
        yield settings.database_schema


@pytest.fixture
def new_prefix(stack_settings: Settings) -> Iterator[str]:
    """A topic prefix no topic has; its topics are deleted afterwards."""
    with scratch(stack_settings, "e2e", database=False, create=False) as settings:
        yield settings.topic_prefix


# A command that retried an unreachable database would take its retries' 30 s beyond a command
# refused before any connection, whatever else the machine runs.
UNREACHABLE_MARGIN_S = 15.0
UNREACHABLE_URL = "postgresql+psycopg://postroom@127.0.0.1:1/postroom"


def beside_a_refusal(cli: Cli, command: list[str],
                     **env: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """``command`` with ``env``, and beside it, at the same time, the same command refused for a
    bad setting before it connects to anything: the first's result and both durations."""
    def timed(**changes: str) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        proc = cli(*command, **changes)
        return proc, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        subject = pool.submit(timed, **env)
        refused = pool.submit(timed, **env, POSTROOM_SMTP_PORT="abc")
        proc, seconds = subject.result()
        refusal, refusal_seconds = refused.result()
    assert refusal.returncode == 2, refusal.stderr
    return proc, seconds, refusal_seconds


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failing command wrote to stderr; fails on a traceback or more lines."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def outbox(db_settings: Settings, key: str) -> list[sa.RowMapping]:
    engine = make_engine(db_settings)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(
                "SELECT * FROM outbox WHERE message_key = :k ORDER BY id"), {"k": key}).mappings())
    finally:
        engine.dispose()


# -- db upgrade and topics create ----------------------------------------------------------------

def test_db_upgrade_says_what_it_did_and_db_current_and_history_say_where_it_is(
        new_schema: str, stack_settings: Settings) -> None:
    """Issue 45 item 8: `db upgrade` printed `outbox schema is at revision 0014` whether it
    created the schema, migrated it or did nothing; there was no current, history or dry run."""
    from postroom.relay.db import downgrade

    cli = cli_for(new_schema, unique_name("e2e_none") + ".")
    assert cli.ok("db", "current").stdout == (
        f"no outbox schema yet: `postroom db upgrade` creates it at revision {HEAD}\n")
    dry = cli.ok("db", "upgrade", "--dry-run").stdout.splitlines()
    assert dry[0] == f"would create the outbox schema at revision {HEAD} ({int(HEAD)} migrations)"
    assert dry[1:3] == ["  0001 outbox", "  0002 sender ledger"]
    assert re.fullmatch(r"dry run: \d+ SQL statements rolled back, nothing changed \(--sql "
                        r"prints them\)", dry[-1]), dry
    sql = cli.ok("db", "upgrade", "--sql").stdout
    assert "CREATE TABLE outbox (" in sql and "UPDATE alembic_version SET version_num='0014'" in sql
    assert cli.ok("db", "current").stdout.startswith("no outbox schema yet")  # nothing left

    first = cli.ok("db", "upgrade").stdout.splitlines()
    assert first[0] == f"created the outbox schema at revision {HEAD} ({int(HEAD)} migrations)"
    assert cli.ok("db", "upgrade").stdout == (
        f"outbox schema is at revision {HEAD}, the newest: nothing to do\n")
    assert cli.ok("db", "current").stdout == f"outbox schema is at revision {HEAD}, the newest\n"
    engine = make_engine(dataclasses.replace(stack_settings, database_schema=new_schema))
    try:
        downgrade(engine, "0008")
    finally:
        engine.dispose()
    assert cli.ok("db", "current").stdout == (
        f"outbox schema is at revision 0008; the newest is {HEAD}: `postroom db upgrade` runs "
        f"{int(HEAD) - 8} migrations\n")
    history = cli.ok("db", "history").stdout.splitlines()
    assert [line.split()[-1] for line in history] == (
        ["applied"] * 7 + ["current"] + ["pending"] * (int(HEAD) - 8))
    assert history[8].startswith("0009 suppression ")
    migrated = cli.ok("db", "upgrade").stdout.splitlines()
    assert migrated[0] == (f"migrated the outbox schema from revision 0008 to {HEAD} "
                           f"({int(HEAD) - 8} migrations)")
    assert migrated[1] == "  0009 suppression"
    assert cli.ok("status").stdout == "no outbox rows\n"


def test_db_upgrade_says_that_it_waits_for_another_migration(
        new_schema: str, stack_settings: Settings, tmp_path: Path) -> None:
    from postroom.relay.db import lock_migrations

    cli = cli_for(new_schema, unique_name("e2e_none") + ".")
    engine = make_engine(dataclasses.replace(stack_settings, database_schema=new_schema))
    log = tmp_path / "upgrade.log"
    try:
        with engine.begin() as holder:
            lock_migrations(holder)  # another migration of this schema, under way
            proc = cli.start("db", "upgrade", log=log)
            wait_until(lambda: "waiting for another migration of this schema to finish (0s so "
                               "far; it holds the migration lock)" in log.read_text(), 30,
                       "db upgrade to say that it waits")
            assert proc.poll() is None
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        engine.dispose()
    assert log.read_text().splitlines()[-1 - int(HEAD)].startswith(
        "created the outbox schema at revision")


def test_topics_create_then_exists_for_every_topic(new_prefix: str) -> None:
    cli = cli_for(unique_name("e2e_none"), new_prefix)
    expected = all_topics(new_prefix, 4)  # the default POSTROOM_RETRY_DELAYS has four tiers
    assert expected == [*(priority_topic(new_prefix, p) for p in ("high", "normal", "low")),
                        *(retry_topic(new_prefix, n) for n in (1, 2, 3, 4)),
                        f"{new_prefix}email.dead", f"{new_prefix}email.results"]
    first = cli.ok("topics", "create").stdout.splitlines()
    assert [line.split() for line in first] == [["created", name] for name in expected]
    second = cli.ok("topics", "create").stdout.splitlines()
    assert [line.split() for line in second] == [["exists", name] for name in expected]
    partitions = int(os.environ.get("POSTROOM_TOPIC_PARTITIONS", "6"))
    metadata = make_admin(Settings.from_env()).list_topics(timeout=10)
    for name in expected:
        assert len(metadata.topics[name].partitions) == partitions, name


def test_topics_create_follows_the_retry_tiers_setting(new_prefix: str) -> None:
    cli = cli_for(unique_name("e2e_none"), new_prefix)
    lines = cli.ok("topics", "create", POSTROOM_RETRY_DELAYS="1m,1h").stdout.splitlines()
    assert [line.split()[1] for line in lines] == all_topics(new_prefix, 2)


# -- enqueue -------------------------------------------------------------------------------------

def test_enqueue_queues_one_row_per_recipient_once(
        cli: Cli, db_settings: Settings, tmp_path: Path) -> None:
    report = tmp_path / "Bericht 2026-09.pdf"
    report.write_bytes(b"%PDF-1.7 fake")
    args = ["enqueue", "--key", "report-2026-09", "--to", "anna@example.com",
            "--to", "ben@example.com", "--subject", "Bericht September", "--body", "Hallo",
            "--attach", str(report), "--priority", "high", "--json"]
    first = json.loads(cli.ok(*args).stdout)
    assert first == {"queued": 2, "recipients": 2, "key": "report-2026-09",
                     "queued_before": None}
    again = json.loads(cli.ok(*args).stdout)
    assert {k: again[k] for k in ("queued", "recipients", "key")} == {
        "queued": 0, "recipients": 2, "key": "report-2026-09"}
    assert dt.datetime.fromisoformat(again["queued_before"]).tzinfo is not None

    rows = outbox(db_settings, "report-2026-09")
    assert [r["recipient"] for r in rows] == ["anna@example.com", "ben@example.com"]
    for row in rows:
        assert row["attachments"] == [str(report)]
        assert (row["priority"], row["status"], row["subject"], row["body"]) == (
            "high", "pending", "Bericht September", "Hallo")


def test_enqueue_without_json_says_how_many_were_new_and_why_a_rerun_queued_none(
        cli: Cli) -> None:
    args = ["enqueue", "--key", "hello", "--to", "a@example.com", "--subject", "Hello",
            "--body", "b"]
    assert cli.ok(*args).stdout == "queued 1 new of 1 recipient(s)\n"
    again = cli.ok(*args).stdout.splitlines()
    assert again[0] == "queued 0 new of 1 recipient(s)"
    assert re.fullmatch(r"not queued again: 1 recipient\(s\) already had message key 'hello', "
                        r"queued \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(pending 1\); a different "
                        r"email needs another --key", again[1]), again


def test_enqueue_without_a_key_never_drops_a_different_email(
        cli: Cli, tmp_path: Path) -> None:
    """Issue 45 item 2: a nightly cron job without --key sent day 1's report and then queued
    nothing for ever (the subject was the key). The key is now the subject and a digest of the
    content: day 2's report is new, day 2 run again queues nothing and says since when."""
    day1, day2 = tmp_path / "day1.txt", tmp_path / "day2.txt"
    day1.write_text("sent: 10\n", encoding="utf-8")
    day2.write_text("sent: 12\n", encoding="utf-8")

    def nightly(body: Path) -> dict[str, Any]:
        return dict(json.loads(cli.ok("enqueue", "--to", "ops@example.com", "--subject",
                                      "Nightly report", "--body-file", str(body),
                                      "--json").stdout))

    first, second = nightly(day1), nightly(day2)
    assert (first["queued"], second["queued"]) == (1, 1)
    assert first["key"] != second["key"]
    assert all(re.fullmatch(r"Nightly report #[0-9a-f]{12}", k) for k in (first["key"],
                                                                           second["key"]))
    rerun = nightly(day2)
    assert (rerun["queued"], rerun["key"]) == (0, second["key"])
    assert rerun["queued_before"] is not None and second["queued_before"] is None
    said = cli.ok("enqueue", "--to", "ops@example.com", "--subject", "Nightly report",
                  "--body-file", str(day2)).stdout.splitlines()
    assert said[0] == f"queued 0 new of 1 recipient(s) as message {second['key']}"
    assert said[1].startswith("not queued again: 1 recipient(s) already had the same subject, "
                              "bodies and files, queued ")
    assert said[1].endswith("UTC (pending 1); --key K queues it again under a key of its own")
    # A file's bytes are the content too: the same path with new numbers is a new email.
    report = tmp_path / "report.csv"
    report.write_text("a,1\n", encoding="utf-8")
    args = ["enqueue", "--to", "ops@example.com", "--subject", "CSV", "--body", "attached",
            "--attach", str(report), "--json"]
    assert json.loads(cli.ok(*args).stdout)["queued"] == 1
    report.write_text("a,2\n", encoding="utf-8")
    assert json.loads(cli.ok(*args).stdout)["queued"] == 1
    assert [r["status"] for r in cli.status(second["key"])] == ["pending"]


def test_enqueue_reads_the_body_from_a_file(cli: Cli, db_settings: Settings,
                                            tmp_path: Path) -> None:
    body = "Hallo Anna,\n\nanbei die Zahlen — 📈\n"
    path = tmp_path / "body.txt"
    path.write_text(body, encoding="utf-8")
    cli.ok("enqueue", "--key", "k", "--to", "anna@example.com", "--subject", "S",
           "--body-file", str(path))
    assert [r["body"] for r in outbox(db_settings, "k")] == [body]


def test_a_missing_body_file_is_a_clear_error(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    proc = cli("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S",
               "--body-file", str(missing))
    assert proc.returncode == 1
    assert error_line(proc).startswith(f"postroom enqueue: error: cannot read --body-file {missing}")
    assert cli.status("k") == []


def test_send_after_is_stored_as_the_instant_it_names(cli: Cli, db_settings: Settings) -> None:
    cli.ok("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b",
           "--send-after", "2026-10-02T09:00:00+02:00")
    [row] = outbox(db_settings, "k")
    assert row["available_at"] == dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize("address", [
    "not-an-address", "anna@", "anna@exa mple.com", "anna@example.com\r\nBcc: all@example.com"])
def test_a_bad_address_writes_nothing_and_names_it(cli: Cli, address: str) -> None:
    proc = cli("enqueue", "--key", "k", "--to", "good@example.com", "--to", address,
               "--subject", "S", "--body", "b")
    assert proc.returncode == 1
    line = error_line(proc)
    assert line.startswith("postroom enqueue: error: recipient ")
    assert repr(address.strip()) in line
    assert cli.status("k") == []  # not even the good recipient


def test_a_missing_attachment_is_a_clear_error(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "report.xlsx"
    proc = cli("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b",
               "--attach", str(missing))
    assert proc.returncode == 1
    assert error_line(proc) == f"postroom enqueue: error: attachment {missing} does not exist"
    proc = cli("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b",
               "--attach", str(tmp_path))
    assert proc.returncode == 1
    assert error_line(proc) == f"postroom enqueue: error: attachment {tmp_path} is not a regular file"
    assert cli.status("k") == []


# -- status --------------------------------------------------------------------------------------

def test_status_shows_a_table_with_a_header_one_line_per_recipient(cli: Cli) -> None:
    cli.ok("enqueue", "--key", "k", "--to", "a@example.com", "--to", "b@example.com",
           "--subject", "Grüße", "--body", "b", "--priority", "low")
    cli.ok("enqueue", "--key", "other", "--to", "c@example.com", "--subject", "S", "--body", "b")
    text = cli.ok("status", "--key", "k").stdout.splitlines()
    assert text[0] == "message k, subject 'Grüße': 2 recipient(s)"
    assert text[1].split() == ["RECIPIENT", "STATE", "TRIES", "CREATED", "(UTC)", "SENT", "(UTC)",
                               "LAST", "ERROR"]
    assert len(text) == 4
    for line, recipient in zip(text[2:], ["a@example.com", "b@example.com"], strict=True):
        assert re.fullmatch(rf"{recipient} +pending +0 +\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d +- +-",
                            line), line
        assert len(line) < 100

    rows = cli.status("k")
    assert [r["recipient"] for r in rows] == ["a@example.com", "b@example.com"]
    for row in rows:
        assert STATUS_FIELDS <= row.keys()
        assert (row["message_key"], row["subject"], row["priority"], row["status"]) == (
            "k", "Grüße", "low", "pending")
        assert (row["attempts"], row["last_error"], row["published_at"], row["sent_at"]) == (
            0, None, None, None)
        created = dt.datetime.fromisoformat(row["created_at"])
        assert created.tzinfo is not None
        assert abs(dt.datetime.now(dt.UTC) - created) < dt.timedelta(minutes=5)

    newest = cli.ok("status", "--limit", "1", "--json")
    assert [json.loads(line)["recipient"] for line in newest.stdout.splitlines()] == [
        "c@example.com"]
    assert newest.stderr.strip().splitlines()[-1] == (
        "showing the newest 1 of 3 rows (--limit N for more)")
    table = cli.ok("status", "--limit", "2").stdout.splitlines()
    assert table[0].split()[:3] == ["KEY", "RECIPIENT", "STATE"]
    assert [line.split()[:2] for line in table[1:3]] == [["other", "c@example.com"],
                                                         ["k", "b@example.com"]]
    assert table[3:] == ["showing the newest 2 of 3 rows (--limit N for more)"]
    assert "showing" not in cli.ok("status", "--limit", "3").stdout


def test_status_of_an_unknown_key_says_so_and_exits_1(cli: Cli) -> None:
    for args in (["status", "--key", "nothing"], ["status", "--key", "nothing", "--json"]):
        proc = cli(*args)
        assert (proc.returncode, proc.stdout) == (1, "")
        assert error_line(proc).startswith("postroom status: no outbox rows for key 'nothing'")


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_status_refuses_a_limit_below_one_in_one_line(cli: Cli, limit: str) -> None:
    proc = cli("status", f"--limit={limit}")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("postroom status: error: argument --limit: ")


def test_status_tells_an_earlier_attempts_error_from_the_current_state(
        cli: Cli, db_settings: Settings) -> None:
    cli.ok("enqueue", "--key", "k", "--to", "sent@example.com", "--to", "failed@example.com",
           "--subject", "S", "--body", "b")
    engine = make_engine(db_settings)
    with engine.begin() as conn:
        conn.execute(sa.text("""
            UPDATE outbox SET status = CASE WHEN recipient LIKE 'sent@%' THEN 'sent'
                                            ELSE 'failed' END,
                   attempts = 2, last_error = CASE WHEN recipient LIKE 'sent@%'
                       THEN '451 4.3.0 try again later' ELSE '550 5.1.1 User unknown' END,
                   sent_at = CASE WHEN recipient LIKE 'sent@%' THEN now() END"""))
    engine.dispose()
    lines = cli.ok("status", "--key", "k").stdout.splitlines()[2:]
    assert lines[0].startswith("sent@example.com    sent    2")
    assert lines[0].endswith("  (earlier attempt) 451 4.3.0 try again later")
    assert lines[1].startswith("failed@example.com  failed  2")
    assert re.search(r"  - +550 5.1.1 User unknown$", lines[1]), lines[1]


def test_status_into_a_pipe_closed_early_stops_quietly(cli: Cli, db_settings: Settings) -> None:
    # `postroom status --json | head -2` on a message with more rows than a pipe buffers.
    engine = make_engine(db_settings)
    with engine.begin() as conn:
        enqueue(conn, key="many", subject="S", body="b",
                recipients=[f"r{n}@example.com" for n in range(3000)])
    engine.dispose()
    shell = subprocess.run(
        ["bash", "-c", shlex.join(postroom_command("status", "--key", "many", "--json"))
         + " | head -2"],
        env=cli.env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert len(shell.stdout.splitlines()) == 2
    assert shell.stderr == ""


def test_status_on_a_schema_never_upgraded_says_to_upgrade(new_schema: str) -> None:
    cli = cli_for(new_schema, unique_name("e2e_none") + ".")
    proc = cli("status")
    assert proc.returncode == 1
    assert "run `postroom db upgrade`" in error_line(proc)


# -- configuration and database errors ------------------------------------------------------------

@pytest.mark.parametrize(("variable", "value"), [
    ("POSTROOM_SMTP_PORT", "abc"),
    ("POSTROOM_DATABASE_URL", "mysql://x"),
    ("POSTROOM_DATABASE_SCHEMA", "Robert'); DROP TABLE outbox;--"),
    ("POSTROOM_TOPIC_PARTITIONS", "0"),
    ("POSTROOM_RELAY_POLL_INTERVAL", "soon"),
    ("POSTROOM_SMTP_TLS", "maybe"),
])
def test_a_bad_setting_exits_2_naming_the_variable(cli: Cli, variable: str, value: str) -> None:
    proc = cli("status", **{variable: value})
    assert proc.returncode == 2
    assert error_line(proc).startswith(f"postroom status: configuration error: {variable}: ")


KAFKA_MISTAKES = [
    # The usual mount-path mistake, and a typo in a key (issue 45 item 4: both were tracebacks).
    ("security.protocol=SSL;ssl.ca.location=/nonexistent/ca.pem",
     "POSTROOM_KAFKA_CONFIG / POSTROOM_KAFKA_CONFIG_FILE: ssl.ca.location=/nonexistent/ca.pem: "
     "no such file or directory"),
    ("security.protocl=SSL",
     "POSTROOM_KAFKA_CONFIG / POSTROOM_KAFKA_CONFIG_FILE: security.protocl: librdkafka has no "
     "such setting (a typo?)"),
]


@pytest.mark.parametrize(("config", "said"), KAFKA_MISTAKES)
@pytest.mark.parametrize("role", ["relay", "sender", "recorder", "bounces", "lag"])
def test_a_wrong_kafka_setting_stops_a_role_in_one_line_naming_the_variable(
        cli: Cli, role: str, config: str, said: str) -> None:
    bounces = {"POSTROOM_BOUNCE_ADDRESS": "bounces@b.example", "POSTROOM_BOUNCES_PORT": "0",
               "POSTROOM_BOUNCE_SECRET": "x" * 32}  # what `postroom bounces` needs to start
    proc = cli(role, POSTROOM_KAFKA_CONFIG=config, **bounces)
    assert (proc.returncode, error_line(proc)) == (
        2, f"postroom {role}: configuration error: {said}")


@pytest.mark.parametrize(("config", "said"), KAFKA_MISTAKES)
def test_check_says_a_wrong_kafka_setting_in_one_line_naming_the_variable(
        cli: Cli, config: str, said: str) -> None:
    proc = cli("check", POSTROOM_KAFKA_CONFIG=config)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"FAIL  kafka: {said}" in proc.stdout.splitlines(), proc.stdout


def test_a_claim_ttl_within_the_producer_timeout_stops_the_relay_with_the_usual_message(
        cli: Cli) -> None:
    proc = cli("relay", POSTROOM_RELAY_CLAIM_TTL="20s")
    assert proc.returncode == 2
    assert error_line(proc) == ("postroom relay: configuration error: POSTROOM_RELAY_CLAIM_TTL: "
                                "must be longer than the producer's message timeout (30s), got 20s")
    assert "Traceback" not in proc.stderr


def test_the_sender_refuses_a_missing_attachments_root_while_others_ignore_it(
        cli: Cli, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir")
    proc = cli("sender", POSTROOM_ATTACHMENTS_ROOT=missing)
    assert proc.returncode == 2
    assert error_line(proc) == (f"postroom sender: configuration error: "
                                f"POSTROOM_ATTACHMENTS_ROOT: not a directory: {missing}")
    assert cli("status", POSTROOM_ATTACHMENTS_ROOT=missing).returncode == 0


@pytest.mark.parametrize("command", [
    ["db", "upgrade"], ["topics", "create"], ["relay"], ["sender"], ["recorder"], ["lag"],
    ["enqueue", "--to", "a@example.com", "--subject", "S", "--body", "b"],
], ids=" ".join)
def test_every_command_reads_the_settings_before_doing_anything(
        cli: Cli, command: list[str]) -> None:
    proc = cli(*command, POSTROOM_SMTP_PORT="abc")
    assert proc.returncode == 2
    assert error_line(proc) == (f"postroom {command[0]}: configuration error: POSTROOM_SMTP_PORT: "
                                "expected a whole number such as 25 (a TCP port, 1 to 65535), "
                                "got 'abc'")


@pytest.mark.parametrize("command", [
    ["status"], ["db", "upgrade"], ["relay"], ["recorder"],
    ["enqueue", "--to", "a@example.com", "--subject", "S", "--body", "b"],
], ids=" ".join)
def test_an_unreachable_database_is_one_clean_line(cli: Cli, command: list[str]) -> None:
    proc, seconds, refusal_seconds = beside_a_refusal(cli, command,
                                                      POSTROOM_DATABASE_URL=UNREACHABLE_URL)
    assert proc.returncode == 1
    line = error_line(proc)
    assert line.startswith(f"postroom {command[0]}: error: cannot use the database "
                           "(POSTROOM_DATABASE_URL): ")
    assert "port 1" in line
    assert seconds < refusal_seconds + UNREACHABLE_MARGIN_S, (seconds, refusal_seconds)


@pytest.mark.parametrize("command", [
    ["dlq", "list"], ["dlq", "replay", "--all", "--dry-run"], ["requeue", "--key", "k"],
    ["report", "failures"], ["report", "failures", "--to", "a@example.com"],
    ["purge", "--older-than", "30d", "--dry-run"], ["lag"],
], ids=" ".join)
def test_the_operators_commands_say_an_unreachable_database_in_one_line(
        stack_cli: Cli, command: list[str]) -> None:
    proc, seconds, refusal_seconds = beside_a_refusal(stack_cli, command,
                                                      POSTROOM_DATABASE_URL=UNREACHABLE_URL)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert line.startswith(f"postroom {command[0]}: error: cannot use the database "
                           "(POSTROOM_DATABASE_URL): "), proc.stderr
    assert "port 1" in line
    assert seconds < refusal_seconds + UNREACHABLE_MARGIN_S, (seconds, refusal_seconds)


# -- relay and lag ---------------------------------------------------------------------------------

def test_relay_publishes_and_stops_cleanly_on_sigterm(
        stack_cli: Cli, settings: Settings, tmp_path: Path,
        consume: Callable[..., list[Any]]) -> None:
    high = priority_topic(settings.topic_prefix, Priority.HIGH)
    enqueue = ["enqueue", "--key", "k", "--subject", "S", "--body", "b", "--priority", "high"]
    stack_cli.ok(*enqueue, "--to", "before@example.com")  # waiting when the relay starts
    log = tmp_path / "relay.log"
    relay = stack_cli.start("relay", log=log)
    try:
        assert [r.key for r in consume(settings, [high], expected=1, timeout_s=30)] == [
            b"k|before@example.com"], log.read_text()
        stack_cli.ok(*enqueue, "--to", "after@example.com")  # enqueued while it runs
        records = consume(settings, [high], expected=2, timeout_s=30)
        assert sorted(r.key for r in records) == [b"k|after@example.com", b"k|before@example.com"]
        rows = stack_cli.status("k")
        assert [r["status"] for r in rows] == ["published", "published"]
        assert all(r["published_at"] is not None for r in rows)
        assert relay.poll() is None, log.read_text()
    finally:
        started = time.monotonic()
        code = stop_process(relay, timeout_s=15)  # SIGTERM; SIGKILL (status -9) after 15 s
        stopped_after = time.monotonic() - started
    stderr = log.read_text()
    assert code == 0, stderr
    assert stopped_after < STOP_WITHIN_S, f"took {stopped_after:.1f}s to stop"
    assert "received SIGTERM, stopping cleanly" in stderr
    assert "Traceback" not in stderr


@pytest.mark.partitions(3)  # a partition read and committed beside ones never read
def test_lag_prints_one_row_per_partition_of_both_groups(
        stack_cli: Cli, settings: Settings, engine: sa.Engine,
        consume: Callable[..., list[Any]]) -> None:
    prefix = settings.topic_prefix
    high = priority_topic(prefix, Priority.HIGH)
    stack_cli.ok("enqueue", "--key", "k", "--to", "a@example.com", "--to", "b@example.com",
                 "--to", "c@example.com", "--subject", "S", "--body", "b", "--priority", "high")
    assert publish_round(Relay(settings, engine)) == 3
    [first, *_] = consume(settings, [high], expected=3)
    sender_group = stack_cli.env["POSTROOM_SENDER_GROUP"]
    recorder_group = stack_cli.env["POSTROOM_RECORDER_GROUP"]
    # The sender group has consumed the first record of one partition.
    committer = Consumer({**settings.kafka_client_config(), "group.id": sender_group})
    try:
        committer.commit(offsets=[TopicPartition(high, first.partition, first.offset + 1)],
                         asynchronous=False)
    finally:
        committer.close()

    started = time.time()
    *rows, outbox_row = [json.loads(line)
                         for line in stack_cli.ok("lag", "--json").stdout.splitlines()]
    partitions = int(os.environ.get("POSTROOM_TOPIC_PARTITIONS", "6"))
    sender_topics = [*(priority_topic(prefix, p) for p in Priority),
                     *(retry_topic(prefix, n) for n in range(1, 5))]
    assert [(r["group"], r["topic"], r["partition"]) for r in rows] == [
        *((sender_group, t, p) for t in sender_topics for p in range(partitions)),
        *((recorder_group, results_topic(prefix), p) for p in range(partitions))]
    for row in rows:
        retry = row["topic"].startswith(f"{prefix}email.retry.")
        assert set(row) == (LAG_FIELDS | RETRY_FIELDS if retry else LAG_FIELDS)
        # Nobody consumes: the groups are empty, and a group with lag has stopped.
        assert (row["group_state"], row["group_members"]) in {("empty", 0), ("dead", 0)}
        if (row["topic"], row["partition"]) == (high, first.partition):
            assert row["committed"] == first.offset + 1
            assert row["lag"] == row["end"] - first.offset - 1
        else:
            assert row["committed"] is None
            assert row["lag"] == row["end"]
        if row["lag"]:
            # The first unconsumed record was published by the relay above, before `started`.
            assert 0 < row["lag_seconds"] < time.time() - started + 60
            assert row["verdict"] == "STOP"
        else:
            assert (row["lag_seconds"], row["verdict"]) == (0, "OK")
    assert {r["group_verdict"] for r in rows if r["group"] == sender_group} == {"STOP"}
    assert {r["group_verdict"] for r in rows if r["group"] == recorder_group} == {"OK"}
    assert sum(r["end"] for r in rows if r["topic"] == high) == 3
    assert sum(r["lag"] for r in rows) == 2
    assert outbox_row == {"outbox_backlog": 0, "outbox_oldest_age_seconds": None}

    text = stack_cli.ok("lag").stdout.splitlines()
    assert any(line.startswith(f"{sender_group}: STOP, state ") and line.endswith(
        "total lag 2, max " + line.rsplit("max ", 1)[1]) for line in text), text
    assert any(line.startswith(f"{recorder_group}: OK, state ") and "total lag 0" in line
               for line in text), text
    # Nobody consumes, in words a person reads.
    assert any(line.startswith(f"{sender_group}: ") and
               "members none (no sender is running)" in line for line in text), text
    assert any(line.startswith(f"{recorder_group}: ") and
               "members none (no recorder is running)" in line for line in text), text
    assert any(line.startswith(f"  {high}[{first.partition}] committed={first.offset + 1} end=")
               for line in text), text
    assert text[-1] == "outbox: 0 row(s) waiting for the relay"
    only = stack_cli.ok("lag", "--group", recorder_group, "--json").stdout.splitlines()
    assert {json.loads(line).get("group") for line in only[:-1]} == {recorder_group}
    proc = stack_cli("lag", "--group", "nobody")
    assert proc.returncode == 2
    assert "'nobody' is not one of postroom's groups" in error_line(proc)


def test_a_sender_beyond_the_partition_count_is_named_idle_by_lag_and_check(
        stack_cli: Cli, settings: Settings) -> None:
    """Issue 45 item 5: a fourth sender on three partitions sat idle and nothing said so, and
    `lag` listed every member as `postroom-postroom.sender@/127.0.0.1`. Four members of the
    sender group (range assignment, as the sender asks), one process: alike client ids."""
    import threading

    from postroom.kafka import make_consumer

    partitions = int(stack_cli.env["POSTROOM_TOPIC_PARTITIONS"])
    topics = [priority_topic(settings.topic_prefix, p) for p in Priority]
    members = [make_consumer(settings, settings.sender_group,
                             **{"partition.assignment.strategy": "range",
                                "group.protocol": "classic"})
               for _ in range(partitions + 1)]
    stop = threading.Event()

    def keep_polling() -> None:
        while not stop.is_set():
            for member in members:
                member.poll(0.05)

    for member in members:
        member.subscribe(topics)
    poller = threading.Thread(target=keep_polling, daemon=True)
    poller.start()
    try:
        def settled() -> list[str] | None:
            text = stack_cli.ok("lag", "--group", settings.sender_group).stdout.splitlines()
            return text if "state stable" in text[0] and "IDLE" in text[0] else None
        lines = wait_until(settled, 60, "the group to settle with a member standing by")
        assert lines[0].count(" partitions, IDLE)") == 1, lines[0]
        assert lines[0].count("[member ") == partitions + 1, lines[0]  # all apart
        assert f"postroom-{settings.sender_group}-" in lines[0]
        assert lines[1] == (f"  WARN 1 of {partitions + 1} members own no partition and stand "
                            "by: the group has more members than its topics have partitions "
                            "(POSTROOM_TOPIC_PARTITIONS)")
        check = stack_cli("check", "--role", "sender")
        groups = [line for line in check.stdout.splitlines()
                  if "owns no partition and stands by" in line]
        assert len(groups) == 1 and groups[0].startswith(
            f"      WARN postroom-{settings.sender_group}-"), check.stdout
        assert any(line.startswith("WARN  groups: ") for line in check.stdout.splitlines())
    finally:
        stop.set()
        poller.join()
        for member in members:
            member.close()


def test_check_passes_when_everything_is_ready(stack_cli: Cli) -> None:
    from postroom.devkit.devsmtp import DevSmtpServer

    with DevSmtpServer(port=0) as server:
        proc = stack_cli("check", POSTROOM_SMTP_HOST="127.0.0.1",
                         POSTROOM_SMTP_PORT=str(server.port), POSTROOM_SMTP_TLS="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == [
        "ok    database", "ok    kafka", "ok    groups", "ok    registry", "ok    smtp",
        "WARN  attachments"]
    assert "POSTROOM_ATTACHMENTS_ROOT is not set" in lines[6]  # a warning: the exit code is 0
    assert "all 9 topics exist" in lines[1]
    assert "none configured" in lines[4] and "schemaless" in lines[4]
    # The protocol each group joins with: the local broker keeps Kafka's 45 s KIP-848 session,
    # so both are classic, and the lines say why.
    env = stack_cli.env
    assert lines[2].startswith(f"ok    groups: {env['POSTROOM_SENDER_GROUP']} joins with the "
                               "classic protocol (under KIP-848 the group's session would be 45 s")
    assert lines[3].startswith(f"      {env['POSTROOM_RECORDER_GROUP']} joins with the classic")


@pytest.mark.parametrize(("role", "checked"), [
    ("relay", ["database", "kafka", "registry"]),
    ("recorder", ["database", "kafka", "groups", "registry"]),
    ("bounces", ["database", "kafka", "registry"]),
    ("admin", ["database", "kafka", "registry"]),
    ("sender", ["database", "kafka", "groups", "registry", "smtp", "attachments"]),
])
def test_check_for_a_role_checks_only_what_it_uses(stack_cli: Cli, role: str,
                                                   checked: list[str]) -> None:
    """Issue 45 item 3: `check --role relay` FAILed on SMTP, which only the sender uses. No
    SMTP server listens on POSTROOM_SMTP_HOST's port 25 here."""
    proc = stack_cli("check", "--role", role)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert [line[6:].split(":")[0] for line in lines] == checked, proc.stdout
    assert proc.returncode == (1 if role == "sender" else 0), proc.stdout
    kafka = next(line for line in lines if line.startswith("ok    kafka: "))
    its = {"relay": "all 3 of its topics", "recorder": "its one topic", "bounces": "its one topic",
           "admin": "all 9 of its topics", "sender": "all 9 of its topics"}[role]
    assert kafka.startswith(f"ok    kafka: broker answers; the {role} role may use {its};"), kafka


def test_check_names_each_thing_that_is_not_ready(new_schema: str) -> None:
    proc = cli_for(new_schema, unique_name("e2e_none") + ".")(
        "check", POSTROOM_SMTP_HOST="127.0.0.1", POSTROOM_SMTP_PORT="1")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("FAIL  database: ") and "postroom db upgrade" in lines[0]
    # one line per topic under the kafka line
    assert lines[1] == "FAIL  kafka: 9 of 9 topics not usable"
    assert lines[2].endswith("email.high: missing (run `postroom topics create`)"), lines
    assert all(line.endswith(": missing (run `postroom topics create`)") for line in lines[2:11])
    assert lines[11].startswith("ok    registry: none configured")
    assert lines[12].startswith("FAIL  smtp: connect: refused at 127.0.0.1:1 "
                                "(POSTROOM_SMTP_HOST, POSTROOM_SMTP_PORT)")
    assert lines[13].startswith("WARN  attachments: POSTROOM_ATTACHMENTS_ROOT is not set")
    assert "Traceback" not in proc.stderr


# -- metrics, health and readiness ------------------------------------------------------------------

def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - localhost
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _answered_readiness(base: str) -> tuple[int, str]:
    """/readyz once each check has answered: /readyz waits 0.8 s for a run of the checks and says
    `no answer after` for one still running (a loaded machine), whose answer a later ask gets."""
    def answered() -> tuple[int, str] | None:
        status, text = _get(f"{base}/readyz")
        return None if "no answer after" in text or "not checked yet" in text else (status, text)
    return wait_until(answered, SERVED_WITHIN_S, "every readiness check to answer")


def _wait_until_served(url: str, proc: Started, log: Path,
                       ready: Callable[[str], bool] = lambda body: True) -> str:
    """The body ``url`` serves once the process listens and ``ready(body)``; fails if the
    process exits or SERVED_WITHIN_S pass first."""
    deadline = time.monotonic() + SERVED_WITHIN_S
    while True:
        try:
            status, body = _get(url)
            if status == 200 and ready(body):
                return body
        except OSError:
            pass  # not listening yet
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def test_a_trace_is_seen_without_a_collector_with_the_console_exporter(
        stack_cli: Cli, tmp_path: Path) -> None:
    """Issue 45 item 9: OTEL_TRACES_EXPORTER=console was refused ("OTLP only"): seeing a trace
    needed a collector. The relay prints each row's span on stdout as JSON."""
    cli = dataclasses.replace(stack_cli, env={**stack_cli.env, "OTEL_TRACES_EXPORTER": "console",
                                              "OTEL_BSP_SCHEDULE_DELAY": "100"})
    log = tmp_path / "relay.log"
    relay = cli.start("relay", log=log)
    try:
        cli.ok("enqueue", "--key", "traced", "--to", "a@example.com", "--subject", "S",
               "--body", "b")
        wait_until(lambda: '"name": "send ' in log.read_text(errors="replace"), 30,
                   "the relay to print its span")
    finally:
        assert stop_process(relay) == 0, log.read_text()
    text = log.read_text(errors="replace")
    assert "spans printed on stdout as JSON (OTEL_TRACES_EXPORTER=console)" in text
    assert '"postroom.outbox_id"' in text and "Traceback" not in text
    quiet = dataclasses.replace(stack_cli, env={**stack_cli.env, "OTEL_TRACES_EXPORTER": "none",
                                                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    log = tmp_path / "quiet.log"
    relay = quiet.start("relay", log=log)
    try:
        quiet.ok("enqueue", "--key", "untraced", "--to", "a@example.com", "--subject", "S",
                 "--body", "b")
        wait_until(lambda: [r["published_at"] is not None for r in quiet.status("untraced")]
                   == [True], 30, "the relay to publish the row")
    finally:
        assert stop_process(relay) == 0, log.read_text()
    assert "tracing:" not in log.read_text() and '"name"' not in log.read_text()


@pytest.mark.parametrize("role", ["relay", "recorder", "sender"])
def test_every_role_serves_metrics_healthz_and_readyz(
        stack_cli: Cli, role: str, tmp_path: Path) -> None:
    port = free_port()
    # No SMTP server listens on port 1: the sender runs, and says it is not ready.
    cli = dataclasses.replace(stack_cli, env={
        **stack_cli.env, "POSTROOM_METRICS_PORT": str(port), "POSTROOM_SMTP_HOST": "127.0.0.1",
        "POSTROOM_SMTP_PORT": "1", "POSTROOM_SMTP_CONNECT_TIMEOUT": "1s"})
    log = tmp_path / f"{role}.log"
    proc = cli.start(role, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        assert _wait_until_served(f"{base}/healthz", proc, log) == "ok\n"
        status, text = _answered_readiness(base)
        lines = text.splitlines()
        assert lines[0] == "ok database: schema at the newest revision"
        assert lines[1] == "ok kafka: broker answers; all 9 topics exist"
        assert lines[-1] == "ok kafka clients: no client in a fatal state"
        if role == "sender":
            assert status == 503
            assert lines[2].startswith("FAIL smtp: connect"), text
        else:
            assert (status, len(lines)) == (200, 3), text
        status, text = _get(f"{base}/metrics")
        assert status == 200
        assert "# TYPE process_cpu_seconds_total counter" in text
        assert 'postroom_ready{check="database"} 1.0' in text
    finally:
        assert stop_process(proc) == 0, log.read_text()


def test_a_second_sender_on_a_taken_metrics_port_stops_in_one_line_and_port_0_takes_any(
        stack_cli: Cli, tmp_path: Path) -> None:
    """Issue 45 item 5: a second sender on one host with the same POSTROOM_METRICS_PORT died
    with an OSError traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = stack_cli("sender", POSTROOM_METRICS_PORT=str(port))
    assert (proc.returncode, error_line(proc)) == (
        2, f"postroom sender: configuration error: POSTROOM_METRICS_PORT: 127.0.0.1:{port} is "
           "taken (another postroom process on this host?): give each process a port of its "
           "own, or 0 for any free one")
    log = tmp_path / "sender.log"
    cli = dataclasses.replace(stack_cli, env={**stack_cli.env, "POSTROOM_METRICS_PORT": "0"})
    started = cli.start("sender", log=log)
    try:
        found = wait_until(lambda: re.search(r"/readyz on http://127\.0\.0\.1:(\d+)",
                                             log.read_text(errors="replace")), 30,
                           "the sender to log the port it serves on")
        assert _wait_until_served(f"http://127.0.0.1:{found[1]}/healthz", started, log) == "ok\n"
    finally:
        assert stop_process(started) == 0, log.read_text()


def test_lag_watch_serves_the_lag_metrics_under_kafka_lag_exporters_names(
        stack_cli: Cli, settings: Settings, engine: sa.Engine, tmp_path: Path) -> None:
    import socket

    stack_cli.ok("enqueue", "--key", "k", "--to", "a@example.com", "--subject", "S", "--body", "b",
                 "--priority", "high")
    assert publish_round(Relay(settings, engine)) == 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cli = dataclasses.replace(stack_cli, env={**stack_cli.env, "POSTROOM_METRICS_PORT": str(port),
                                              "POSTROOM_KAFKA_CLUSTER_NAME": "test-cluster"})
    log = tmp_path / "lag.log"
    proc = cli.start("lag", "--watch", "0.5", log=log)
    group = stack_cli.env["POSTROOM_SENDER_GROUP"]
    try:
        sum_lag = f'kafka_consumergroup_group_sum_lag{{cluster_name="test-cluster",group="{group}"}}'
        text = _wait_until_served(f"http://127.0.0.1:{port}/metrics", proc, log,
                                  lambda body: sum_lag in body)
        assert f"{sum_lag} 1.0" in text
        assert "# TYPE kafka_consumergroup_group_lag_seconds gauge" in text
        assert f'postroom_consumergroup_status{{group="{group}"}}' in text
        assert "postroom_outbox_backlog 0.0" in text
        assert _answered_readiness(f"http://127.0.0.1:{port}")[0] == 200
    finally:
        assert stop_process(proc) == 0, log.read_text()
    output = log.read_text()
    assert "sampling every 0.5s until stopped" in output
    # Each sample's table starts with the time it was taken.
    stamps = re.findall(r"^-- (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC --$", output, re.MULTILINE)
    tables = re.findall(rf"^{re.escape(group)}: ", output, re.MULTILINE)
    assert len(stamps) == len(tables) >= 1, output
    taken = dt.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
    assert abs(dt.datetime.now(dt.UTC) - taken) < dt.timedelta(minutes=2)
