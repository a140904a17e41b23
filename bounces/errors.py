"""The intake's refusals; each class's docstring is its default message."""

from __future__ import annotations

import enum

from postroom.errors import PostroomError


class Refusal(enum.StrEnum):
    """Why a report (or an address at the bounce domain) changes no row: the metric's label."""

    # Labels, not secrets (S105 reads "token" in their names).
    NO_TOKEN = "no_token"  # noqa: S105 - an address of the bounce domain that carries no token
    MALFORMED_TOKEN = "malformed_token"  # noqa: S105
    FORGED_TOKEN = "forged_token"  # noqa: S105
    EXPIRED_TOKEN = "expired_token"  # noqa: S105
    UNKNOWN_ROW = "unknown_row"  # a genuine token naming no row (purged since)
    AUTO_REPLY = "auto_reply"  # a vacation message or another RFC 3834 auto-reply
    NOT_A_REPORT = "not_a_report"  # mail with no delivery status and no bounce in it
    NOTHING_TO_RECORD = "nothing_to_record"  # a report of deliveries only (Action: delivered...)
    MALFORMED_REPORT = "malformed_report"
    RECIPIENT_MISMATCH = "recipient_mismatch"  # a report about an address the row never had
    TOO_LARGE = "too_large"  # over the SMTP size limit


class BouncesError(PostroomError):
    """The bounce intake failed."""


class UnusableReportError(BouncesError):
    """The message is no report postroom can record."""

    def __init__(self, refusal: Refusal, detail: str = "") -> None:
        self.refusal = refusal
        super().__init__(f"{refusal.value}: {detail}" if detail else refusal.value)
