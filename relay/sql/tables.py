"""The outbox table as SQLAlchemy sees it, and the channel a relay listens on."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

NOTIFY_CHANNEL = "postroom_outbox"

metadata = sa.MetaData()

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("message_key", sa.Text, nullable=False),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("sender", sa.Text),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("attachments", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("html", sa.Text),
    sa.Column("inline", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("priority", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text),
    sa.Column("smtp_code", sa.Integer),
    sa.Column("enhanced_code", sa.Text),
    sa.Column("message_id", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("available_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("published_at", sa.DateTime(timezone=True)),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)
