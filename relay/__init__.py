"""The outbox side of postroom: enqueue email in PostgreSQL and relay committed rows to Kafka."""

from __future__ import annotations

from relay.outbox import enqueue

__all__ = ["enqueue"]
