"""postroom: durable, observable email delivery over a PostgreSQL outbox and Kafka.

Report jobs import from here only: ``from postroom import enqueue`` (and ``enqueue_many``,
``Email``, or ``Batch`` one call each, for many personalised emails at once). The packages beside this one
(relay, sender, schemas) are postroom's own roles and contract, installed as top-level packages;
:func:`check_companions` refuses a same-named package of another distribution that shadows one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.batch import Batch as Batch
    from relay.batch import enqueue_many as enqueue_many
    from relay.outbox import Email as Email
    from relay.outbox import enqueue as enqueue

__version__ = "0.1.0"
__all__ = ["Batch", "Email", "__version__", "check_companions", "enqueue", "enqueue_many"]

COMPANIONS = ("relay", "sender", "schemas", "bounces")


def check_companions() -> None:
    """ImportError unless relay, sender and schemas resolve to the copies installed beside this
    package (another distribution's top-level ``relay`` earlier on sys.path would shadow ours)."""
    home = Path(__file__).resolve().parent.parent
    for name in COMPANIONS:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None or Path(origin).resolve().parent.parent != home:
            raise ImportError(
                f"postroom's {name!r} package is shadowed by {origin or 'nothing'} (expected it in "
                f"{home}): another distribution installs a top-level {name!r}; install postroom "
                f"in an environment of its own", name=name)


def __getattr__(name: str) -> Any:
    # Imported on first use, so the base modules (postroom.settings, ...) load without the roles.
    if name in ("enqueue", "Email"):
        check_companions()
        import relay.outbox

        return getattr(relay.outbox, name)
    if name in ("enqueue_many", "Batch"):
        check_companions()
        import relay.batch

        return getattr(relay.batch, name)
    raise AttributeError(f"module 'postroom' has no attribute {name!r}")
