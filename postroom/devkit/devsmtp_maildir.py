"""Reading what the dev SMTP server stored in a Maildir (``--maildir``), from another process:
the envelope comes back from the Return-Path and Delivered-To lines the server put first."""

from __future__ import annotations

import mailbox
from pathlib import Path

from postroom.devkit.devsmtp_handler import ReceivedMessage, message_id_of


def read_maildir(path: Path) -> list[ReceivedMessage]:
    """What a DevSmtpServer stored in the Maildir at ``path``, in no particular order."""
    box = mailbox.Maildir(path, create=False)
    found = []
    for key in box.iterkeys():
        raw = box.get_bytes(key)
        head, _, body = raw.partition(b"\n")  # Return-Path
        rcpt_line, _, rest = body.partition(b"\n")  # Delivered-To
        mail_from = head.decode().removeprefix("Return-Path: <").rstrip("\r>")
        rcpt = rcpt_line.decode().removeprefix("Delivered-To: ").rstrip("\r")
        found.append(ReceivedMessage(mail_from, rcpt, message_id_of(rest), rest))
    return found
