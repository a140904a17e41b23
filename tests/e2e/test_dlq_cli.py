"""`postroom dlq list`, `dlq replay` and `requeue` as an operator runs them, on dead letters
written to the topic as the sender writes them: time order, one line per key, the same
replayable count in the list and in the replay's plan, true words for a row that has no final
state, unknown keys refused, and dead letters in the Confluent wire format decoded through the
Schema Registry. Judged by exit code, output and the rows in the database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

import support.registry
from postroom.devkit.scratch import scratch_env
from postroom.headers import DLQ_CLASS_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, ERROR_HEADER
from postroom.relay.db import make_engine
from postroom.relay.outbox import enqueue
from postroom.schemas.codec import EmailRequested
from postroom.schemas.framing import SCHEMALESS, Framing
from postroom.schemas.registry import framing_for, register_contract
from postroom.settings import Settings
from postroom.topics import dead_letter_topic, priority_topic
from support.commands import run_postroom
from support.foreign import produce_raw

# Letters on two partitions, listed and paged across them.
pytestmark = [pytest.mark.e2e, pytest.mark.partitions(3)]

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
# recipient -> the state its row is in now
ROWS = {"a@example.com": "dead", "b@example.com": "failed", "c@example.com": "published",
        "d@example.com": "sent"}


@pytest.fixture
def engine(settings: Settings) -> Iterator[sa.Engine]:
    eng = make_engine(settings)
    yield eng
    eng.dispose()


def postroom(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = run_postroom(*args, env={**os.environ, **scratch_env(settings), **env}, timeout_s=90)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def ok(settings: Settings, *args: str, **env: str) -> list[str]:
    proc = postroom(settings, *args, **env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def rows_of(engine: sa.Engine, states: dict[str, str]) -> dict[str, int]:
    """Queue one row per recipient of message m and put each in its state; recipient -> id."""
    with engine.begin() as conn:
        enqueue(conn, key="m", subject="Report", body="b", recipients=list(states))
        for recipient, state in states.items():
            conn.execute(sa.text("UPDATE outbox SET status = :s, attempts = 1 "
                                 "WHERE recipient = :r"), {"s": state, "r": recipient})
        conn.execute(sa.text("DELETE FROM outbox_queue"))
        return {r: i for i, r in conn.execute(sa.text("SELECT id, recipient FROM outbox"))}


def dead_letter(producer: Producer, settings: Settings, framing: Framing, *, recipient: str | None,
                outbox_id: int, ago: dt.timedelta, partition: int, classification: str,
                reason: str) -> None:
    source = priority_topic(settings.topic_prefix, "normal")
    if recipient is None:
        key, value, headers = None, b"\x07not avro", []
    else:
        event = EmailRequested(
            idempotency_key=f"m|{recipient}", message_key="m", outbox_id=outbox_id,
            recipient=recipient, sender="reports@example.com", subject="Report", body="b",
            attachments=(), priority="normal", created_at=NOW - dt.timedelta(days=1))
        value, headers = framing.frame(source, event)
        key = event.idempotency_key.encode()
    producer.produce(
        dead_letter_topic(settings.topic_prefix), key=key, value=value, partition=partition,
        timestamp=int((NOW - ago).timestamp() * 1000),
        headers=[*headers, (ERROR_HEADER, b"attempt=1 " + reason.encode()),
                 (DLQ_CLASS_HEADER, classification.encode()), (DLQ_REASON_HEADER, reason.encode()),
                 (DLQ_TOPIC_HEADER, source.encode())])


def write_dead_letters(settings: Settings, ids: dict[str, int], framing: Framing) -> None:
    """Partition order differs from time order on purpose; a@ is dead-lettered twice."""
    producer = Producer(settings.kafka_client_config())
    h = dt.timedelta(hours=1)
    for recipient, ago, partition, classification in [
            ("a@example.com", 1 * h, 0, "transient-exhausted"),
            ("b@example.com", 2 * h, 0, "permanent"),
            ("a@example.com", 3 * h, 1, "transient-exhausted"),
            ("d@example.com", 4 * h, 1, "transient-exhausted"),
            ("c@example.com", 0.5 * h, 1, "poison"),  # refused at admission; its row published
            (None, 5 * h, 0, "poison")]:               # not ours at all
        dead_letter(producer, settings, framing, recipient=recipient,
                    outbox_id=ids.get(recipient or "", 0), ago=ago, partition=partition,
                    classification=classification, reason=f"why {recipient}")
    assert producer.flush(10) == 0


@pytest.fixture
def letters(settings: Settings, engine: sa.Engine) -> None:
    write_dead_letters(settings, rows_of(engine, ROWS), SCHEMALESS)


@pytest.mark.usefixtures("letters")
def test_dlq_list_is_time_ordered_one_line_per_key_and_counts_what_replay_plans(
        settings: Settings) -> None:
    listed = ok(settings, "dlq", "list")
    assert [line.split(" | ")[1] for line in listed[:-1]] == [
        "0@2", "m|d@example.com", "m|b@example.com",
        "m|a@example.com", "m|c@example.com"]
    times = [line.split(" | ")[0] for line in listed[:-1]]
    assert times == sorted(times)
    [a_line] = [line for line in listed if " | m|a@example.com | " in line]
    assert a_line.endswith("row=dead (replayable) | 2 dead letters, latest shown")
    assert a_line.startswith((NOW - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert listed[-1] == "6 dead letter(s) of 5 key(s), 2 replayable with `postroom dlq replay`"

    plan = ok(settings, "dlq", "replay", "--all", "--dry-run")
    assert plan[0] == "will replay 2 row(s):"  # as many as the list counts
    assert sorted(plan[1:3]) == ["  m|a@example.com (dead after 1 attempt(s))",
                                 "  m|b@example.com (failed after 1 attempt(s))"]
    skips = dict(line.removeprefix("  skip ").split(": ", 1) for line in plan[3:-1])
    assert skips["m|c@example.com"].startswith("row is published: no final state yet")
    assert "replayed already" not in "\n".join(plan)
    assert skips["m|d@example.com"].startswith("row is sent: delivered since")
    [poison] = [why for key, why in skips.items() if not key.startswith("m|")]
    assert poison.startswith("unreadable record (why None)")
    assert plan[-1] == "dry run: nothing changed"

    # JSON: every dead letter, oldest first.
    records = [json.loads(line) for line in ok(settings, "dlq", "list", "--json")]
    assert [r["at"] for r in records] == sorted(r["at"] for r in records)
    assert [r["key"] for r in records].count("m|a@example.com") == 2


@pytest.mark.usefixtures("letters")
def test_unknown_keys_are_refused_with_one_line_and_change_nothing(
        settings: Settings, engine: sa.Engine) -> None:
    for args, command in ((["requeue", "--key", "nosuch"], "requeue"),
                          (["requeue", "--key", "m", "--recipient", "z@example.com"], "requeue"),
                          (["dlq", "replay", "--key", "nosuch"], "dlq")):
        proc = postroom(settings, *args)
        assert (proc.returncode, proc.stdout) == (1, ""), args
        *progress, line = proc.stderr.strip().splitlines()
        assert progress == ([f"reading {settings.topic_prefix}email.dead ..."]
                            if command == "dlq" else [])
        assert line.startswith(f"postroom {command}: error: unknown key "), line
    # A key that exists with nothing to send again says what its rows are, and exits 0.
    assert ok(settings, "requeue", "--key", "m", "--recipient", "c@example.com") == [
        "will requeue 0 row(s)",
        "  skip m for c@example.com: no failed or dead row (nothing to send again; 1 published)",
        "requeued nothing"]
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT recipient, status FROM outbox")).all())
    assert states == ROWS


def test_dead_letters_in_the_confluent_wire_format_are_read_through_the_registry(
        settings: Settings, engine: sa.Engine) -> None:
    url = support.registry.registry_url()
    on_registry = dataclasses.replace(settings, schema_registry_url=url)
    try:
        register_contract(on_registry)
        framing = framing_for(on_registry)
        assert framing.uses_registry
        write_dead_letters(settings, rows_of(engine, ROWS), framing)
        env = {"POSTROOM_SCHEMA_REGISTRY_URL": url}
        records = [json.loads(line) for line in ok(settings, "dlq", "list", "--json", **env)]
        framed = [r for r in records if r["key"]]
        assert len(framed) == 5
        assert all(r["message_key"] == "m" and r["subject"] == "Report" for r in framed)
        assert {r["recipient"] for r in framed} == set(ROWS)
        # By message key, as `dlq replay --key` takes it.
        plan = ok(settings, "dlq", "replay", "--key", "m", "--dry-run", **env)
        assert plan[0] == "will replay 2 row(s):"
    finally:
        support.registry.delete_subjects(url, on_registry)


def test_a_registry_that_does_not_answer_stops_dlq_list_in_one_line(
        settings: Settings, engine: sa.Engine) -> None:
    # A framed dead letter (schema id 1) is not "unreadable" because the registry is down.
    producer = Producer(settings.kafka_client_config())
    producer.produce(dead_letter_topic(settings.topic_prefix), key=b"m|a@example.com",
                     value=b"\x00\x00\x00\x00\x01" + b"\x02", headers=[(DLQ_CLASS_HEADER, b"x")])
    assert producer.flush(10) == 0
    proc = postroom(settings, "dlq", "list", POSTROOM_SCHEMA_REGISTRY_URL="http://127.0.0.1:1")
    assert (proc.returncode, proc.stdout) == (1, "")
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("postroom dlq: error: cannot decode the dead letters: the schema "
                           "registry (POSTROOM_SCHEMA_REGISTRY_URL) does not answer"), line


def test_hostile_dead_letters_are_listed_not_a_traceback(settings: Settings) -> None:
    # Anyone with produce rights may write the topic: a NUL in the key (PostgreSQL text cannot
    # hold one), a reason with line breaks, no value. (A time stamp no datetime holds is refused
    # by this broker; the unit test of the decoding covers it.)
    producer = Producer(settings.kafka_client_config())
    topic = dead_letter_topic(settings.topic_prefix)
    producer.produce(topic, key=b"m|\x00a@example.com", value=b"x", partition=0,
                     headers=[(DLQ_REASON_HEADER, b"one\nFAKE | line\r\n")])
    producer.produce(topic, key=b"k", value=None, partition=0)
    assert producer.flush(10) == 0
    listed = ok(settings, "dlq", "list")
    assert len(listed) == 3
    assert "one FAKE | line" in listed[0]
    assert " | k | " in listed[1]
    assert listed[-1] == "2 dead letter(s), 0 replayable with `postroom dlq replay`"
    assert ok(settings, "dlq", "replay", "--all")[-1] == "replayed nothing"


def test_a_dead_letter_whose_header_name_is_not_utf8_is_listed(settings: Settings) -> None:
    """Another client's record on the dead-letter topic with a header name that is not UTF-8:
    confluent-kafka's headers() left a NULL name behind (a SystemError, or a crash at the next
    touch); dlq list shows it as one unreadable letter and goes on to the next."""
    topic = dead_letter_topic(settings.topic_prefix)
    for n in range(3):  # enough reads before it that the interpreter specialises the call
        produce_raw(settings, topic, 0, f"warm{n}".encode(), b"\x07", [(b"x", b"1")])
    produce_raw(settings, topic, 0, b"foreign", b"\x07not avro", [(b"\xff\xfe trace", b"1")])
    producer = Producer(settings.kafka_client_config())
    producer.produce(topic, key=b"after", value=b"\x07", partition=0)
    assert producer.flush(10) == 0
    listed = ok(settings, "dlq", "list")
    keys = [line.split(" | ")[1] for line in listed[:-1]]
    assert keys == ["warm0", "warm1", "warm2", "foreign", "after"]
    assert listed[-1] == "5 dead letter(s), 0 replayable with `postroom dlq replay`"


def test_a_large_dead_letter_topic_is_listed_and_replayed_in_pages(
        settings: Settings, engine: sa.Engine) -> None:
    """Issue 46 item 10: 2,800 dead letters (300 keys twice), read in pages of 1,000 with
    progress, a limit naming where the next page starts, and a replay of every row across the
    pages, each row once. The read had to finish within 30 s, all letters held at once."""
    rows = 2500
    recipients = [f"r{n}@example.com" for n in range(rows)]
    with engine.begin() as conn:
        enqueue(conn, key="m", subject="Report", body="b", recipients=recipients)
        conn.execute(sa.text("UPDATE outbox SET status = 'dead', attempts = 5"))
        conn.execute(sa.text("DELETE FROM outbox_queue"))
        ids = {r: i for i, r in conn.execute(sa.text("SELECT id, recipient FROM outbox"))}
    producer = Producer(settings.kafka_client_config())
    partitions = settings.topic_partitions
    for n, recipient in enumerate([*recipients, *recipients[:300]]):
        dead_letter(producer, settings, SCHEMALESS, recipient=recipient, outbox_id=ids[recipient],
                    ago=dt.timedelta(seconds=rows - n % rows), partition=n % partitions,
                    classification="transient-exhausted", reason="deferred")
        if n % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    total = rows + 300

    listed = postroom(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == total
    progress = listed.stderr.splitlines()
    assert progress[0] == f"reading {settings.topic_prefix}email.dead ..."
    assert f"read 1000 of {total} record(s) (35%), at " in listed.stderr

    first = postroom(settings, "dlq", "list", "--json", "--limit", "1200")
    assert first.returncode == 0, first.stderr
    [more] = [line for line in first.stderr.splitlines() if line.startswith("more: ")]
    after = more.removeprefix("more: postroom dlq list --after ")
    rest = postroom(settings, "dlq", "list", "--json", "--after", after)
    assert rest.returncode == 0, rest.stderr
    assert "more: " not in rest.stderr
    places = [[(r["partition"], r["offset"]) for r in map(json.loads, proc.stdout.splitlines())]
              for proc in (first, rest)]
    assert len(places[0]) == 1200
    assert len(set(places[0] + places[1])) == len(places[0]) + len(places[1]) == total

    text = ok(settings, "dlq", "list")
    assert len(text) == total + 1
    assert text[-1].startswith(f"{total} dead letter(s) in 3 pages, {total} replayable with ")

    dry = ok(settings, "dlq", "replay", "--all", "--dry-run")
    assert dry[-1] == f"in all: would replay {rows} row(s) of {total} dead letter(s) read, in 3 pages"
    done = ok(settings, "dlq", "replay", "--all")
    assert done[-1] == f"in all: replayed {rows} row(s) of {total} dead letter(s) read, in 3 pages"
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text(
            "SELECT status, count(*) FROM outbox GROUP BY status")).all())
    assert states == {"pending": rows}
