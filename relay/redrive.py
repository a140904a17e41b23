"""Sends dead-lettered or failed emails again: `postroom dlq list`, `dlq replay` and `requeue`.

The outbox row is the record, so a redrive puts the row back on the relay's queue (status
``pending``) instead of copying the dead letter: the relay publishes it as the next attempt with
a fresh retry budget, its history (attempts, last error) stays on the row, and a second redrive
finds the row pending and does nothing. The topic is read in pages by postroom.relay.dlq; what is
decided here is decided for the letters of one page.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from postroom.errors import PostroomError
from postroom.headers import DLQ_CLASS_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, ERROR_HEADER
from postroom.kafka import message_headers
from postroom.relay import sql
from postroom.schemas.codec import EmailRequested
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.framing import SchemaById, header_value

log = logging.getLogger(__name__)

# What a dead letter keeps of a record's texts (its reason, subject, ...; keys a little more than
# the longest idempotency key): a page of them is what `dlq list` holds in memory.
LETTER_TEXT_MAX_CHARS = 1000
LETTER_KEY_MAX_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic, with the state of its outbox row now."""

    partition: int
    offset: int
    key: str | None
    at: dt.datetime
    classification: str
    reason: str
    source: str
    attempts: int
    recipient: str | None = None
    message_key: str | None = None
    subject: str | None = None
    row_status: str | None = None  # None: no outbox row (poison, or purged)
    letters: int = 1  # dead letters of this key on the topic (this is the latest)

    @property
    def replayable(self) -> bool:
        return self.row_status in sql.FINAL_FAILURES

    @property
    def name(self) -> str:
        return self.key or f"{self.partition}@{self.offset}"

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "at": self.at.isoformat(),
                "replayable": self.replayable}


