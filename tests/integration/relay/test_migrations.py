"""Schema migrations over data: what a deployment at an older revision has survives the upgrade."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from postroom import enqueue
from relay.db import downgrade, upgrade

pytestmark = pytest.mark.integration

ROWS_AT_0003 = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority,
                        status, published_at, claimed_until)
    VALUES ('sent|a', 'sent', 'a@example.com', 'S', 'b', 'normal', 'sent', now(), NULL),
           ('waiting|b', 'waiting', 'b@example.com', 'S', 'b', 'normal', 'pending', NULL, NULL),
           ('claimed|c', 'claimed', 'c@example.com', 'S', 'b', 'high', 'pending', NULL,
            now() + interval '1 minute')""")

QUEUE = sa.text("""
    SELECT o.message_key, q.claimed_until IS NOT NULL AS claimed
    FROM outbox_queue AS q JOIN outbox AS o USING (id) ORDER BY o.message_key""")


def test_0004_moves_unpublished_rows_and_their_claims_to_the_queue_and_back(
        engine: sa.Engine) -> None:
    assert downgrade(engine, "0003") == "0003"
    with engine.begin() as conn:
        conn.execute(ROWS_AT_0003)

    assert upgrade(engine) == "0008"  # to the head: enqueue() writes today's columns
    with engine.begin() as conn:
        assert conn.execute(QUEUE).all() == [("claimed", True), ("waiting", False)]
        # New rows enter the queue through the insert trigger, published ones do not.
        enqueue(conn, key="new", recipients=["d@example.com"], subject="S", body="b")
        assert [row.message_key for row in conn.execute(QUEUE)] == ["claimed", "new", "waiting"]
        # Deleting an outbox row takes it off the queue.
        conn.execute(sa.text("DELETE FROM outbox WHERE message_key = 'waiting'"))
        assert [row.message_key for row in conn.execute(QUEUE)] == ["claimed", "new"]

    assert downgrade(engine, "0003") == "0003"
    with engine.begin() as conn:
        claims = conn.execute(sa.text(
            "SELECT message_key, claimed_until IS NOT NULL FROM outbox "
            "WHERE published_at IS NULL ORDER BY message_key")).all()
        indexes = set(conn.execute(sa.text(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")).scalars())
        queue = conn.execute(sa.text("SELECT to_regclass('outbox_queue')")).scalar_one()
    assert claims == [("claimed", True), ("new", False)]
    assert {"outbox_unpublished", "outbox_undelivered"} <= indexes
    assert queue is None


ROWS_AT_0004 = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority)
    VALUES ('plain|a@example.com', 'plain', 'A@example.com', 'S', 'b', 'normal'),
           ('k|a|b@example.com', 'k|a', 'b@example.com', 'S', 'b', 'normal'),
           ('back\\slash|c@example.com', 'back\\slash', 'c@example.com', 'S', 'b', 'normal')""")
KEYS = sa.text("SELECT message_key, idempotency_key FROM outbox ORDER BY message_key")


def test_0005_rewrites_only_the_keys_the_old_encoding_made_ambiguous(engine: sa.Engine) -> None:
    assert downgrade(engine, "0004") == "0004"
    with engine.begin() as conn:
        conn.execute(ROWS_AT_0004)

    assert upgrade(engine) == "0008"  # through 0005, to the head enqueue() writes
    with engine.begin() as conn:
        assert conn.execute(KEYS).all() == [
            ("back\\slash", "back\\\\slash|c@example.com"),
            ("k|a", "k\\|a|b@example.com"),
            ("plain", "plain|a@example.com")]
        # A rerun of each job finds its row; the pair the old form confused is a new email.
        assert enqueue(conn, key="k|a", recipients=["b@example.com"], subject="S", body="b") == 0
        assert enqueue(conn, key="back\\slash", recipients=["c@example.com"], subject="S",
                       body="b") == 0
        assert enqueue(conn, key="plain", recipients=["a@example.com"], subject="S", body="b") == 0
        assert enqueue(conn, key="k", recipients=["a|b@example.com"], subject="S", body="b") == 1

    assert downgrade(engine, "0004") == "0004"
    with engine.begin() as conn:
        # ('k', 'a|b@...') holds the old form of ('k|a', 'b@...'), which keeps its new one.
        assert conn.execute(KEYS).all() == [
            ("back\\slash", "back\\slash|c@example.com"),
            ("k", "k|a|b@example.com"),
            ("k|a", "k\\|a|b@example.com"),
            ("plain", "plain|a@example.com")]
