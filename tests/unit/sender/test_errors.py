"""Delivery errors: the hierarchy the service catches, and their default messages."""

from __future__ import annotations

import pytest

from postroom.errors import PostroomError
from postroom.sender.errors import AttachmentError, DeliveryError, LedgerUnavailableError


@pytest.mark.parametrize(("error", "message"), [
    (DeliveryError(), "Delivering an email failed."),
    (AttachmentError(), "An attachment is outside the allowed root, missing or unreadable."),
    (AttachmentError("attachment 'q3.xlsx' does not exist"), "attachment 'q3.xlsx' does not exist"),
    (LedgerUnavailableError(),
     "The delivery ledger cannot be reached; nothing may be sent until it answers again."),
])
def test_default_messages(error: Exception, message: str) -> None:
    assert str(error) == message


@pytest.mark.parametrize("error", [AttachmentError, LedgerUnavailableError])
def test_every_delivery_error_is_a_postroom_error(error: type[Exception]) -> None:
    assert issubclass(error, DeliveryError)
    assert issubclass(error, PostroomError)
