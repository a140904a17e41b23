"""The trace context an email was enqueued in (W3C traceparent and tracestate), which the relay
puts on its Kafka record so the roles' spans join the job's trace.

Revision ID: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns: catalog changes only, no rewrite of a large outbox. Written by enqueue
    # inside a traced job, or by SQL; the relay passes on only what parses as W3C says.
    op.execute("ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox DROP COLUMN tracestate, DROP COLUMN traceparent")
