"""The enqueue API report jobs call: one outbox row per recipient, inside the caller's transaction."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom.rules import SizeLimits
from postroom.topics import Priority
from relay import sql, validation
from relay.errors import InvalidEmailError, SchemaNotReadyError
from schemas.codec import EmailRequested, event_size

# The largest id a row may get: the size check counts the event with it.
EVENT_SIZE_OUTBOX_ID = 2**63 - 1
UNDEFINED_TABLE = "42P01"  # SQLSTATE of a relation that does not exist
# Rows per INSERT: one statement and one round trip for each, the message's shared columns sent
# once per statement; a million recipients given as an iterator are never held whole.
INSERT_CHUNK_ROWS = 10_000

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
    attachment_max_bytes: int | None = None,
    limits: SizeLimits | None = None,
    html: str | None = None,
    inline: Sequence[str | Path] = (),
    schema: str | None = None,
) -> int:
    """Queue one email per recipient in the caller's transaction; return how many rows are new.

    ``key`` names the message (e.g. ``sales-report-2026-09``); with the recipient it makes the
    idempotency key, so a rerun of the job queues nothing twice and returns 0. Without a key the
    subject plays its part. ``html`` adds an HTML body beside the text one (which clients that
    show no HTML, and senders of an older release, send alone); ``inline`` are images the HTML
    shows as ``<img src="cid:<file name>">``, checked like attachments. Everything is checked
    before the insert: a bad input (None included) raises :class:`~relay.errors.EnqueueError`
    and writes nothing. ``limits`` caps the body, the attachments and inline images, and the
    encoded event (Settings.size_limits(); ``attachment_max_bytes`` overrides its per-file cap).
    ``schema`` names the schema that holds the outbox (POSTROOM_DATABASE_SCHEMA) when the
    connection's search path does not lead there; None or "": the search path's. No outbox
    table there raises :class:`~relay.errors.SchemaNotReadyError`. The caller commits (or rolls
    back).
    """
    limits = limits or SizeLimits()
    if schema is not None and not isinstance(schema, str):
        raise InvalidEmailError(f"schema must be a schema name, not {type(schema).__name__}")
    if attachment_max_bytes is not None:
        limits = dataclasses.replace(limits, attachment_max_bytes=attachment_max_bytes)
    subject = validation.check_subject(subject)
    message_key = validation.check_key(key if key is not None else subject)
    body = validation.check_body(body, limits.body_max_bytes)
    chosen = validation.check_priority(priority)
    files, attached_bytes = validation.check_files(attachments, limits.attachment_max_bytes,
                                                   limits.attachments_total_max_bytes)
    html = validation.check_html(html)
    images = validation.check_inline(inline, html, limits.attachment_max_bytes,
                                     limits.attachments_total_max_bytes, attached_bytes)
    from_address = validation.check_address(sender, what="sender") if sender is not None else None
    if send_after is not None and (not isinstance(send_after, dt.datetime)
                                   or send_after.tzinfo is None):
        raise InvalidEmailError("send_after must be a timezone-aware datetime "
                                "(e.g. 2026-10-02T07:00:00+00:00)")
    chunks = validation.recipient_chunks(recipients, INSERT_CHUNK_ROWS)
    first = next(chunks, None)
    if first is None:
        raise InvalidEmailError("no recipients given")
    validation.check_headers(from_address or "postroom@localhost", first[0], subject,
                             [*files, *images])
    shared = {"message_key": message_key, "sender": from_address, "subject": subject,
              "body": body, "attachments": files, "html": html, "inline": images,
              "priority": chosen.value, "available_at": send_after}
    statement = sql.insert_rows(schema)
    second = next(chunks, None)
    given = new = 0
    # Recipients past the first chunk are checked as they come (an iterator of a million is
    # never held whole): a bad one rolls back the rows of the chunks before it.
    with conn.begin_nested() if second is not None else contextlib.nullcontext():
        for chunk in itertools.chain((first,), () if second is None else (second,), chunks):
            keys = [validation.idempotency_key(message_key, address) for address in chunk]
            _check_event_size(max(zip(keys, chunk, strict=True), key=lambda kr: len(kr[0])),
                              shared, limits)
            new += _insert(conn, statement, {**shared, "keys": keys, "recipients": chunk}, schema)
            given += len(chunk)
    log.info("enqueued message_key=%s new_rows=%d of=%d priority=%s html=%s inline=%d",
             message_key, new, given, chosen.value, html is not None, len(images))
    return new


def _insert(conn: sa.Connection | Session, statement: sa.TextClause, params: dict[str, Any],
            schema: str | None) -> int:
    """Insert one chunk's rows; how many are new. SchemaNotReadyError when there is no outbox."""
    try:
        return int(conn.execute(statement, params).scalar_one())
    except sa.exc.ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != UNDEFINED_TABLE:
            raise
        where = f"schema {schema}" if schema else "the connection's search path"
        raise SchemaNotReadyError(
            f"there is no outbox table in {where}: pass enqueue(..., schema=...) the "
            "POSTROOM_DATABASE_SCHEMA the roles use, or run `postroom db upgrade`") from None


def _check_event_size(key_and_recipient: tuple[str, str], shared: dict[str, Any],
                      limits: SizeLimits) -> None:
    """InvalidEmailError when the event of the row with this idempotency key and recipient (the
    longest key of a chunk) would exceed the cap: the relay could never publish it. The event is
    counted whole: the text and HTML bodies, the attachments' and inline images' paths."""
    key, recipient = key_and_recipient
    size = event_size(EmailRequested(
        idempotency_key=key, message_key=shared["message_key"], outbox_id=EVENT_SIZE_OUTBOX_ID,
        recipient=recipient, sender=shared["sender"] or "", subject=shared["subject"],
        body=shared["body"], attachments=tuple(shared["attachments"]),
        priority=shared["priority"], created_at=dt.datetime.now(dt.UTC), html=shared["html"],
        inline=tuple(shared["inline"])))
    if size > limits.event_max_bytes:
        raise InvalidEmailError(
            f"the email's event would be {size} bytes, over the limit of {limits.event_max_bytes} "
            "(POSTROOM_EVENT_MAX_BYTES): shorten the body or attach it as a file")
