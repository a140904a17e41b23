"""The enqueue API report jobs call: one outbox row per recipient, inside the caller's transaction,
on the connection the job holds (relay/connectors.py). Light: no SQLAlchemy, psycopg or Avro
library is imported here."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import itertools
import logging
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from postroom import tracing
from postroom.errors import InvalidContentError
from postroom.relay import sql, validation
from postroom.relay.connectors import Connector, JobConnection, connector_for
from postroom.relay.errors import InvalidEmailError
from postroom.rules import KEY_MAX_BYTES, SizeLimits, check_idempotency_key
from postroom.schemas.errors import SchemaError
from postroom.schemas.sizes import requested_event_size
from postroom.settings import env_size_limits
from postroom.topics import Priority

# The largest id a row may get: the size check counts the event with it.
EVENT_SIZE_OUTBOX_ID = 2**63 - 1
# Rows per INSERT: one statement and one round trip for each, the message's shared columns sent
# once per statement; a million recipients given as an iterator are never held whole.
INSERT_CHUNK_ROWS = 10_000
# The fast path (issue 26): a one-recipient chunk as INSERT_ROW, and every statement on the
# caller's psycopg connection itself. False is the reference, every statement through
# SQLAlchemy as INSERT_ROWS or INSERT_EMAILS; tests and the benchmark run both.
FAST_PATH = True

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Email:
    """One email for :func:`enqueue_many`: the arguments of :func:`enqueue`, by the same names."""

    recipients: Iterable[str]
    subject: str
    body: str
    key: str | None = None
    attachments: Sequence[str | Path] = ()
    priority: str | Priority = Priority.NORMAL
    send_after: dt.datetime | None = None
    sender: str | None = None
    html: str | None = None
    inline: Sequence[str | Path] = ()


# What of the subject a content key keeps, before its digest.
CONTENT_KEY_SUBJECT_CHARS = 200
CONTENT_KEY_DIGEST_CHARS = 12
CONTENT_KEY_FILE_MAX_BYTES = 64 * 1024 * 1024  # beyond any attachment cap: named, not read


def content_key(email: Email) -> str:
    """A message key named by what ``email`` says: its subject and a digest of its subject,
    bodies, From address and files (each attachment's and inline image's path and bytes), e.g.
    ``Nightly report #3f2a9c1b04de``. The same email queued twice gets the same key (a rerun
    queues nothing twice); any difference, a file's bytes included, makes another. A file that
    cannot be read is named by its path alone: enqueue refuses it with its own error."""
    digest = hashlib.sha256()
    for part in (email.subject, email.body, email.html or "", email.sender or ""):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big") + data)
    for kind, paths in ((b"A", email.attachments), (b"I", email.inline)):
        for path in paths:
            name = str(path).encode("utf-8", "surrogateescape")
            digest.update(kind + len(name).to_bytes(8, "big") + name)
            with contextlib.suppress(OSError):
                # A regular file only: a FIFO or /dev/zero would never end (enqueue refuses
                # them, and files over its caps, after this).
                found = os.stat(path)
                if stat.S_ISREG(found.st_mode) and found.st_size <= CONTENT_KEY_FILE_MAX_BYTES:
                    digest.update(hashlib.sha256(Path(path).read_bytes()).digest())
    subject = " ".join(email.subject.split())[:CONTENT_KEY_SUBJECT_CHARS] or "email"
    return f"{subject} #{digest.hexdigest()[:CONTENT_KEY_DIGEST_CHARS]}"


class _Message(NamedTuple):
    """An email's checked values, shared by its rows (the row columns, by name)."""

    shared: dict[str, Any]
    chunks: Iterator[list[str]]  # its checked recipients, chunk by chunk


