"""Reads a message sent to the bounce domain: a delivery status notification (RFC 3464), a
feedback report (RFC 5965), an older MTA's bounce without a delivery status (flufl.bounce's
detectors), or something to ignore (an RFC 3834 auto-reply). Pure: bytes in, a Report out or
UnusableReportError, whatever the bytes."""

from __future__ import annotations

import dataclasses
import email
import email.message
import itertools
import logging
import re
from collections.abc import Iterator

from flufl.bounce import all_failures

from postroom.bounces.errors import Refusal, UnusableReportError
from postroom.errors import printable
from postroom.schemas.codec import DeliveryStatus

ENHANCED_CODE = re.compile(r"([245]\.[0-9]{1,3}\.[0-9]{1,3})(?![0-9.])", re.ASCII)
SMTP_CODE = re.compile(r"([245][0-9][0-9])(?![0-9])", re.ASCII)
FIELD_MAX_CHARS = 1000  # a field of a report goes into a log line and last_error
MAX_BLOCKS = 100  # recipient blocks read from one report (Postfix writes one per recipient)
# flufl.bounce runs each of its detectors over every part, about 7 s of CPU a MB of empty parts
# and 1.4 s a MB of text: a message without a delivery status is read by them only up to these
# (an older MTA's bounce is one or two text parts, its notice in the first kilobytes), about 25 ms.
HEURISTIC_MAX_PARTS = 20
HEURISTIC_MAX_BYTES = 16 * 1024
# Their cost goes with the lines (flufl.bounce's simplematch tries each of its patterns on each
# line): 16 KiB of two-byte lines cost 0.2 s. An older MTA's notice is a few dozen lines.
HEURISTIC_MAX_LINES = 400
# RFC 3834 and the de-facto headers of vacation programs (Exchange, Zimbra, procmail's vacation).
AUTO_REPLY_HEADERS = ("x-autoreply", "x-autorespond", "x-autoresponder")
AUTO_PRECEDENCE = frozenset({"auto_reply"})
# flufl.bounce logs a line per detector at INFO and a traceback for a detector that a hostile
# message breaks (raised on, refused here as malformed): neither belongs in the role's log.
logging.getLogger("flufl.bounce").setLevel(logging.CRITICAL)


@dataclasses.dataclass(frozen=True)
class Notice:
    """What a report says about one recipient."""

    status: DeliveryStatus  # BOUNCED, DELAYED or COMPLAINED
    recipient: str | None  # as the report names it (Original- or Final-Recipient, Original-Rcpt-To)
    enhanced_code: str | None = None
    smtp_code: int | None = None
    diagnostic: str | None = None
    exact_recipient: bool = False  # a recipient named must be the row's (a DSN's, the heuristics')


@dataclasses.dataclass(frozen=True)
class Report:
    """A report's notices and the texts in it that may carry a token (the ENVID, the original
    return path), for a report sent to the bare bounce address."""

    kind: str  # "dsn", "feedback" or "bounce" (no delivery status: flufl.bounce's heuristics)
    notices: tuple[Notice, ...]
    token_hints: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log: the kind and each notice's status and code."""
        return self.kind + " " + ",".join(
            f"{n.status.value}{'/' + n.enhanced_code if n.enhanced_code else ''}"
            for n in self.notices)


def _field(block: email.message.Message, name: str) -> str | None:
    value = block.get(name)
    if value is None:
        return None
    text = " ".join(str(value).split())
    return printable(text)[:FIELD_MAX_CHARS] or None


def _address(value: str | None) -> str | None:
    """The address of ``rfc822; user@example.com`` (a DSN's recipient fields)."""
    if value is None:
        return None
    kind, semicolon, address = value.partition(";")
    if not semicolon:
        address = kind
    elif kind.strip().lower() not in ("rfc822", "utf-8"):
        return None
    return address.strip().strip("<>").strip() or None


