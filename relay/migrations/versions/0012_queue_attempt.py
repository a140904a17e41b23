"""Each queue row holds the attempt its events carry, fixed when the row is queued.

Revision ID: 0012

The relay used to derive an event's attempt at every claim, as the outbox row's recorded attempts
+ 1. A row is claimed again when its claim runs out before Kafka's acknowledgement was recorded
(a relay killed, or its connection cut, between the publish and the mark). By then the first
event may have gone its whole way: retried and recorded dead after 5 attempts, say, so the second
event went out as attempt 6, which the senders' ledger took for a new attempt (a redrive), and the
address was mailed through a second chain of retries. Seen in the chaos suite's relay kills: two
rows recorded dead after 10 attempts.

Now the insert trigger writes the row's attempts + 1 into the queue (1 for a new row), and so
does redrive, and every claim of that queue row publishes that attempt: an event published twice
is the same attempt twice, which the ledger sends once. A queue row without one is published as
before, as the row's attempts + 1: rows queued before this revision (no backfill: an UPDATE of a
large backlog's queue, under the lock ADD COLUMN takes, would hold every enqueue until it
committed), and rows queued by an earlier release's `postroom redrive` already past its schema
check.
"""

from __future__ import annotations

from alembic import op

from postroom.relay.migrations.triggers import create_queue_function, current_schema

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable and not backfilled: a catalog change only, held for an instant.
    op.execute("ALTER TABLE outbox_queue ADD COLUMN attempt bigint")
    create_queue_function(current_schema(), with_attempt=True)


def downgrade() -> None:
    create_queue_function(current_schema(), with_attempt=False)
    op.execute("ALTER TABLE outbox_queue DROP COLUMN attempt")
