"""Many emails at once: :class:`Batch` (one call per email) and :func:`enqueue_many` (a list or an
iterator of them), their rows written together, STATEMENT_ROWS to a statement."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from postroom import tracing
from postroom.errors import first_line
from postroom.relay import outbox, sql
from postroom.relay.connectors import JobConnection, connector_for
from postroom.relay.errors import InvalidEmailError
from postroom.relay.outbox import Email
from postroom.rules import SizeLimits
from postroom.topics import Priority

log = logging.getLogger(__name__)

# Rows a batch sends in one statement, at most INSERT_CHUNK_ROWS (an email with more recipients
# than this goes in statements of its own size). Every row carries its own body, so the server
# can start writing the first rows while the job checks the next ones: 20,000 one-recipient
# emails went at a median of 31,000 rows/s in statements of 10,000 and 43,000 in statements of
# 1,000 (`python -m bench enqueue`'s emails, five interleaved runs of each size).
STATEMENT_ROWS = 1_000


# INSERT_EMAILS_COLUMNS in the order of a batch's rows: each row's own two, then what an email's
# rows share, in the statement's order (Batch.add builds its rows in it).
_OWN_COLUMNS = ("idempotency_key", "recipient")
_ROW_COLUMNS = _OWN_COLUMNS + tuple(name for name in sql.INSERT_EMAILS_COLUMNS
                                    if name not in _OWN_COLUMNS)


def _json_list(paths: list[str]) -> str:
    """Paths as the JSON array INSERT_EMAILS takes (most emails have none)."""
    return json.dumps(paths) if paths else "[]"


def enqueue_many(conn: JobConnection, emails: Iterable[Email], *,
                 attachment_max_bytes: int | None = None, limits: SizeLimits | None = None,
                 schema: str | None = None) -> int:
    """Queue many emails (each a different subject, body or attachment, say: an invoice run)
    in the caller's transaction, as :func:`enqueue` queues each; return how many rows are new.

    Each email is checked as enqueue checks it, and their rows go to the database together,
    about STATEMENT_ROWS per statement, not one statement per email. A bad email raises
    :class:`~relay.errors.EnqueueError` and writes nothing of any of them (emails given as an
    iterator are read as they are written, never held whole; nor are one email's recipients).
    """
    if isinstance(emails, Email) or not isinstance(emails, Iterable):
        raise InvalidEmailError(f"emails must be a list of Email, not {type(emails).__name__}")
    batch = Batch(conn, attachment_max_bytes=attachment_max_bytes, limits=limits, schema=schema)
    # The call's one span covers it whole (a Batch's covers only its start).
    with tracing.enqueue_span(None) as trace, contextlib.ExitStack() as stack:
        stack.push(batch.open(trace))  # left as a with block leaves it
        for email in emails:
            # Any refusal ends the whole call: one email's rows need not be checked whole.
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
    go in statements of about STATEMENT_ROWS, pipelined as :func:`enqueue_many`'s, and the
    count comes when the block ends (a job that needs each email's own count calls enqueue,
    which waits for it). The job may run its own statements on the connection inside the block:
    each first waits for the batch's statement in flight. A database error is raised at the call
    that sends the next statement, at the job's next statement, or at the block's end; the batch
    then takes no more emails. An exception leaving the block writes nothing of the batch (a
    savepoint), and the caller commits or rolls back the rest. An email's recipients are checked
    whole before any of its rows is kept: one email of a million recipients given as an iterator
    belongs in enqueue, which never holds them. A Batch is used once. Inside an OpenTelemetry
    span, the rows keep the context of an ``enqueue outbox`` span that covers the block's start.
    """

    def __init__(self, conn: JobConnection, *, attachment_max_bytes: int | None = None,
                 limits: SizeLimits | None = None, schema: str | None = None) -> None:
        self.new = 0  # the rows that are new, set when the block ends
        self.given = 0  # the rows sent to the database so far: all of them once the block ends
        self._schema = schema
        self._limits = outbox.limits_of(limits, attachment_max_bytes, schema)
        self._db = connector_for(conn, schema, fast=outbox.FAST_PATH)
        self._stack: contextlib.ExitStack | None = None
        self._used = False
        self._failed: BaseException | None = None
        self._rows: list[tuple[Any, ...]] = []

    def __enter__(self) -> Batch:
        with tracing.enqueue_span(None) as trace:
            return self.open(trace)

    def open(self, trace: tracing.TraceContext | None) -> Batch:
        """What entering the block does, with the trace context its rows keep (the caller's
        span's); for :func:`enqueue_many`, whose span covers the whole call."""
        if self._used:
            raise RuntimeError("a Batch is used once: make a new one for the next block")
        self._used = True
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._db.savepoint())
            # Asked before the inserts' pipeline starts: a statement in it answers only later.
            trace = outbox.kept_trace(trace, self._db, self._schema)
            self._inserts = stack.enter_context(self._db.inserts())
            self._statement = sql.insert_emails(self._schema, traced=trace is not None)
            self._traced = outbox.trace_params(trace)
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
        if self._failed is not None:
            raise RuntimeError("this batch met a database error and takes no more emails "
                               f"(leave its with block): {first_line(self._failed)}")
        if not isinstance(email, Email):
            raise InvalidEmailError(f"an email must be an Email, not {type(email).__name__}")
        message = outbox.check_email(email, self._limits)
        shared = message.shared
        # What the email's rows share, in _ROW_COLUMNS' order: the rows become the statement's
        # columns when they are written.
        row = (shared["message_key"], shared["sender"], shared["subject"], shared["body"],
               _json_list(shared["attachments"]), shared["html"], _json_list(shared["inline"]),
               shared["priority"], shared["available_at"])
        keyed: Iterable[tuple[list[str], list[str]]] = outbox.keyed_chunks(message,
                                                                          self._limits)
        if whole:
            keyed = list(keyed)  # every chunk checked before any of its rows is kept
        most = min(STATEMENT_ROWS, outbox.INSERT_CHUNK_ROWS)
        for chunk, keys in keyed:
            if self._rows and len(self._rows) + len(chunk) > most:
                self._write()  # over `most` rows only when one chunk is
            if len(chunk) == 1:
                self._rows.append((keys[0], chunk[0], *row))
            else:
                self._rows += [(key, address, *row) for key, address in zip(keys, chunk,
                                                                             strict=True)]
            if len(self._rows) >= most:
                self._write()

    def _write(self) -> None:
        rows, self._rows = self._rows, []
        self.given += len(rows)
        columns = dict(zip(_ROW_COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
        try:
            self._inserts.add(self._statement, {**columns, **self._traced})
        except Exception as exc:  # the database's (a statement of before, in the pipeline)
            self._failed = exc
            raise

    def _finish(self) -> None:
        """Write what is left, or raise the first database error (not the pipeline's aborts of
        the statements after it)."""
        if self._failed is not None:
            raise self._failed
        if self._rows:
            self._write()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if kind is None:
                self._finish()
        except BaseException as error:
            stack.__exit__(type(error), error, error.__traceback__)
            raise
        stack.__exit__(kind, exc, traceback)
        if kind is None:
            self.new = self._inserts.new
            log.info("enqueued many: new_rows=%d of=%d", self.new, self.given)


