"""The queue trigger queues only rows that are not finished: a row inserted by SQL in a final
state (sent, failed, dead, bounced, suppressed: a restore, a copy of rows from elsewhere) is not
published.

Revision ID: 0014

The trigger queued every inserted row without ``published_at``, whatever its status. The relay
then published rows a restore brought back as ``suppressed`` or ``failed`` (neither has
``published_at``): emails to addresses on the suppression list went out, and their rows kept
their old status. Rows inserted as ``pending``, ``published`` or ``retrying`` are queued as
before. A function change only: no table is locked beyond the instant of the replace.
"""

from __future__ import annotations

from postroom.relay.migrations.triggers import create_queue_function, current_schema

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_queue_function(current_schema(), with_attempt=True, unfinished_only=True)


def downgrade() -> None:
    create_queue_function(current_schema(), with_attempt=True)
