"""postroom: durable, observable email delivery over a PostgreSQL outbox and Kafka."""

from __future__ import annotations

__version__ = "0.1.0"