def _blocks(part: email.message.Message) -> list[email.message.Message]:
    payload = part.get_payload()
    if isinstance(payload, list) and part.get_content_type() == "message/global-delivery-status":
        # The parser reads RFC 6533's UTF-8 status as one enclosed message: its header block
        # the first block, its body the others. Read them from its bytes.
        return _split_blocks(b"".join(block.as_bytes() for block in payload
                                      if isinstance(block, email.message.Message)))
    if isinstance(payload, list):
        return [block for block in payload
                if isinstance(block, email.message.Message) and block.keys()]
    # A status the parser kept as text (a transfer encoding on it): read its blocks.
    text = part.get_payload(decode=True)
    return _split_blocks(text) if isinstance(text, bytes) else []


def _split_blocks(text: bytes) -> list[email.message.Message]:
    blocks = (email.message_from_string(chunk) for chunk in
              re.split(r"\r?\n\s*\r?\n", text.decode("utf-8", "replace")) if chunk.strip())
    return [block for block in blocks if block.keys()]


def _report_parts(message: email.message.Message) -> Iterator[email.message.Message]:
    # Only the report's own parts: a report quoted inside a forwarded message is not one.
    if message.get_content_type() != "multipart/report":
        return
    payload = message.get_payload()
    if isinstance(payload, list):
        yield from (part for part in payload if isinstance(part, email.message.Message))


def _enclosed_return_paths(report: email.message.Message) -> list[str | None]:
    """The Return-Path of the original the report encloses (headers only, or whole)."""
    found: list[str | None] = []
    for enclosed in _report_parts(report):
        if enclosed.get_content_type() == "text/rfc822-headers":
            payload = enclosed.get_payload(decode=True)
            if isinstance(payload, bytes):
                found.append(_address(_field(email.message_from_bytes(payload), "Return-Path")))
        elif enclosed.get_content_type() == "message/rfc822":
            found.extend(_address(_field(original, "Return-Path"))
                         for original in _blocks(enclosed)[:1])
    return found


def _dsn(report: email.message.Message, part: email.message.Message) -> Report:
    blocks = _blocks(part)
    if len(blocks) < 2:
        raise UnusableReportError(Refusal.MALFORMED_REPORT, "a delivery status without recipients")
    per_message, recipients = blocks[0], blocks[1:MAX_BLOCKS + 1]
    notices = []
    for block in recipients:
        action = (_field(block, "Action") or "").lower()
        if action.startswith(("failed", "error")):  # "error": OpenSMTPD's word for failed
            status = DeliveryStatus.BOUNCED
        elif action.startswith("delayed"):
            status = DeliveryStatus.DELAYED
        else:
            continue  # delivered, relayed, expanded: nothing went wrong
        code = ENHANCED_CODE.match(_field(block, "Status") or "")
        diagnostic = _field(block, "Diagnostic-Code")
        smtp_code = None
        if diagnostic is not None:
            kind, _, text = diagnostic.partition(";")
            if kind.strip().lower() == "smtp":
                reply = SMTP_CODE.match(text.strip())
                smtp_code = int(reply.group(1)) if reply else None
                diagnostic = text.strip() or diagnostic
        recipient = (_address(_field(block, "Original-Recipient"))
                     or _address(_field(block, "Final-Recipient")))
        # Exact: the sender gave the row's address as ORCPT, so a report that names another
        # (Original-Recipient, or Final-Recipient without it) is about another email.
        notices.append(Notice(status, recipient, code.group(1) if code else None, smtp_code,
                              diagnostic, exact_recipient=True))
    if not notices:
        raise UnusableReportError(Refusal.NOTHING_TO_RECORD, "no recipient failed or was delayed")
    hints = [_field(per_message, "Original-Envelope-Id"),
             _address(_field(per_message, "X-Postfix-Sender")), *_enclosed_return_paths(report)]
    return Report("dsn", tuple(notices), tuple(h for h in hints if h))


