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

    assert upgrade(engine) == "0005"
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
