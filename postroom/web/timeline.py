"""One email's life as the console shows it: events in time order built from its outbox row, the
sender's ledger entry and its address's suppression entry, and its trace link. Pure.

The outbox keeps the reply of the last attempt only (each attempt overwrites it); the replies of
the attempts before are in the dead letter's history headers when the email was dead-lettered
(the dead-letter page shows them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from postroom.tracing import parse_traceparent

FINAL_BAD = {"failed": "failed", "dead": "dead-lettered", "bounced": "bounced",
             "suppressed": "suppressed"}


@dataclasses.dataclass(frozen=True)
class Event:
    at: dt.datetime | None  # None: when is not recorded
    what: str               # enqueued, published, attempt, retry tier, sent, dead-lettered, ...
    detail: str


def retry_tier_of(attempt: int, delays_s: Sequence[float]) -> tuple[int, float] | None:
    """(tier, its delay) an email waits in after failed attempt ``attempt`` (1-based), or None
    when no tier is left."""
    if 1 <= attempt <= len(delays_s):
        return attempt, delays_s[attempt - 1]
    return None


def _reply(row: Mapping[str, Any]) -> str:
    code = " ".join(str(part) for part in (row.get("smtp_code"), row.get("enhanced_code"))
                    if part)
    error = row.get("last_error") or ""
    return f"{code} {error}".strip() if code and not error.startswith(code) else error


def events(row: Mapping[str, Any], ledger: Mapping[str, Any] | None,
           suppression: Mapping[str, Any] | None, delays_s: Sequence[float]) -> list[Event]:
    """The events of one outbox row (``row``: row_query's columns), oldest first."""
    found = [Event(row["created_at"], "enqueued",
                   f"message key {row['message_key']}, subject {row['subject']!r}, "
                   f"priority {row['priority']}, idempotency key {row['idempotency_key']}")]
    if row.get("published_at") is not None:
        found.append(Event(row["published_at"], "published", "to Kafka by the relay"))
    attempts = int(row.get("attempts") or 0)
    status = row["status"]
    reply = _reply(row)
    if attempts > 1:
        found.append(Event(None, f"attempts 1 to {attempts - 1}",
                           "their replies are not kept in the outbox (a dead letter's history "
                           "holds them)"))
    if attempts >= 1:
        last = Event(row.get("updated_at"), f"attempt {attempts}", reply or "(no reply recorded)")
        if status == "retrying":
            tier = retry_tier_of(attempts, delays_s)
            wait = (f"; waiting in retry tier {tier[0]} ({tier[1]:g}s)" if tier else "")
            last = dataclasses.replace(last, detail=f"{last.detail}{wait}; next attempt at "
                                       f"{_moment(row.get('next_attempt_at'))}")
        found.append(last)
    if ledger is not None:
        found.append(Event(ledger.get("updated_at"), "sender ledger",
                           f"{ledger['state']} by {ledger['owner']} (attempt {ledger['attempt']})"
                           + (f", Message-ID {ledger['message_id']}" if ledger.get("message_id")
                              else "")))
    if row.get("sent_at") is not None:
        found.append(Event(row["sent_at"], "sent", "accepted by the mail server" + (
            f", Message-ID {row['message_id']}" if row.get("message_id") else "")))
    if status in FINAL_BAD:
        found.append(Event(row.get("updated_at"), FINAL_BAD[status], reply or status))
    if suppression is not None:
        state = "suppressed" if suppression.get("active") else "was suppressed"
        found.append(Event(suppression["created_at"], f"address {state}",
                           f"{suppression['source']}: {suppression['reason']} (until "
                           f"{_moment(suppression['expires_at'])})"))
    # An event without a time keeps its place after the one before it.
    placed: list[tuple[dt.datetime, int, Event]] = []
    when = _FIRST
    for n, event in enumerate(found):
        when = event.at or when
        placed.append((when, n, event))
    return [item for _, _, item in sorted(placed, key=lambda p: (p[0], p[1]))]


_FIRST = dt.datetime(1, 1, 2, tzinfo=dt.UTC)


def _moment(at: object) -> str:
    if isinstance(at, dt.datetime):
        return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-"


def trace_link(traceparent: object, template: str | None) -> tuple[str, str | None] | None:
    """(trace id, its URL through POSTROOM_WEB_TRACE_URL or None) of a row's traceparent, or None
    when it holds none that W3C would accept. The id is 32 hex digits: safe in a URL."""
    context = parse_traceparent(traceparent)
    if context is None:
        return None
    url = template.replace("{trace_id}", context.trace_id) if template else None
    return context.trace_id, url
