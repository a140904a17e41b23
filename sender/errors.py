"""Errors raised while delivering email; each class's docstring is its default message."""

from __future__ import annotations

from postroom.errors import PostroomError, printable
from postroom.schemas.codec import EmailRequested


class DeliveryError(PostroomError):
    """Delivering an email failed."""


class AttachmentError(DeliveryError):
    """An attachment is outside the allowed root, missing or unreadable."""

    def __init__(self, message: str | None = None, *, path: str | None = None) -> None:
        self.path = path  # as the event gave it
        super().__init__(message)


class LedgerUnavailableError(DeliveryError):
    """The delivery ledger cannot be reached; nothing may be sent until it answers again."""


class AcceptedUnrecordedError(DeliveryError):
    """A server accepted the email but its ``sent`` result cannot be published; the record is
    read again later (its offset is not stored), and the ledger answers it sent."""


class RecordTooLargeError(DeliveryError):
    """Kafka refused a record as too large; producing it again cannot succeed."""


class PoisonRecordError(PostroomError):
    """A record no enqueue and no sender of ours could have written: it is dead-lettered as
    poison, never sent.

    Besides the reason it carries what could be read of the record, for the result that ends
    its outbox row: its key when readable, the event when it decoded, its row id and attempt
    base when their headers are readable. ``copy_record`` False: too large to copy to the
    dead-letter topic (its value and headers stay where they are, in the source topic).
    """

    def __init__(self, reason: str, *, copy_record: bool = True, key: str | None = None,
                 event: EmailRequested | None = None, row_id: int | None = None,
                 attempt_base: int | None = None) -> None:
        self.reason = printable(reason)
        self.copy_record = copy_record
        self.key = key
        self.event = event
        self.row_id = row_id
        self.attempt_base = attempt_base
        super().__init__(self.reason)



