"""Classifies what an SMTP server said (or failed to say) into sent, transient or permanent. Pure.

The SMTP adapter (sender/smtp_replies.py) turns every aiosmtplib reply or exception into a
:class:`SmtpReply`; :func:`classify_reply` decides. No SMTP, Kafka or database library is
imported here.
"""

from __future__ import annotations

import dataclasses
import enum
import re


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
    LOCAL = "local"          # before the server: building the message, reading attachments


class Failure(enum.StrEnum):
    """Errors that came with no SMTP reply code."""

    REFUSED = "refused"          # connection refused
    RESET = "reset"              # connection reset or closed mid-dialogue
    TIMEOUT = "timeout"          # connect or reply timeout
    TLS = "tls"                  # TLS handshake or certificate failure
    UNREACHABLE = "unreachable"  # DNS failure, no route
    BAD_MESSAGE = "bad_message"  # the message itself cannot be built or sent (local, permanent)
    CONFIG = "config"            # our configuration forbids or cannot do it (transient: fix, retry)


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


# Stages before any recipient is named: a reply here speaks about the session or our configuration.
SESSION_STAGES = frozenset(
    {Stage.CONNECT, Stage.GREETING, Stage.EHLO, Stage.STARTTLS, Stage.AUTH, Stage.MAIL_FROM}
)
# Stages whose reply speaks about this recipient and this message.
MESSAGE_STAGES = frozenset({Stage.RCPT_TO, Stage.DATA})
# A server may send kilobytes of text; the reason is one line for a log or a results record.
REASON_MAX_CHARS = 300

# ASCII digits only: \d alone takes any script's ("5.\u0661.\u0661"), which no RFC 3463 code holds.
_ENHANCED_CODE = re.compile(r"([245])\.(\d{1,3})\.(\d{1,3})(?=\s|$)", re.ASCII)
_FAILURE_WORDS = {
    Failure.REFUSED: "connection refused",
    Failure.RESET: "connection reset",
    Failure.TIMEOUT: "timed out",
    Failure.TLS: "TLS failure",
    Failure.UNREACHABLE: "server unreachable",
    Failure.BAD_MESSAGE: "message cannot be sent",
    Failure.CONFIG: "configuration problem",
}
_CLOSING = 421        # RFC 5321: service not available, closing the channel
_AUTH_REQUIRED = 530  # RFC 4954: authentication required, at whatever stage the server says it
_STORAGE = 552        # at MAIL FROM: SIZE over the limit (RFC 1870); with X.5.3: too many rcpts


def parse_enhanced_code(text: str) -> str | None:
    """The RFC 3463 status code that opens ``text`` ("5.1.1 User unknown" -> "5.1.1"), or None."""
    match = _ENHANCED_CODE.match(text.lstrip())
    return match.group(0) if match else None


def waits_for_configuration(reply: SmtpReply) -> bool:
    """Whether ``reply`` is our configuration keeping an attempt from being made, not an
    attempt that failed (no POSTROOM_ATTACHMENTS_ROOT): the email waits, uncounted, until a
    sender with the setting takes it (sender/retry.py's ``RetryPolicy.wait``)."""
    return reply.stage is Stage.LOCAL and reply.failure is Failure.CONFIG


def classify_reply(reply: SmtpReply) -> Outcome:
    """Decide whether ``reply`` means sent, retry later (transient) or give up (permanent).

    A reply with a code is judged by its code, whatever ``failure`` says; the rules, in order:

    * code outside 200-599, any 3xx (the adapter passes only final replies), or a code at
      LOCAL: unexpected, TRANSIENT with ``server_fault``.
    * 2xx at RCPT_TO or DATA: SENT. 2xx at an earlier stage means the dialogue ended before
      the server took the message, so it was not delivered: unexpected, as above.
    * 421 (closing) or 530 (authentication required), any stage: TRANSIENT, ``server_fault``.
    * 4xx: TRANSIENT; ``server_fault`` when the stage is in :data:`SESSION_STAGES`.
    * 5xx saying the message is too big (enhanced X.3.4, or 552 with no enhanced code at
      MAIL_FROM, per RFC 1870): PERMANENT at any stage; no retry makes the message smaller.
    * 5xx at a session stage (greeting, EHLO, STARTTLS, AUTH, MAIL FROM): TRANSIENT with
      ``server_fault``. The server or our configuration is wrong, not the recipient; an
      operator fixes it and a retry delivers, or the last tier dead-letters and alerts.
    * 5xx with enhanced X.2.2 (mailbox full; RFC 3463 calls it a persistent transient
      failure): TRANSIENT.
    * 552 with enhanced X.5.3 at RCPT_TO (too many recipients; RFC 5321 4.5.3.1.10 says to
      treat it as 452): TRANSIENT with ``server_fault``.
    * any other 5xx: PERMANENT.

    The enhanced code is kept in :attr:`Outcome.enhanced_code` only when its class matches the
    basic code's first digit. RFC 3463 requires that match; when a server breaks it, the basic
    code is authoritative and the enhanced code is dropped (its text stays in the reason).
    Enhanced codes only refine a verdict through the subject and detail rules above.

    With no code, ``failure`` decides: BAD_MESSAGE is PERMANENT (the message itself cannot be
    built or sent, e.g. a missing attachment), every other failure TRANSIENT with
    ``server_fault``. Neither code nor failure is an adapter bug: TRANSIENT, ``server_fault``.

    The reason is one printable line of at most :data:`REASON_MAX_CHARS`: the code and the
    server's text ("550 5.1.1 User unknown"), or what failed ("connection refused (connect)").
    The stage is named in parentheses unless it is RCPT_TO or DATA.
    """
    if reply.code is None:
        return _classify_failure(reply)
    return _classify_code(reply, reply.code)


