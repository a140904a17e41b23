"""postroom: durable, observable email delivery over a PostgreSQL outbox and Kafka.

Report jobs import from here only: ``from postroom import enqueue`` (and ``enqueue_many``,
``Email``, or ``Batch`` one call each, for many personalised emails at once). Everything else
(``postroom.relay``, ``postroom.sender``, ...) is internal: the roles and their contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from postroom.relay.batch import Batch as Batch
    from postroom.relay.batch import enqueue_many as enqueue_many
    from postroom.relay.outbox import Email as Email
    from postroom.relay.outbox import enqueue as enqueue

__version__ = "0.1.0"
__all__ = ["Batch", "Email", "__version__", "enqueue", "enqueue_many"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so the base modules (postroom.settings, ...) load without the roles.
    if name in ("enqueue", "Email"):
        from postroom.relay import outbox

        return getattr(outbox, name)
    if name in ("enqueue_many", "Batch"):
        from postroom.relay import batch

        return getattr(batch, name)
    raise AttributeError(f"module 'postroom' has no attribute {name!r}")
