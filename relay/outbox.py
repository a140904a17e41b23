"""The enqueue API report jobs call: one outbox row per recipient, inside the caller's transaction."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom.settings import Settings
from postroom.topics import Priority
from relay import sql, validation
from relay.errors import InvalidEmailError

log = logging.getLogger(__name__)


def enqueue(
    conn: sa.Connection | Session,
    *,
    key: str | None = None,
    recipients: Iterable[str],
    subject: str,
    body: str,
    attachments: Sequence[str | Path] = (),
    priority: str | Priority = Priority.NORMAL,
    send_after: dt.datetime | None = None,
    sender: str | None = None,
    attachment_max_bytes: int = Settings.attachment_max_bytes,
    html: str | None = None,
    inline: Sequence[str | Path] = (),
) -> int:
    """Queue one email per recipient in the caller's transaction; return how many rows are new.

    ``key`` names the message (e.g. ``sales-report-2026-09``); with the recipient it makes the
    idempotency key, so a rerun of the job queues nothing twice and returns 0. Without a key the
    subject plays its part. ``html`` adds an HTML body beside the text one (which clients that
    show no HTML, and senders of an older release, send alone); ``inline`` are images the HTML
    shows as ``<img src="cid:<file name>">``, checked like attachments. Everything is checked
    before the insert: a bad input raises
    :class:`~relay.errors.EnqueueError` and writes nothing. The caller commits (or rolls back).
    """
    subject = validation.check_subject(subject)
    message_key = validation.check_key(key if key is not None else subject)
    body = validation.check_body(body)
    addresses = validation.check_recipients(recipients)
    chosen = validation.check_priority(priority)
    files = validation.check_attachments(attachments, attachment_max_bytes)
    html = validation.check_html(html)
    images = validation.check_inline(inline, html, attachment_max_bytes)
    from_address = validation.check_address(sender, what="sender") if sender else None
    if send_after is not None and send_after.tzinfo is None:
        raise InvalidEmailError("send_after must be timezone-aware (e.g. 2026-10-02T07:00:00+00:00)")
    rows = [
        {
            "idempotency_key": validation.idempotency_key(message_key, address),
            "message_key": message_key,
            "recipient": address,
            "sender": from_address,
            "subject": subject,
            "body": body,
            "attachments": files,
            "html": html,
            "inline": images,
            "priority": chosen.value,
            **({"available_at": send_after} if send_after is not None else {}),
        }
        for address in addresses
    ]
    inserted = conn.execute(sql.INSERT_ROWS, rows).scalars().all()
    log.info("enqueued message_key=%s new_rows=%d of=%d priority=%s html=%s inline=%d",
             message_key, len(inserted), len(rows), chosen.value, html is not None, len(images))
    return len(inserted)
