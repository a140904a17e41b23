"""The console's sessions are tied to the token that signed them in.

Revision ID: 0018

0017's rows outlive a restart, so a token changed in its file (a leaked operator token replaced)
left every session signed in with the old one signed in, with its role. ``token_mac`` holds the
HMAC-SHA256 of the session's id under the token that signed it in: the console compares it with
the token its role has now, and a session whose token changed or went is over. A reader of the
table learns neither the token nor the id from it. The sessions from before name no token: they
end here (their users sign in again). A small table only: no lock on the outbox.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM console_session")
    op.execute("ALTER TABLE console_session ADD COLUMN token_mac text NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE console_session DROP COLUMN token_mac")
