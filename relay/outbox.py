"""The enqueue API report jobs call: one outbox row per recipient, inside the caller's transaction."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom import tracing
from postroom.rules import SizeLimits
from postroom.topics import Priority
from relay import sql, validation
from relay.errors import InvalidEmailError
from relay.inserts import Inserts, insert_one
from schemas.codec import EmailRequested
from schemas.errors import SchemaError
from schemas.sizes import event_size, requested_event_size

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


@dataclasses.dataclass(frozen=True)
class _Message:
    """An email's checked values, shared by its rows (the row columns, by name)."""

    shared: dict[str, Any]
    chunks: Iterator[list[str]]  # its checked recipients, chunk by chunk


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
    Called inside an OpenTelemetry span, the rows keep its trace context (an ``enqueue outbox``
    span of the caller's tracer provider), so the roles' spans join the caller's trace.
    ``schema`` names the schema that holds the outbox (POSTROOM_DATABASE_SCHEMA) when the
    connection's search path does not lead there; None or "": the search path's. No outbox
    table there raises :class:`~relay.errors.SchemaNotReadyError`. The caller commits (or rolls
    back).
    """
    limits = _limits(limits, attachment_max_bytes, schema)
    message = _check(Email(recipients=recipients, subject=subject, body=body, key=key,
                           attachments=attachments, priority=priority, send_after=send_after,
                           sender=sender, html=html, inline=inline), limits)
    shared = message.shared
    first = next(message.chunks)
    second = next(message.chunks, None)
    given = new = 0
    # Recipients past the first chunk are checked as they come (an iterator of a million is
    # never held whole): a bad one rolls back the rows of the chunks before it.
    with (tracing.enqueue_span(shared["message_key"]) as trace,
          conn.begin_nested() if second is not None else contextlib.nullcontext()):
        trace = _kept(trace, conn, schema)
        statement = sql.insert_rows(schema, traced=trace is not None)
        params = {**shared, **_trace_params(trace)}
        if second is None:
            keys = _keys(shared, first, limits)
            if len(first) == 1 and FAST_PATH:
                new = insert_one(conn, sql.insert_row(schema, traced=trace is not None),
                                 {**params, "idempotency_key": keys[0], "recipient": first[0]},
                                 schema, fast=FAST_PATH)
            else:
                new = insert_one(conn, statement, {**params, "keys": keys, "recipients": first},
                                 schema, fast=FAST_PATH)
            given = len(first)
        else:
            with Inserts(conn, schema, fast=FAST_PATH) as inserts:
                for chunk in itertools.chain((first, second), message.chunks):
                    keys = _keys(shared, chunk, limits)
                    inserts.add(statement, {**params, "keys": keys, "recipients": chunk})
                    given += len(chunk)
            new = inserts.new
    log.info("enqueued message_key=%s new_rows=%d of=%d priority=%s html=%s inline=%d",
             shared["message_key"], new, given, shared["priority"], html is not None,
             len(shared["inline"]))
    return new


def enqueue_many(conn: sa.Connection | Session, emails: Iterable[Email], *,
                 attachment_max_bytes: int | None = None, limits: SizeLimits | None = None,
                 schema: str | None = None) -> int:
    """Queue many emails (each a different subject, body or attachment, say: an invoice run)
    in the caller's transaction, as :func:`enqueue` queues each; return how many rows are new.

    Each email is checked as enqueue checks it, and their rows go to the database together, up
    to INSERT_CHUNK_ROWS per statement, not one statement per email. A bad email raises
    :class:`~relay.errors.EnqueueError` and writes nothing of any of them (emails given as an
    iterator are read as they are written, never held whole; nor are one email's recipients).
    """
    if isinstance(emails, Email) or not isinstance(emails, Iterable):
        raise InvalidEmailError(f"emails must be a list of Email, not {type(emails).__name__}")
    with Batch(conn, attachment_max_bytes=attachment_max_bytes, limits=limits,
               schema=schema) as batch:
        for email in emails:
            # Any refusal ends the whole call, so one email's rows need not be checked whole first.
            batch.add(email, whole=False)
    return batch.new


class Batch:
    """Many emails in the caller's transaction, one call each, their rows written together.

    ::

        with Batch(conn) as batch:  # postroom.Batch
            for invoice in invoices:
                batch.enqueue(key=invoice.key, recipients=[invoice.email], subject=..., body=...)
        print(batch.new)            # the rows that are new, once the block has ended

    :meth:`enqueue` takes :func:`enqueue`'s arguments and checks the email as enqueue does: a bad
    one raises :class:`~relay.errors.EnqueueError` and leaves nothing of that email in the batch,
    which goes on if the job catches the error. A call does not wait for the database: the rows
    go in statements of up to INSERT_CHUNK_ROWS, pipelined as :func:`enqueue_many`'s, and the
    count comes when the block ends (a job that needs each email's own count calls enqueue,
    which waits for it). A database error is raised at the call that sends a statement or at the
    block's end; an exception leaving the block writes nothing of the batch (a savepoint), and
    the caller commits or rolls back the rest. An email's recipients are checked whole before
    any of its rows is kept: one email of a million recipients given as an iterator belongs in
    enqueue, which never holds them.
    """

    def __init__(self, conn: sa.Connection | Session, *, attachment_max_bytes: int | None = None,
                 limits: SizeLimits | None = None, schema: str | None = None) -> None:
        self.new = 0  # set when the block ends
        self.given = 0  # rows given so far, new or not
        self._conn, self._schema = conn, schema
        self._limits = _limits(limits, attachment_max_bytes, schema)
        self._stack: contextlib.ExitStack | None = None
        self._columns = _no_columns()

    def __enter__(self) -> Batch:
        if self._stack is not None:
            raise RuntimeError("this Batch is in use already")
        with contextlib.ExitStack() as stack:
            trace = stack.enter_context(tracing.enqueue_span(None))
            stack.enter_context(self._conn.begin_nested())
            # Asked before the inserts' pipeline starts: a statement in it answers only later.
            trace = _kept(trace, self._conn, self._schema)
            self._inserts = stack.enter_context(Inserts(self._conn, self._schema,
                                                        fast=FAST_PATH))
            self._statement = sql.insert_emails(self._schema, traced=trace is not None)
            self._traced = _trace_params(trace)
            self._stack = stack.pop_all()
        return self

    def enqueue(self, *, key: str | None = None, recipients: Iterable[str], subject: str,
                body: str, attachments: Sequence[str | Path] = (),
                priority: str | Priority = Priority.NORMAL, send_after: dt.datetime | None = None,
                sender: str | None = None, html: str | None = None,
                inline: Sequence[str | Path] = ()) -> None:
        """Check one email as :func:`enqueue` does and add its rows to the batch."""
        self.add(Email(recipients=recipients, subject=subject, body=body, key=key,
                       attachments=attachments, priority=priority, send_after=send_after,
                       sender=sender, html=html, inline=inline))

    def add(self, email: Email, *, whole: bool = True) -> None:
        """:meth:`enqueue` of an :class:`Email`. ``whole=False``: its recipients past the first
        INSERT_CHUNK_ROWS are checked as they are written (a refusal then leaves some of its rows
        in the batch: for callers that end the batch on any refusal)."""
        if self._stack is None:
            raise RuntimeError("Batch.enqueue outside its with block")
        if not isinstance(email, Email):
            raise InvalidEmailError(f"an email must be an Email, not {type(email).__name__}")
        message = _check(email, self._limits)
        shared = message.shared
        values = {name: shared[name] for name in _SHARED_EMAIL_COLUMNS}
        values["attachments"] = _json_list(shared["attachments"])
        values["inline"] = _json_list(shared["inline"])
        chunks: Iterable[list[str]] = message.chunks
        keyed: Iterable[tuple[list[str], list[str]]]
        if whole:
            first = next(message.chunks)
            second = next(message.chunks, None)
            chunks = [first] if second is None else [first, second, *message.chunks]
            keyed = [(chunk, _keys(shared, chunk, self._limits)) for chunk in chunks]
        else:
            keyed = ((chunk, _keys(shared, chunk, self._limits)) for chunk in chunks)
        for chunk, keys in keyed:
            columns = self._columns
            for name, value in values.items():
                if len(chunk) == 1:
                    columns[name].append(value)
                else:
                    columns[name] += [value] * len(chunk)
            columns["idempotency_key"] += keys
            columns["recipient"] += chunk
            if len(columns["recipient"]) >= INSERT_CHUNK_ROWS:
                self._write()

    def _write(self) -> None:
        columns, self._columns = self._columns, _no_columns()
        self.given += len(columns["recipient"])
        self._inserts.add(self._statement, {**columns, **self._traced})

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if kind is None and self._columns["recipient"]:
                self._write()
        except BaseException as error:
            stack.__exit__(type(error), error, error.__traceback__)
            raise
        stack.__exit__(kind, exc, traceback)
        if kind is None:
            self.new = self._inserts.new
            log.info("enqueued many: new_rows=%d of=%d", self.new, self.given)


def _no_columns() -> dict[str, list[Any]]:
    return {name: [] for name in sql.INSERT_EMAILS_COLUMNS}


def _kept(trace: tracing.TraceContext | None, conn: sa.Connection | Session,
          schema: str | None) -> tracing.TraceContext | None:
    """``trace`` when the outbox has migration 0010's columns to keep it in, else None: asked at
    each traced enqueue (one short catalog query; the search path, and so the outbox, may differ
    from one call to the next), so a job started before the upgrade traces once it is done."""
    if trace is None:
        return None
    if conn.execute(sql.HAS_TRACE_COLUMNS, {"outbox": sql.outbox_of(schema)}).scalar_one():
        return trace
    log.warning("the outbox has no trace context columns (run `postroom db upgrade` to 0010): "
                "this job's rows are queued without its trace")
    return None


# The INSERT_EMAILS columns an email's rows share, as _check names them.
_SHARED_EMAIL_COLUMNS = ("message_key", "sender", "subject", "body", "html", "priority",
                         "available_at")


def _json_list(paths: list[str]) -> str:
    """Paths as the JSON array INSERT_EMAILS takes (most emails have none)."""
    return json.dumps(paths) if paths else "[]"


def _trace_params(trace: tracing.TraceContext | None) -> dict[str, str | None]:
    """The trace context columns' values, for a statement made with ``traced``."""
    if trace is None:
        return {}
    return {"traceparent": trace.traceparent, "tracestate": trace.tracestate}


def _limits(limits: SizeLimits | None, attachment_max_bytes: int | None,
            schema: object) -> SizeLimits:
    if schema is not None and not isinstance(schema, str):
        raise InvalidEmailError(f"schema must be a schema name, not {type(schema).__name__}")
    limits = limits or SizeLimits()
    if attachment_max_bytes is not None:
        limits = dataclasses.replace(limits, attachment_max_bytes=attachment_max_bytes)
    return limits


def _check(email: Email, limits: SizeLimits) -> _Message:
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


def _keys(shared: dict[str, Any], chunk: list[str], limits: SizeLimits) -> list[str]:
    """The idempotency keys of a chunk's rows, once the longest one's event fits the cap."""
    prefix = validation.idempotency_key_prefix(shared["message_key"])
    keys = [prefix + address.lower() for address in chunk]
    longest = max(range(len(keys)), key=lambda n: len(keys[n])) if len(keys) > 1 else 0
    _check_event_size((keys[longest], chunk[longest]), shared, limits)
    return keys


def _check_event_size(key_and_recipient: tuple[str, str], shared: dict[str, Any],
                      limits: SizeLimits) -> None:
    """InvalidEmailError when the event of the row with this idempotency key and recipient (the
    longest key of a chunk) would exceed the cap: the relay could never publish it. The event is
    counted whole: the text and HTML bodies, the attachments' and inline images' paths. Counted
    from the values' lengths; a value the count refuses is encoded, for the encoder's words."""
    key, recipient = key_and_recipient
    values = {"idempotency_key": key, "message_key": shared["message_key"],
              "outbox_id": EVENT_SIZE_OUTBOX_ID, "recipient": recipient,
              "sender": shared["sender"] or "", "subject": shared["subject"],
              "body": shared["body"], "priority": shared["priority"],
              "created_at": dt.datetime.now(dt.UTC), "html": shared["html"]}
    try:
        size = requested_event_size(**values, attachments=shared["attachments"],
                                    inline=shared["inline"])
    except SchemaError:
        size = _encoded_event_size(values, shared)
    if size > limits.event_max_bytes:
        raise InvalidEmailError(
            f"the email's event would be {size} bytes, over the limit of {limits.event_max_bytes} "
            "(POSTROOM_EVENT_MAX_BYTES): shorten the body or attach it as a file")


def _encoded_event_size(values: dict[str, Any], shared: dict[str, Any]) -> int:
    """The event's size by encoding it (the reference requested_event_size is held to)."""
    try:
        return event_size(EmailRequested(**values, attachments=tuple(shared["attachments"]),
                                         inline=tuple(shared["inline"])))
    except SchemaError as exc:  # text no event can carry: a lone surrogate, say
        raise InvalidEmailError(f"the email cannot be written as an event: {exc}") from None