def _feedback(report: email.message.Message, part: email.message.Message) -> Report:
    blocks = _blocks(part)
    fields = blocks[0] if blocks else None
    feedback_type = None if fields is None else _field(fields, "Feedback-Type")
    if fields is None or feedback_type is None:
        raise UnusableReportError(Refusal.MALFORMED_REPORT, "a feedback report without a type")
    if feedback_type.lower() == "not-spam":
        raise UnusableReportError(Refusal.NOTHING_TO_RECORD, "a not-spam report")
    agent = _field(fields, "User-Agent")
    notice = Notice(DeliveryStatus.COMPLAINED, _address(_field(fields, "Original-Rcpt-To")),
                    diagnostic=f"complaint: {feedback_type}" + (f" ({agent})" if agent else ""))
    hints = [_address(_field(fields, "Original-Mail-From")), *_enclosed_return_paths(report)]
    return Report("feedback", (notice,), tuple(h for h in hints if h))


def is_auto_reply(message: email.message.Message) -> bool:
    """An RFC 3834 auto-reply or a vacation program's message: not a bounce."""
    submitted = (_field(message, "Auto-Submitted") or "no").lower()
    precedence = (_field(message, "Precedence") or "").lower()
    return (not submitted.startswith("no") or precedence in AUTO_PRECEDENCE
            or any(message.get(name) is not None for name in AUTO_REPLY_HEADERS))


def _bounded_for_heuristics(message: email.message.Message) -> None:
    """Refuse a message of more than HEURISTIC_MAX_PARTS parts; cut its payloads to
    HEURISTIC_MAX_BYTES and HEURISTIC_MAX_LINES in all."""
    parts = list(itertools.islice(message.walk(), HEURISTIC_MAX_PARTS + 1))
    if len(parts) > HEURISTIC_MAX_PARTS:
        raise UnusableReportError(Refusal.NOT_A_REPORT, f"over {HEURISTIC_MAX_PARTS} parts and "
                                  "no delivery status: not read by the heuristics")
    left, lines_left = HEURISTIC_MAX_BYTES, HEURISTIC_MAX_LINES
    for part in parts:
        payload = part.get_payload()
        if isinstance(payload, str):
            cut = payload[:left]
            # The end of the lines_left-th line, if the cut has that many.
            end = -1
            for _ in range(lines_left):
                end = cut.find("\n", end + 1)
                if end < 0:
                    break
            if end >= 0:
                cut = cut[:end + 1]
            if len(cut) < len(payload):
                part.set_payload(cut)
            left -= len(cut)
            lines_left -= cut.count("\n")


def _heuristic(message: email.message.Message) -> Report:
    _bounded_for_heuristics(message)
    temporary, permanent = all_failures(message)
    subject = _field(message, "Subject") or "no subject"
    notices = [Notice(status, address.decode("ascii"),
                      diagnostic=f"a bounce without a delivery status: {subject}",
                      exact_recipient=True)
               for status, found in ((DeliveryStatus.BOUNCED, permanent),
                                     (DeliveryStatus.DELAYED, temporary - permanent))
               for address in sorted(found)[:MAX_BLOCKS]]
    if not notices:
        raise UnusableReportError(Refusal.NOT_A_REPORT, f"subject {subject[:100]!r}")
    return Report("bounce", tuple(notices))


def _parse(message: email.message.Message) -> Report:
    for part in _report_parts(message):
        content_type = part.get_content_type()
        if content_type in ("message/delivery-status", "message/global-delivery-status"):
            return _dsn(message, part)
        if content_type == "message/feedback-report":
            return _feedback(message, part)
    # Checked after the report types: Postfix marks its own DSNs Auto-Submitted: auto-replied.
    if is_auto_reply(message):
        raise UnusableReportError(Refusal.AUTO_REPLY)
    return _heuristic(message)


def parse_report(raw: bytes) -> Report:
    """The report in ``raw`` (a whole message as received); UnusableReportError for anything
    else: an auto-reply, a message that is no report, a malformed one."""
    try:
        return _parse(email.message_from_bytes(raw))
    except UnusableReportError:
        raise
    except Exception as exc:  # hostile input meets the email package and the heuristics
        raise UnusableReportError(Refusal.MALFORMED_REPORT, type(exc).__name__) from exc
