"""What an aiosmtplib reply or exception becomes: an :class:`~sender.outcome.SmtpReply` naming the
stage it ended and, when no real reply came, the kind of failure (timeout, reset, TLS, ...).
"""

from __future__ import annotations

import errno
import socket
import ssl

import aiosmtplib

from postroom.sender.outcome import Failure, SmtpReply, Stage

_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETDOWN,
                       errno.EADDRNOTAVAIL}
_REFUSED_TEXT = "Connection refused"


def code_reply(stage: Stage, exc: aiosmtplib.SMTPResponseException) -> SmtpReply:
    """The reply an SMTP error carries; none came when aiosmtplib could not parse one."""
    if exc.code < 100:
        # aiosmtplib's code for a reply it could not parse: no real reply came.
        return SmtpReply(stage, None, one_line(exc.message), Failure.RESET)
    return SmtpReply(stage, exc.code, exc.message)  # multi-line as sent; outcome joins it


def out_of_turn(reply: SmtpReply) -> SmtpReply:
    """A 2xx or 3xx that ended MAIL, RCPT or the DATA command is a reply the dialogue has no
    place for (a 252 to RCPT, a 250 to DATA where 354 was due): the message was not written,
    whatever the code says, so it is a protocol error (transient), never "sent". Not for the
    reply to the message itself, whose every 2xx is a delivery."""
    if reply.code is None or reply.code >= 400:
        return reply
    return SmtpReply(reply.stage, None, one_line(f"reply out of turn: {reply.code} {reply.text}"),
                     Failure.RESET)


def connect_failure(exc: aiosmtplib.SMTPConnectError) -> SmtpReply:
    """Failures before the greeting was read; aiosmtplib keeps the OS error as the cause."""
    cause = exc.__cause__
    text = one_line(str(cause) if cause is not None else exc.message)
    if isinstance(cause, aiosmtplib.SMTPTimeoutError):
        return SmtpReply(Stage.GREETING, None, "timed out waiting for the greeting",
                         Failure.TIMEOUT)
    if isinstance(cause, aiosmtplib.SMTPServerDisconnected):
        return SmtpReply(Stage.GREETING, None, "connection closed before the greeting",
                         Failure.RESET)
    if isinstance(exc, aiosmtplib.SMTPConnectTimeoutError):
        return SmtpReply(Stage.CONNECT, None, one_line(exc.message), Failure.TIMEOUT)
    reply = error_reply(Stage.CONNECT, cause) if isinstance(cause, Exception) else None
    return reply or SmtpReply(Stage.CONNECT, None, text, Failure.RESET)


def error_reply(stage: Stage, exc: Exception) -> SmtpReply | None:
    """The reply for an exception with no SMTP code; None for one that is not about SMTP."""
    text = one_line(str(exc)) or type(exc).__name__
    failure: Failure
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return code_reply(stage, exc)
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        failure = Failure.TLS
    elif isinstance(exc, aiosmtplib.SMTPTimeoutError | TimeoutError | ConnectionAbortedError):
        # asyncio aborts a TLS handshake that takes too long with ConnectionAbortedError.
        failure = Failure.TIMEOUT
    elif isinstance(exc, aiosmtplib.SMTPServerDisconnected | ConnectionResetError
                    | BrokenPipeError):
        failure = Failure.RESET
        if isinstance(exc.__cause__, ssl.SSLError):
            failure, text = Failure.TLS, one_line(str(exc.__cause__))
    elif isinstance(exc, ConnectionRefusedError):
        failure = Failure.REFUSED
    elif isinstance(exc, socket.gaierror):
        failure = Failure.UNREACHABLE
    elif isinstance(exc, OSError):
        if exc.errno in _UNREACHABLE_ERRNOS:
            failure = Failure.UNREACHABLE
        elif exc.errno is None and _REFUSED_TEXT in text:
            # asyncio's "Multiple exceptions" when every address of the host refused.
            failure = Failure.REFUSED
        else:
            failure = Failure.RESET
    elif isinstance(exc, aiosmtplib.SMTPException):
        failure = Failure.RESET
    else:
        return None
    return SmtpReply(stage, None, text, failure)


def one_line(text: str) -> str:
    return " ".join(text.split())

