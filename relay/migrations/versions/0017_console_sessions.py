"""The console's sessions in the database, so that every replica of `postroom web` and the next
start of one know them.

Revision ID: 0017

A session signed in by token was known only to the process that signed it in (a dict of its
ids): behind a load balancer the next request, on another replica, was not signed in, and a
restart signed everyone out even with a fixed cookie key (POSTROOM_WEB_SESSION_KEY_FILE).
``console_session`` holds one row per session signed in and not signed out: the SHA-256 of the
id its cookie carries (a reader of the table cannot sign in with it), who and with which role,
and when it was last used, which the console's idle limit reads. A new table only: no lock on
the outbox.
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE console_session (
            id_sha256    text PRIMARY KEY,
            who          text NOT NULL,
            role         text NOT NULL CHECK (role IN ('reader', 'operator')),
            signed_in_at timestamptz NOT NULL DEFAULT now(),
            seen_at      timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE console_session")
