"""postroom: durable, observable email delivery over a PostgreSQL outbox and Kafka.

Report jobs import from here only: ``from postroom import enqueue`` (and ``enqueue_many``,
``Email``, or ``Batch`` one call each, for many personalised emails at once), and the error types
(``EnqueueError`` and its kinds, ``SchemaNotReadyError``); docs/api.md lists what is supported.
Everything else (``postroom.relay``, ``postroom.sender``, ...) is internal: the roles and their
contract. The import is light: no database, Kafka, SMTP or Avro library is loaded by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from postroom.relay.batch import Batch as Batch
    from postroom.relay.batch import enqueue_many as enqueue_many
    from postroom.relay.errors import EnqueueError as EnqueueError
    from postroom.relay.errors import InvalidAttachmentError as InvalidAttachmentError
    from postroom.relay.errors import InvalidConnectionError as InvalidConnectionError
    from postroom.relay.errors import InvalidEmailError as InvalidEmailError
    from postroom.relay.errors import SchemaNotReadyError as SchemaNotReadyError
    from postroom.relay.outbox import Email as Email
    from postroom.relay.outbox import enqueue as enqueue

    __version__: str

__all__ = ["Batch", "Email", "EnqueueError", "InvalidAttachmentError", "InvalidConnectionError",
           "InvalidEmailError", "SchemaNotReadyError", "__version__", "enqueue", "enqueue_many"]

_ERRORS = ("EnqueueError", "InvalidAttachmentError", "InvalidConnectionError",
           "InvalidEmailError", "SchemaNotReadyError")


def __getattr__(name: str) -> Any:
    # Imported on first use, so the base modules (postroom.settings, ...) load without the roles.
    if name in ("enqueue", "Email"):
        from postroom.relay import outbox

        return getattr(outbox, name)
    if name in ("enqueue_many", "Batch"):
        from postroom.relay import batch

        return getattr(batch, name)
    if name in _ERRORS:
        from postroom.relay import errors

        return getattr(errors, name)
    if name == "__version__":
        version = _installed_version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'postroom' has no attribute {name!r}")


def _installed_version() -> str:
    """The version of the installed distribution (its metadata: pyproject.toml's, as built)."""
    from importlib import metadata

    try:
        return metadata.version("postroom")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"
