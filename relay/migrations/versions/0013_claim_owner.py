"""Each queue row's claim names the relay session that holds it, so a claim of a relay that is
gone is free at once, not when its TTL runs out.

Revision ID: 0013

A claim (``claimed_until``) used to be free only when it expired, 60 s after it was taken
(POSTROOM_RELAY_CLAIM_TTL). A relay killed, or whose claims connection was cut, between its claim
and its mark left the rows it had claimed but not yet published waiting out that minute: seen in
the chaos suite's random mix (seed 295496659), where a relay claimed 50 rows as PostgreSQL was
restarting, was killed before it could publish them, and the mix drained 64 s after its last
fault instead of about 10.

Now every relay holds a session-level advisory lock whose key it writes into ``claimed_by`` with
each claim (relay/sql/publish.py). Another claim takes such a row while its claim lasts only when
it can take that lock itself: the session that held it has ended. A relay that lives on but
stalls (SIGSTOP) keeps its session and its claims until the TTL, as before. Claims taken by an
earlier release have no owner and wait for their TTL.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: a catalog change only, held for an instant. No index covers it, so a
    # claim stays a HOT update (0003).
    op.execute("ALTER TABLE outbox_queue ADD COLUMN claimed_by bigint")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox_queue DROP COLUMN claimed_by")
