"""Errors raised while delivering email; each class's docstring is its default message."""

from __future__ import annotations

from postroom.errors import PostroomError


class DeliveryError(PostroomError):
    """Delivering an email failed."""


class AttachmentError(DeliveryError):
    """An attachment is outside the allowed root, missing or unreadable."""

    def __init__(self, message: str | None = None, *, path: str | None = None) -> None:
        self.path = path  # as the event gave it
        super().__init__(message)


class LedgerUnavailableError(DeliveryError):
    """The delivery ledger cannot be reached; nothing may be sent until it answers again."""
