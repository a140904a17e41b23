"""Classifies what an SMTP server said (or failed to say) into sent, transient or permanent. Pure.

The SMTP adapter (sender/smtp.py) turns every aiosmtplib reply or exception into a :class:`SmtpReply`;
:func:`classify_reply` decides. No SMTP, Kafka or database library is imported here.
"""

from __future__ import annotations

import dataclasses
import enum


class Stage(enum.StrEnum):
    """Where in the SMTP dialogue a reply or error came from."""

    CONNECT = "connect"      # TCP connect, implicit TLS handshake, greeting not yet read
    GREETING = "greeting"    # the server's 220 banner
    EHLO = "ehlo"
    STARTTLS = "starttls"
    AUTH = "auth"
    MAIL_FROM = "mail_from"
    RCPT_TO = "rcpt_to"
    DATA = "data"            # DATA command and the reply to the message content
    LOCAL = "local"          # before talking to the server: building the message, reading attachments


class Failure(enum.StrEnum):
    """Errors that came with no SMTP reply code."""

    REFUSED = "refused"          # connection refused
    RESET = "reset"              # connection reset or closed mid-dialogue
    TIMEOUT = "timeout"          # connect or reply timeout
    TLS = "tls"                  # TLS handshake or certificate failure
    UNREACHABLE = "unreachable"  # DNS failure, no route
    BAD_MESSAGE = "bad_message"  # the message itself cannot be built or sent (local, permanent)


@dataclasses.dataclass(frozen=True)
class SmtpReply:
    """One reply, or one failure with no reply (``code`` None and ``failure`` set)."""

    stage: Stage
    code: int | None
    text: str = ""
    failure: Failure | None = None


class Verdict(enum.StrEnum):
    SENT = "sent"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The decision for one message: what happened, and what to record about it."""

    verdict: Verdict
    code: int | None
    enhanced_code: str | None
    reason: str              # one line for humans: "550 5.1.1 User unknown", "connection refused"
    server_fault: bool = False  # the server or our configuration is at fault, not this recipient