def enqueue(
    conn: JobConnection,
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

    ``conn`` is the job's connection: a SQLAlchemy ``Connection`` or ``Session`` (or
    ``scoped_session``), a psycopg 3 ``Connection``, or Django's ``connection``; the rows commit
    or roll back with its transaction (a connection in autocommit mode, outside a transaction:
    the call commits its own rows). Anything else raises
    :class:`~relay.errors.InvalidConnectionError` saying what to pass. Database errors come as
    its library raises them.

    ``key`` names the message (e.g. ``sales-report-2026-09``); with the recipient it makes the
    idempotency key, so a rerun of the job queues nothing twice and returns 0. Without a key the
    subject plays its part. ``html`` adds an HTML body beside the text one (which clients that
    show no HTML, and senders of an older release, send alone); ``inline`` are images the HTML
    shows as ``<img src="cid:<file name>">``, checked like attachments. Everything is checked
    before the insert: a bad input (None included) raises :class:`~relay.errors.EnqueueError`
    and writes nothing. ``limits`` caps the body, the attachments and inline images, and the
    encoded event (Settings.size_limits(); ``attachment_max_bytes`` overrides its per-file cap);
    None: the POSTROOM_*_MAX_BYTES variables of the job's environment, as the roles read them,
    or their defaults (postroom.settings.env_size_limits).
    Called inside an OpenTelemetry span, the rows keep its trace context (an ``enqueue outbox``
    span of the caller's tracer provider), so the roles' spans join the caller's trace.
    ``schema`` names the schema that holds the outbox (POSTROOM_DATABASE_SCHEMA) when the
    connection's search path does not lead there; None or "": the search path's. No outbox
    table there raises :class:`~relay.errors.SchemaNotReadyError`. The caller commits (or rolls
    back).
    """
    limits = limits_of(limits, attachment_max_bytes, schema)
    db = connector_for(conn, schema, fast=FAST_PATH)
    message = check_email(Email(recipients=recipients, subject=subject, body=body, key=key,
                                attachments=attachments, priority=priority,
                                send_after=send_after, sender=sender, html=html, inline=inline),
                          limits)
    shared = message.shared
    keyed = keyed_chunks(message, limits)
    first, first_keys = next(keyed)
    second = next(keyed, None)
    given = new = 0
    # Recipients past the first chunk are checked as they come (an iterator of a million is
    # never held whole): a bad one rolls back the rows of the chunks before it.
    with (tracing.enqueue_span(shared["message_key"]) as trace,
          db.savepoint() if second is not None else contextlib.nullcontext()):
        trace = kept_trace(trace, db, schema)
        statement = sql.insert_rows(schema, traced=trace is not None)
        params = {**shared, **trace_params(trace)}
        if second is None:
            if len(first) == 1 and FAST_PATH:
                new = db.insert_row(sql.insert_row(schema, traced=trace is not None),
                                    {**params, "idempotency_key": first_keys[0],
                                     "recipient": first[0]})
            else:
                new = db.insert_rows(statement,
                                     {**params, "keys": first_keys, "recipients": first})
            given = len(first)
        else:
            with db.inserts() as inserts:
                for chunk, keys in itertools.chain(((first, first_keys), second), keyed):
                    inserts.add(statement, {**params, "keys": keys, "recipients": chunk})
                    given += len(chunk)
            new = inserts.new
    log.info("enqueued message_key=%s new_rows=%d of=%d priority=%s html=%s inline=%d",
             shared["message_key"], new, given, shared["priority"], html is not None,
             len(shared["inline"]))
    return new


def kept_trace(trace: tracing.TraceContext | None, db: Connector,
               schema: str | None) -> tracing.TraceContext | None:
    """``trace`` when the outbox has migration 0010's columns to keep it in, else None: asked at
    each traced enqueue (one short catalog query; the search path, and so the outbox, may differ
    from one call to the next), so a job started before the upgrade traces once it is done."""
    if trace is None:
        return None
    if db.scalar(sql.HAS_TRACE_COLUMNS, {"outbox": sql.outbox_of(schema)}):
        return trace
    log.warning("the outbox has no trace context columns (run `postroom db upgrade` to 0010): "
                "this job's rows are queued without its trace")
    return None


def trace_params(trace: tracing.TraceContext | None) -> dict[str, str | None]:
    """The trace context columns' values, for a statement made with ``traced``."""
    if trace is None:
        return {}
    return {"traceparent": trace.traceparent, "tracestate": trace.tracestate}


def limits_of(limits: SizeLimits | None, attachment_max_bytes: int | None,
              schema: object) -> SizeLimits:
    validation.check_schema(schema)
    limits = limits or env_size_limits()
    if attachment_max_bytes is not None:
        limits = dataclasses.replace(limits, attachment_max_bytes=attachment_max_bytes)
    return limits


def check_email(email: Email, limits: SizeLimits) -> _Message:
    """The email's checked values and its recipients' chunks; EnqueueError for a bad one."""
    subject = validation.check_subject(email.subject)
    message_key = validation.check_key(email.key if email.key is not None else subject)
    body = validation.check_body(email.body, limits.body_max_bytes)
    chosen = validation.check_priority(email.priority)
    files, attached_bytes = validation.check_files(email.attachments, limits.attachment_max_bytes,
                                                   limits.attachments_total_max_bytes)
    html = validation.check_html(email.html)
    images = validation.check_inline(email.inline, html, limits.attachment_max_bytes,
                                     limits.attachments_total_max_bytes, attached_bytes)
    sender = email.sender
    from_address = validation.check_address(sender, what="sender") if sender is not None else None
    send_after = email.send_after
    if send_after is not None and (not isinstance(send_after, dt.datetime)
                                   or send_after.tzinfo is None):
        raise InvalidEmailError("send_after must be a timezone-aware datetime "
                                "(e.g. 2026-10-02T07:00:00+00:00)")
    chunks = validation.recipient_chunks(email.recipients, INSERT_CHUNK_ROWS)
    first = next(chunks, None)
    if first is None:
        raise InvalidEmailError("no recipients given")
    validation.check_headers(from_address or "postroom@localhost", first[0], subject,
                             [*files, *images])
    shared = {"message_key": message_key, "sender": from_address, "subject": subject,
              "body": body, "attachments": files, "html": html, "inline": images,
              "priority": chosen.value, "available_at": send_after}
    return _Message(shared, itertools.chain((first,), chunks))


def keyed_chunks(message: _Message, limits: SizeLimits) -> Iterator[tuple[list[str], list[str]]]:
    """The message's chunks, each with its rows' idempotency keys, each checked whole (its
    recipients, then the event of its longest key) before the next is read: enqueue and a Batch
    check in this order, so both refuse a bad email for the same reason."""
    return ((chunk, keys_of(message.shared, chunk, limits)) for chunk in message.chunks)


def keys_of(shared: dict[str, Any], chunk: list[str], limits: SizeLimits) -> list[str]:
    """The idempotency keys of a chunk's rows, once the longest one is a key the relay and the
    sender take (lowering an address may lengthen it) and its event fits the cap."""
    prefix = validation.idempotency_key_prefix(shared["message_key"])
    # Each address is as its row holds it (rules.mailbox_address): its lower case is the
    # mailbox's identity, rules.mailbox_identity, without computing it twice.
    keys = [prefix + address.lower() for address in chunk]
    longest = max(range(len(keys)), key=lambda n: len(keys[n])) if len(keys) > 1 else 0
    if len(keys[longest]) * 4 > KEY_MAX_BYTES:  # else it is within both caps
        for key, address in zip(keys, chunk, strict=True):
            try:
                check_idempotency_key(key)
            except InvalidContentError as exc:
                raise InvalidEmailError(f"recipient {address!r}: {exc} (the message key and "
                                        "the address in lower case): shorten the key") from None
    _check_event_size((keys[longest], chunk[longest]), shared, limits)
    return keys


def _check_event_size(key_and_recipient: tuple[str, str], shared: dict[str, Any],
                      limits: SizeLimits) -> None:
    """InvalidEmailError when the event of the row with this idempotency key and recipient (the
    longest key of a chunk) would exceed the cap: the relay could never publish it. The event is
    counted whole: the text and HTML bodies, the attachments' and inline images' paths, from the
    values' lengths (schemas/sizes.py, held to the encoder by a differential test)."""
    key, recipient = key_and_recipient
    created_at = dt.datetime.now(dt.UTC)
    try:
        size = requested_event_size(
            idempotency_key=key, message_key=shared["message_key"],
            outbox_id=EVENT_SIZE_OUTBOX_ID, recipient=recipient, sender=shared["sender"] or "",
            subject=shared["subject"], body=shared["body"], priority=shared["priority"],
            created_at=created_at, html=shared["html"], attachments=shared["attachments"],
            inline=shared["inline"])
    except SchemaError as exc:  # text no event can carry: a lone surrogate, say
        raise InvalidEmailError(f"the email cannot be written as an event: {exc}") from None
    if size > limits.event_max_bytes:
        raise InvalidEmailError(
            f"the email's event would be {size} bytes, over the limit of {limits.event_max_bytes} "
            "(POSTROOM_EVENT_MAX_BYTES): shorten the body or attach it as a file")
