"""Errors raised while delivering email; each class's docstring is its default message."""

from __future__ import annotations

from postroom.errors import PostroomError
from sender.outcome import Outcome


class DeliveryError(PostroomError):
    """Delivering an email failed."""


class TransientDeliveryError(DeliveryError):
    """Delivering an email failed for now; a later attempt may succeed."""

    def __init__(self, outcome: Outcome, message: str | None = None) -> None:
        self.outcome = outcome
        super().__init__(message or outcome.reason)


class PermanentDeliveryError(DeliveryError):
    """The email cannot be delivered; retrying will not help."""

    def __init__(
        self, code: int | None, enhanced_code: str | None, message: str | None = None
    ) -> None:
        self.code = code
        self.enhanced_code = enhanced_code
        codes = " ".join(str(c) for c in (code, enhanced_code) if c is not None)
        if message is None and codes:
            message = f"{(type(self).__doc__ or '').strip()} [{codes}]"
        super().__init__(message)

    @classmethod
    def from_outcome(cls, outcome: Outcome) -> PermanentDeliveryError:
        return cls(outcome.code, outcome.enhanced_code, outcome.reason or None)


class InvalidEventError(PostroomError):
    """A record cannot be decoded or lacks what delivery needs (a poison record)."""


class AttachmentError(PermanentDeliveryError):
    """An attachment is outside the allowed root, missing or unreadable."""

    def __init__(self, message: str | None = None, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(None, None, message)
