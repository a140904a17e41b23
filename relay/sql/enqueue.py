"""The enqueue API's statements: rows into the outbox of a schema, traced or not. Plain text with
``:name`` parameters (a job's import loads no SQLAlchemy; relay/connectors.py runs them on the
job's connection, whichever kind it is)."""

from __future__ import annotations

import functools

# One statement per chunk of one message's recipients: the rows' own columns (idempotency key,
# recipient) as two arrays, the columns they share sent once. Rows go in the given order (ids
# follow it); a second row of one idempotency key, in the chunk or before it, is skipped. It
# returns how many rows are new. An executemany of one row per recipient sent every column of
# every row, and psycopg parsed each multi-row statement of 12,000 parameters anew (most of the
# time of a call with 20,000 recipients; this statement is bound by the database's writes).
INSERT_ROWS = """
    WITH inserted AS (
        INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at{trace})
        SELECT r.idempotency_key, :message_key, r.recipient, CAST(:sender AS text), :subject,
               :body, CAST(:attachments AS text[]), CAST(:html AS text),
               CAST(:inline AS text[]), :priority,
               COALESCE(CAST(:available_at AS timestamptz), now()){trace_values}
        FROM unnest(CAST(:keys AS text[]), CAST(:recipients AS text[]))
             WITH ORDINALITY AS r(idempotency_key, recipient, n)
        ORDER BY r.n
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM inserted
"""


# INSERT_ROWS of one recipient (a personalised call): the same row, as VALUES, without unnest and
# its sort, and without the count: it returns one row when its row is new, none for a key already
# queued (read with a fetch, so it also works in the connection's pipeline mode, where the row
# count comes only with the result). Prepared, through psycopg alone, one cursor for all, both
# triggers (6 December, 9 rounds of 2,000): 165 µs a statement against 173 with INSERT_ROWS'
# count (its CTE and aggregate) and 160 with no result at all; INSERT_ROWS itself took 291
# against the counted VALUES insert's 257 (4 December). A personalised call is bound by its
# statement's round trip.
INSERT_ROW = """
    INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                              attachments, html, inline, priority, available_at{trace})
    VALUES (CAST(:idempotency_key AS text), :message_key, CAST(:recipient AS text),
            CAST(:sender AS text), :subject, :body, CAST(:attachments AS text[]),
            CAST(:html AS text), CAST(:inline AS text[]), :priority,
            COALESCE(CAST(:available_at AS timestamptz), now()){trace_values})
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING true
"""

# Rows of many emails (enqueue_many), every column an array of one item per row; the paths of
# attachments and inline images as a JSON array each (arrays of arrays must be rectangular).
INSERT_EMAILS_COLUMNS = ("idempotency_key", "message_key", "recipient", "sender", "subject",
                         "body", "attachments", "html", "inline", "priority", "available_at")
INSERT_EMAILS = """
    WITH inserted AS (
        INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at{trace})
        SELECT r.idempotency_key, r.message_key, r.recipient, r.sender, r.subject, r.body,
               CASE WHEN r.attachments = '[]' THEN CAST('{{}}' AS text[]) ELSE
                   ARRAY(SELECT jsonb_array_elements_text(CAST(r.attachments AS jsonb))) END,
               r.html,
               CASE WHEN r.inline = '[]' THEN CAST('{{}}' AS text[]) ELSE
                   ARRAY(SELECT jsonb_array_elements_text(CAST(r.inline AS jsonb))) END,
               r.priority, COALESCE(r.available_at, now()){trace_values}
        FROM unnest(CAST(:idempotency_key AS text[]), CAST(:message_key AS text[]),
                    CAST(:recipient AS text[]), CAST(:sender AS text[]),
                    CAST(:subject AS text[]), CAST(:body AS text[]),
                    CAST(:attachments AS text[]), CAST(:html AS text[]),
                    CAST(:inline AS text[]), CAST(:priority AS text[]),
                    CAST(:available_at AS timestamptz[]))
             WITH ORDINALITY AS r(idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at, n)
        ORDER BY r.n
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM inserted
"""


# Whether the outbox :outbox names has migration 0010's trace context columns (0 without the
# table: the insert then says the schema is not ready).
HAS_TRACE_COLUMNS = """
    SELECT count(*) FROM pg_attribute
    WHERE attrelid = to_regclass(:outbox) AND attname = 'traceparent' AND NOT attisdropped
"""


def outbox_of(schema: str | None) -> str:
    """The outbox table of ``schema`` (a quoted identifier), or of the search path's."""
    return f'"{schema.replace(chr(34), chr(34) * 2)}".outbox' if schema else "outbox"


# The trace context columns (migration 0010) are written only by an enqueue in a traced job, so
# an untraced job's statement is the one of before and still runs on an outbox at 0009.
_TRACE_COLUMNS = ", traceparent, tracestate"
_TRACE_VALUES = ", CAST(:traceparent AS text), CAST(:tracestate AS text)"


@functools.cache
def insert_rows(schema: str | None, *, traced: bool = False) -> str:
    """INSERT_ROWS into the outbox of ``schema``, or of the search path's; ``traced``: with
    the ``:traceparent`` and ``:tracestate`` every row of the statement keeps."""
    return INSERT_ROWS.format(outbox=outbox_of(schema), trace=_TRACE_COLUMNS if traced else "",
                              trace_values=_TRACE_VALUES if traced else "")


@functools.cache
def insert_row(schema: str | None, *, traced: bool = False) -> str:
    """INSERT_ROW into the outbox of ``schema``, or of the search path's; ``traced`` as for
    :func:`insert_rows`."""
    return INSERT_ROW.format(outbox=outbox_of(schema), trace=_TRACE_COLUMNS if traced else "",
                             trace_values=_TRACE_VALUES if traced else "")

@functools.cache
def insert_emails(schema: str | None, *, traced: bool = False) -> str:
    """INSERT_EMAILS into the outbox of ``schema``, or of the search path's; ``traced`` as for
    :func:`insert_rows` (one context for all the emails of the call)."""
    return INSERT_EMAILS.format(outbox=outbox_of(schema), trace=_TRACE_COLUMNS if traced else "",
                                trace_values=_TRACE_VALUES if traced else "")

