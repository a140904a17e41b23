"""Issue 23: rows written by SQL that no event can carry, beside genuine ones, in a real
PostgreSQL and broker. The relay publishes the genuine ones and ends the others ``failed`` with
``poison: <reason>``; it never stops, and never claims them again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.relay.publisher import Relay
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic
from support.metrics import counter

pytestmark = pytest.mark.integration

# (message key, the columns that make it poison, as SQL, and a word of the reason it must give)
HOSTILE = [
    ("null-attachment", {"attachments": "ARRAY[NULL]::text[]"}, "attachments holds None"),
    ("null-among-attachments", {"attachments": "ARRAY['/data/a.pdf', NULL]"}, "holds None"),
    ("null-inline", {"inline": "ARRAY[NULL, '/data/a.png']::text[]", "html": "'<p>x</p>'"},
     "inline holds None"),
    ("two-dimensional", {"attachments": "'{{/a,/b},{/c,/d}}'::text[]"}, "not a path"),
    ("proc-attachment", {"attachments": "ARRAY['/proc/self/environ']"}, "pseudo file system"),
    ("created-infinity", {"created_at": "'infinity'"}, "created_at None"),
    ("created-minus-infinity", {"created_at": "'-infinity'"}, "created_at None"),
    ("created-294276", {"created_at": "'294276-12-31 23:59:59+00'"}, "years 1 to 9999"),
    ("created-bc", {"created_at": "'4713-01-01 00:00:00+00 BC'"}, "years 1 to 9999"),
    ("attempts-max", {"attempts": "2147483647"}, "out of range"),
    ("attempts-negative", {"attempts": "-3"}, "out of range"),
    ("bad-recipient", {"recipient": "'not an address'"}, "recipient"),
    ("empty-recipient", {"recipient": "''"}, "recipient is empty"),
    ("huge-recipient", {"recipient": "repeat('x', 100000) || '@example.com'"}, "longer than"),
    ("header-subject", {"subject": "E'hi\\r\\nBcc: all@example.com'"}, "line break"),
    ("blank-subject", {"subject": "' '"}, "subject is empty"),
    ("list-sender", {"sender": "'a@example.com, b@example.com'"}, "sender"),
    ("empty-key", {"idempotency_key": "''"}, "idempotency key"),
    ("control-key", {"message_key": "E'k\\x01'"}, "message key"),
]
COLUMNS = ("idempotency_key", "message_key", "recipient", "sender", "subject", "body",
           "attachments", "html", "inline", "priority", "created_at", "attempts")


def insert_hostile(conn: sa.Connection) -> None:
    for key, changes, _ in HOSTILE:
        values = {"idempotency_key": f"'{key}|a@example.com'", "message_key": f"'{key}'",
                  "recipient": "'a@example.com'", "sender": "NULL", "subject": "'S'",
                  "body": "'b'", "attachments": "'{}'", "html": "NULL", "inline": "'{}'",
                  "priority": "'normal'", "created_at": "now()", "attempts": "0",
                  **changes}
        conn.execute(sa.text(
            f"INSERT INTO outbox ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join(values[name] for name in COLUMNS)})"))


def statuses(engine: sa.Engine) -> list[tuple[str, str | None]]:
    """(status, last_error) of every row, in the order written."""
    with engine.connect() as conn:
        return [(row.status, row.last_error) for row in conn.execute(sa.text(
            "SELECT status, last_error FROM outbox ORDER BY id"))]


def test_hostile_rows_end_failed_as_poison_and_the_genuine_ones_are_published(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="before", recipients=["a@example.com", "b@example.com"],
                subject="S", body="b")
        insert_hostile(conn)
        enqueue(conn, key="after", recipients=["c@example.com"], subject="S", body="b",
                priority="high")
    # A small batch: the hostile rows come in several rounds, with genuine ones among them.
    relay = Relay(Settings(**{**settings.__dict__, "relay_batch_size": 4}), engine)
    thread = threading.Thread(target=relay.run, name="relay")
    thread.start()
    try:
        wait_until(lambda: all(status != "pending" for status, _ in statuses(engine)),
                   30, "every row published or failed")
        records = consume(settings, [priority_topic(settings.topic_prefix, p) for p in Priority],
                          expected=3, timeout_s=15)
        assert thread.is_alive(), "the relay stopped"
    finally:
        relay.stop()
        thread.join(timeout=10)
    before_a, before_b, *hostile, after = statuses(engine)
    assert [before_a, before_b, after] == [("published", None)] * 3
    for (key, _, reason), (status, error) in zip(HOSTILE, hostile, strict=True):
        assert status == "failed", key
        assert error is not None and error.startswith("poison: ") and reason in error, (key, error)
    assert sorted(r.key for r in records) == [b"after|c@example.com", b"before|a@example.com",
                                              b"before|b@example.com"]
    assert counter(relay.metrics, "relay_poison_total") == len(HOSTILE)
    assert relay.stats.errors == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 0