def _classify_failure(reply: SmtpReply) -> Outcome:
    text = _one_line(reply.text, code=None)
    if reply.failure is None:
        reason = _append(f"unexpected: neither a reply code nor a failure ({reply.stage})", text)
        return Outcome(Verdict.TRANSIENT, None, None, _clip(reason), server_fault=True)
    reason = _clip(_append(f"{_FAILURE_WORDS[reply.failure]} ({reply.stage})", text))
    if reply.failure is Failure.BAD_MESSAGE:
        return Outcome(Verdict.PERMANENT, None, None, reason, server_fault=False)
    return Outcome(Verdict.TRANSIENT, None, None, reason, server_fault=True)


def _classify_code(reply: SmtpReply, code: int) -> Outcome:
    stage = reply.stage
    text = _one_line(reply.text, code=code)
    enhanced = parse_enhanced_code(text)
    if enhanced is not None and enhanced[0] != str(code)[0]:
        enhanced = None
    said = f"{code} {text}".rstrip()
    reason = said if stage in MESSAGE_STAGES else f"{said} ({stage})"

    def outcome(verdict: Verdict, *, server_fault: bool) -> Outcome:
        return Outcome(verdict, code, enhanced, _clip(reason), server_fault=server_fault)

    def unexpected(why: str) -> Outcome:
        explained = _clip(f"{why}: {said} ({stage})")
        return Outcome(Verdict.TRANSIENT, code, enhanced, explained, server_fault=True)

    klass = code // 100 if 200 <= code <= 599 else None
    if klass is None or klass == 3 or stage is Stage.LOCAL:
        return unexpected("unexpected reply")
    if klass == 2:
        if stage in MESSAGE_STAGES:
            return outcome(Verdict.SENT, server_fault=False)
        return unexpected("dialogue ended before the message was accepted")
    if code in (_CLOSING, _AUTH_REQUIRED):
        return outcome(Verdict.TRANSIENT, server_fault=True)
    if klass == 4:
        return outcome(Verdict.TRANSIENT, server_fault=stage in SESSION_STAGES)
    refined = enhanced.split(".", 1)[1] if enhanced else None  # "5.3.4" -> "3.4"
    if refined == "3.4" or (code == _STORAGE and stage is Stage.MAIL_FROM and not enhanced):
        return outcome(Verdict.PERMANENT, server_fault=False)
    if stage in SESSION_STAGES:
        return outcome(Verdict.TRANSIENT, server_fault=True)
    if refined == "2.2":
        return outcome(Verdict.TRANSIENT, server_fault=False)
    if code == _STORAGE and refined == "5.3" and stage is Stage.RCPT_TO:
        return outcome(Verdict.TRANSIENT, server_fault=True)
    return outcome(Verdict.PERMANENT, server_fault=False)


def _one_line(text: str, *, code: int | None) -> str:
    """Reply text as one printable line: lines joined, a repeated leading code dropped."""
    lines: list[str] = []
    first_enhanced: str | None = None
    code_text = str(code)
    for raw in text.splitlines():
        line = (raw if raw.isprintable() else
                "".join(c if c.isprintable() else " " for c in raw)).strip()
        if code is not None and line.startswith(code_text):
            # An adapter may hand over whole reply lines, "550-5.1.1 ..." included.
            line = re.sub(rf"^{code}(?:[ -]|$)", "", line).strip()
        if lines and first_enhanced and parse_enhanced_code(line) == first_enhanced:
            line = line[len(first_enhanced):].strip()
        elif not lines:
            first_enhanced = parse_enhanced_code(line)
        if line:
            lines.append(line)
    return " ".join(" ".join(lines).split())


def _append(head: str, text: str) -> str:
    return f"{head}: {text}" if text else head


def _clip(reason: str) -> str:
    if len(reason) <= REASON_MAX_CHARS:
        return reason
    return reason[: REASON_MAX_CHARS - 3].rstrip() + "..."
