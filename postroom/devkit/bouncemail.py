"""The mail a bounce intake meets, made for its benchmark and the bounce storm: junk of a given
size (random text, or a flood of empty parts) and a DSN as Postfix writes it."""

from __future__ import annotations

import base64
import os

from postroom.verp import return_path

_EMPTY_PART = b"--b\r\nContent-Type: text/plain\r\n\r\n\r\n"


def junk_text(size: int) -> bytes:
    """About ``size`` bytes of random base64 text in one part."""
    text = base64.encodebytes(os.urandom(size * 3 // 4)).replace(b"\n", b"\r\n")
    return b"From: spam@junk.example\r\nSubject: junk\r\n\r\n" + text


def junk_parts(size: int) -> bytes:
    """About ``size`` bytes of empty MIME parts: the bounce heuristics' worst case."""
    return (b"From: spam@junk.example\r\nSubject: parts\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
            + _EMPTY_PART * (size // len(_EMPTY_PART)) + b"--b--\r\n")


def postfix_dsn(bounce_address: str, token: str, recipient: str) -> bytes:
    """A DSN as Postfix writes it, about the email of ``token`` to ``recipient``, mailed to the
    return path ``token`` signs under ``bounce_address``."""
    return f"""From: Mail Delivery System <MAILER-DAEMON@relay.example.com>
Subject: Undelivered Mail Returned to Sender
To: {return_path(bounce_address, token)}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="B.{token}"

--B.{token}
Content-Description: Notification
Content-Type: text/plain; charset=utf-8

<{recipient}>: host mx.example.com said: 550 5.1.1 User unknown

--B.{token}
Content-Description: Delivery report
Content-Type: message/delivery-status

Reporting-MTA: dns; relay.example.com
Original-Envelope-Id: {token}

Final-Recipient: rfc822; {recipient}
Original-Recipient: rfc822;{recipient}
Action: failed
Status: 5.1.1
Diagnostic-Code: smtp; 550 5.1.1 User unknown

--B.{token}--
""".replace("\n", "\r\n").encode()