@dataclasses.dataclass(frozen=True)
class RedriveRow:
    id: int
    idempotency_key: str
    recipient: str
    status: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class RedrivePlan:
    """What a redrive would send again, and what it leaves, with why."""

    rows: tuple[RedriveRow, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (key, why)
    unknown: str | None = None  # the key asked for, when nothing has it


def latest_per_key(letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """One letter per key, the latest (``letters`` oldest first), with how many the key has;
    in the order of those latest letters. Letters without a key stay one each. Pure."""
    latest: dict[str, DeadLetter] = {}
    counts: dict[str, int] = {}
    for letter in letters:
        counts[letter.name] = counts.get(letter.name, 0) + 1
        latest.pop(letter.name, None)  # re-inserted last: dicts keep insertion order
        latest[letter.name] = letter
    return [dataclasses.replace(letter, letters=counts[name]) for name, letter in latest.items()]


def letter_of(msg: Any, partition: int, offset: int,
              schema_by_id: SchemaById | None = None) -> DeadLetter:
    """The dead letter a consumed record of the topic is (any producer's: any bytes), without
    its row's state; PostroomError when the registry it needs does not answer."""
    headers = message_headers(msg)  # any client's record: a header name may not decode
    raw_key = msg.key()
    key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else raw_key
    key = _kept(key, LETTER_KEY_MAX_CHARS) if key is not None else None

    def text(name: str) -> str:
        value = header_value(headers, name)
        return _kept(value.decode(errors="replace"), LETTER_TEXT_MAX_CHARS) if value else ""

    letter = DeadLetter(
        partition, offset, key, _moment(msg.timestamp()[1]),
        text(DLQ_CLASS_HEADER), text(DLQ_REASON_HEADER), text(DLQ_TOPIC_HEADER),
        sum(1 for name, _ in headers if name == ERROR_HEADER))
    try:
        event = decode(EmailRequested, msg.value(), headers, schema_by_id=schema_by_id)
    except SchemaUnavailableError as exc:
        raise PostroomError(f"cannot decode the dead letters: the schema registry "
                            f"(POSTROOM_SCHEMA_REGISTRY_URL) does not answer: {exc}") from exc
    except SchemaError:
        return letter  # poison: dead-lettered byte for byte, not ours to send
    return dataclasses.replace(
        letter, recipient=_kept(event.recipient, LETTER_TEXT_MAX_CHARS),
        message_key=_kept(event.message_key, LETTER_KEY_MAX_CHARS),
        subject=_kept(event.subject, LETTER_TEXT_MAX_CHARS))


def _kept(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` (an ellipsis last): a page of letters stays small whatever a
    record holds; a key cut so is longer than any row's, and matches none."""
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_LAST = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)


def _moment(timestamp_ms: int) -> dt.datetime:
    """A record's time stamp; any producer may write one no datetime holds: held to 1970-9999."""
    try:
        return dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return _EPOCH if timestamp_ms < 0 else _LAST


def _one_line(text: str, width: int = 200) -> str:
    """A header's text as one short line: a reason written by anyone may hold line breaks."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def render_page(letters: Sequence[DeadLetter]) -> tuple[list[str], int, int]:
    """A page of dead letters (oldest first) as `dlq list` shows it: one line per key, its
    latest letter (when, key, why, attempts, row state), with how many keys and how many of
    them replayable, for :func:`render_count`."""
    latest = latest_per_key(letters)
    lines = []
    for letter in latest:
        state = letter.row_status or "no outbox row"
        lines.append(" | ".join([
            letter.at.strftime("%Y-%m-%dT%H:%M:%SZ"), _one_line(letter.name),
            _one_line(letter.classification), f"attempts={letter.attempts}",
            _one_line(letter.reason) or "-",
            f"row={state}" + (" (replayable)" if letter.replayable else "")
            + (f" | {letter.letters} dead letters, latest shown" if letter.letters > 1 else "")]))
    return lines, len(latest), sum(1 for letter in latest if letter.replayable)


def render_count(letters: int, keys: int, replayable: int, pages: int = 1) -> str:
    """The last line of a listing: its letters, their keys and the replayable ones; over several
    pages, keys are counted in each page they have letters in (no page remembers another's)."""
    of = f" of {keys} key(s)" if keys != letters else ""
    if pages > 1:
        return (f"{letters} dead letter(s){of} in {pages} pages, {replayable} replayable with "
                "`postroom dlq replay` (a key is counted in each page it has letters in; "
                "`dlq replay --all --dry-run` counts rows)")
    return f"{letters} dead letter(s){of}, {replayable} replayable with `postroom dlq replay`"


def skip_reason(letter: DeadLetter) -> str | None:
    """Why `dlq replay` leaves ``letter``'s row, in words true to the row's state; None when it
    replays it. Pure."""
    if letter.row_status is None:
        if letter.recipient is None:
            return (f"unreadable record ({_one_line(letter.reason, 100) or 'poison'}): not an "
                    "email to send")
        return "no outbox row (purged?)"
    if letter.replayable:
        return None
    return {
        "sent": "row is sent: delivered since it was dead-lettered (replayed or requeued)",
        "pending": "row is pending: queued to be sent again already",
        "retrying": "row is retrying: a retry is scheduled",
        "published": "row is published: no final state yet (on its way to the sender, or "
                     "refused by it without a result); see `postroom status`",
    }.get(letter.row_status, f"row is {letter.row_status}")


def plan_replay(letters: Sequence[DeadLetter], engine: sa.Engine,
                key: str | None) -> RedrivePlan:
    """Rows to replay from the dead letters: those of ``key`` (an idempotency key or a message
    key), or all when ``key`` is None. Letters whose row is not failed or dead are skipped
    with the reason; a key is looked at once (its latest letter), as `dlq list` shows it."""
    chosen = [letter for letter in latest_per_key(letters)
              if key is None or key in (letter.key, letter.message_key)]
    if key is not None and not chosen:
        return RedrivePlan((), ((key, "not on the dead-letter topic"),), unknown=key)
    skipped = {letter.name: why for letter in chosen if (why := skip_reason(letter))}
    keys = sorted({letter.key for letter in chosen if letter.replayable and letter.key})
    rows = _redrivable(engine, keys, None) if keys else ()
    return RedrivePlan(rows, tuple(sorted(skipped.items())))


def plan_requeue(engine: sa.Engine, message_key: str, recipient: str | None) -> RedrivePlan:
    """Rows of ``message_key`` (and ``recipient``) that ended failed or dead."""
    rows = _redrivable(engine, [message_key], recipient)
    if rows:
        return RedrivePlan(rows)
    with engine.connect() as conn:
        states = [row.status for row in conn.execute(sql.status_query(message_key, None))
                  if recipient is None or row.recipient.lower() == recipient.lower()]
    who = f"{message_key}" + (f" for {recipient}" if recipient else "")
    if not states:
        return RedrivePlan((), ((who, "no outbox row has this key" + (
            " and recipient" if recipient else "")),), unknown=who)
    counted = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    return RedrivePlan((), ((who, f"no failed or dead row (nothing to send again; {counted})"),))


def _redrivable(engine: sa.Engine, keys: Iterable[str],
                recipient: str | None) -> tuple[RedriveRow, ...]:
    with engine.connect() as conn:
        found = conn.execute(sql.REDRIVABLE, {"keys": list(keys), "recipient": recipient})
        return tuple(RedriveRow(r.id, r.idempotency_key, r.recipient, r.status, r.attempts)
                     for r in found)


def redrive(engine: sa.Engine, plan: RedrivePlan) -> list[RedriveRow]:
    """Put the plan's rows back on the relay's queue; returns those this call moved."""
    if not plan.rows:
        return []
    with engine.begin() as conn:
        moved = conn.execute(sql.REDRIVE, {"ids": [row.id for row in plan.rows]}).all()
        conn.execute(sql.NOTIFY_RELAY)
    for row in moved:
        log.info("key=%s redriven after %d attempt(s) (was %s)", row.idempotency_key,
                 row.attempts, row.was)
    return [RedriveRow(r.id, r.idempotency_key, r.recipient, r.was, r.attempts) for r in moved]


def render_plan(plan: RedrivePlan, verb: str) -> list[str]:
    lines = [f"will {verb} {len(plan.rows)} row(s)" + (":" if plan.rows else "")]
    lines += [f"  {row.idempotency_key} ({row.status} after {row.attempts} attempt(s))"
              for row in plan.rows]
    lines += [f"  skip {_one_line(key)}: {why}" for key, why in plan.skipped]
    return lines
