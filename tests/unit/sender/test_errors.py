"""Delivery errors: the hierarchy the service catches, and their default messages."""

from __future__ import annotations

import pytest

from postroom.errors import PostroomError
from sender.errors import (
    AttachmentError,
    DeliveryError,
    InvalidEventError,
    PermanentDeliveryError,
    TransientDeliveryError,
)
from sender.outcome import Outcome, Verdict

LATER = Outcome(Verdict.TRANSIENT, 451, "4.3.0", "451 4.3.0 Try again later")
UNKNOWN = Outcome(Verdict.PERMANENT, 550, "5.1.1", "550 5.1.1 User unknown")


@pytest.mark.parametrize(("error", "parents", "message"), [
    (DeliveryError(), (PostroomError,), "Delivering an email failed."),
    (TransientDeliveryError(LATER), (DeliveryError,), "451 4.3.0 Try again later"),
    (TransientDeliveryError(LATER, "pool closed"), (DeliveryError,), "pool closed"),
    (PermanentDeliveryError(550, "5.1.1"), (DeliveryError,),
     "The email cannot be delivered; retrying will not help. [550 5.1.1]"),
    (PermanentDeliveryError(554, None), (DeliveryError,),
     "The email cannot be delivered; retrying will not help. [554]"),
    (PermanentDeliveryError(None, None), (DeliveryError,),
     "The email cannot be delivered; retrying will not help."),
    (PermanentDeliveryError(550, "5.1.1", "no such user"), (DeliveryError,), "no such user"),
    (PermanentDeliveryError.from_outcome(UNKNOWN), (DeliveryError,), "550 5.1.1 User unknown"),
    (InvalidEventError(), (PostroomError,),
     "A record cannot be decoded or lacks what delivery needs (a poison record)."),
    (AttachmentError(), (PermanentDeliveryError,),
     "An attachment is outside the allowed root, missing or unreadable."),
    (AttachmentError("attachment q3.xlsx does not exist", path="q3.xlsx"),
     (PermanentDeliveryError,), "attachment q3.xlsx does not exist"),
])
def test_messages_and_hierarchy(error: Exception, parents: tuple[type[Exception], ...],
                                message: str) -> None:
    assert str(error) == message
    assert isinstance(error, parents)


def test_fields_are_kept() -> None:
    assert TransientDeliveryError(LATER).outcome is LATER
    permanent = PermanentDeliveryError.from_outcome(UNKNOWN)
    assert (permanent.code, permanent.enhanced_code) == (550, "5.1.1")
    attachment = AttachmentError("gone", path="/srv/reports/q3.xlsx")
    assert (attachment.path, attachment.code, attachment.enhanced_code) == (
        "/srv/reports/q3.xlsx", None, None)


def test_a_poison_record_is_not_a_delivery_failure() -> None:
    assert not isinstance(InvalidEventError(), DeliveryError)


def test_transient_and_permanent_are_disjoint() -> None:
    assert not issubclass(TransientDeliveryError, PermanentDeliveryError)
    assert not issubclass(PermanentDeliveryError, TransientDeliveryError)
