"""What the console reads and changes, behind one protocol (ConsoleStore): the outbox and the
audit table through relay's statements and admin functions, the dead letters and the lag from the
topics. The app talks to the protocol; tests give it an in-memory one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from postroom.relay import dlq_pages, redrive, suppression
from postroom.relay.dlq_pages import DeadLetterPage, LetterHistory
from postroom.relay.redrive import RedrivePlan, RedriveRow
from postroom.relay.report import Failure
from postroom.relay.sql import console as sql
from postroom.relay.sql import operators, outbox_backlog
from postroom.relay.suppression import Entry
from postroom.settings import Settings
from postroom.web.auth import Identity, Role
from postroom.web.forms import SearchFilter

# How long one reading of the lag serves the glance page's polls (every viewer's).
GLANCE_CACHE_S = 5.0
CSV_BATCH_ROWS = 1000
# The rows a search by state walks for one page at most (no index holds the state): a state few
# rows are in is found a page of this many rows at a time, each page saying how far it looked.
SEARCH_SCAN_ROWS = 100_000
# A session's last use is written again when it is older than this: a page view writes the
# database once a minute at most, and the idle limit is kept to within a minute.
SESSION_SEEN_EVERY_S = 60.0


@dataclasses.dataclass(frozen=True)
class Action:
    """One audit entry: who did what to which rows."""

    who: Identity
    action: str
    target: str
    row_ids: tuple[int, ...] = ()
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    id: int
    at: dt.datetime
    who: str
    role: str
    action: str
    target: str
    row_ids: tuple[int, ...]
    detail: str


@dataclasses.dataclass(frozen=True)
class Email:
    row: dict[str, Any]
    ledger: dict[str, Any] | None
    suppression: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class SearchPage:
    """A search's rows, newest first; ``scanned_to``, when the search stopped at its bound
    (SEARCH_SCAN_ROWS) before it found a page: the keyset of the last row it looked at, which
    the next page goes on from (older rows were not looked at)."""

    rows: list[dict[str, Any]]
    scanned_to: tuple[dt.datetime, int] | None = None


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """How long a session lasts: ``idle_s`` after its last use, ``lifetime_s`` after its sign-in
    however it is used."""

    idle_s: float
    lifetime_s: float


@dataclasses.dataclass(frozen=True)
class StoredSession:
    """A live session as the store keeps it: who, and the MAC that ties it to the token that
    signed it in (auth.session_holds checks it against the token set now)."""

    who: Identity
    token_mac: str


@dataclasses.dataclass(frozen=True)
class ReportRun:
    counts: tuple[tuple[str, int], ...]
    failures: tuple[Failure, ...]


class ConsoleStore(Protocol):
    def search(self, wanted: SearchFilter, limit: int) -> SearchPage: ...
    def email(self, row_id: int) -> Email | None: ...
    def report_run(self, message_key: str, limit: int | None = None) -> ReportRun: ...
    def failure_batches(self, message_key: str) -> Iterator[list[Failure]]: ...
    def suppressed(self, contains: str | None, limit: int) -> list[Entry]: ...
    def suppress(self, address: str, reason: str | None, expiry_s: float,
                 action: Action) -> Entry: ...
    def unsuppress(self, address: str, action: Action) -> str: ...
    def dead_letter_page(self, before: dict[int, int] | None, size: int) -> DeadLetterPage: ...
    def dead_letter_at(self, partition: int, offset: int) -> LetterHistory | None: ...
    def plan_replay(self, partition: int, offset: int) -> RedrivePlan: ...
    def plan_requeue(self, message_key: str, recipient: str | None) -> RedrivePlan: ...
    def redrive(self, plan: RedrivePlan, action: Action) -> list[RedriveRow]: ...
    def record(self, action: Action) -> None: ...
    def audit(self, before_id: int | None, limit: int) -> list[AuditEntry]: ...
    def glance(self) -> dict[str, Any]: ...
    def open_session(self, session_id: str, who: Identity, token_mac: str,
                     limits: SessionLimits) -> None: ...
    def session(self, session_id: str, limits: SessionLimits, *,
                active: bool) -> StoredSession | None: ...
    def close_session(self, session_id: str, peer: str) -> None: ...


def replay_plan(engine: sa.Engine, found: LetterHistory | None, partition: int,
                offset: int) -> RedrivePlan:
    """What replaying the dead letter at ``partition``@``offset`` sends again: its row, when it
    ended failed or dead (as `postroom dlq replay` decides)."""
    if found is None:
        place = f"{partition}@{offset}"
        return RedrivePlan((), ((place, "not on the dead-letter topic"),), unknown=place)
    return redrive.plan_replay([found.letter], engine, None)


def _session_key(session_id: str) -> str:
    """How the database holds a session's id: its SHA-256, so that a reader of the table cannot
    sign in with what it reads."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _limit_params(limits: SessionLimits) -> dict[str, float]:
    return {"idle_s": limits.idle_s, "lifetime_s": limits.lifetime_s}


def _audit_params(action: Action, row_ids: Sequence[int] | None = None) -> dict[str, Any]:
    return {"who": action.who.who, "role": action.who.role.value, "action": action.action,
            "target": action.target, "row_ids": list(action.row_ids if row_ids is None
                                                     else row_ids),
            "detail": action.detail}


class DatabaseStore:
    """ConsoleStore over the database (and the topics, for dead letters and lag)."""

    def __init__(self, settings: Settings, engine: sa.Engine,
                 scan_rows: int = SEARCH_SCAN_ROWS) -> None:
        self._settings = settings
        self._engine = engine
        self._scan_rows = scan_rows
        self._glance_lock = threading.Lock()
        self._glance: tuple[float, dict[str, Any]] | None = None
        self._lag_reader: Any = None

    def search(self, wanted: SearchFilter, limit: int) -> SearchPage:
        """The first ``limit`` rows the filters find, or fewer and where the search stopped."""
        query = sql.search_query(
            message_key=wanted.message_key, recipient=wanted.recipient, status=wanted.status,
            created_from=wanted.created_from, created_until=wanted.created_until,
            after=wanted.after, limit=limit, scan_rows=self._scan_rows)
        with self._engine.connect() as conn:
            found = [dict(row) for row in conn.execute(query).mappings()]
        edge = next((row for row in found if row["scan_edge"]), None)
        rows = [{name: value for name, value in row.items()
                 if name not in ("matched", "scan_edge")} for row in found if row["matched"]]
        return SearchPage(rows, None if edge is None or len(rows) >= limit
                          else (edge["keyset_at"], edge["id"]))

    def email(self, row_id: int) -> Email | None:
        with self._engine.connect() as conn:
            row = conn.execute(sql.row_query(row_id)).mappings().first()
            if row is None:
                return None
            ledger = conn.execute(sql.LEDGER_OF_KEY,
                                  {"key": row["idempotency_key"]}).mappings().first()
            entry = conn.execute(sql.SUPPRESSION_OF, {"address": row["recipient"]}).mappings().first()
        return Email(dict(row), dict(ledger) if ledger else None, dict(entry) if entry else None)

    def report_run(self, message_key: str, limit: int | None = None) -> ReportRun:
        """The run's counts by state and its first ``limit`` failures (None: every one)."""
        with self._engine.connect() as conn:
            counts = tuple((str(s), int(n)) for s, n in conn.execute(sql.COUNTS_OF_KEY,
                                                                      {"key": message_key}))
            failures = tuple(Failure(**row._mapping) for row in conn.execute(
                sql.FAILURES_OF_KEY, {"key": message_key, "limit": limit}))
        return ReportRun(counts, failures)

    def failure_batches(self, message_key: str) -> Iterator[list[Failure]]:
        """Every failure of the run, CSV_BATCH_ROWS at a time from a server-side cursor: the
        export of a run of a million failures is never whole in memory."""
        with self._engine.connect() as conn:
            result = conn.execution_options(stream_results=True).execute(
                sql.FAILURES_OF_KEY, {"key": message_key, "limit": None})
            for rows in result.partitions(CSV_BATCH_ROWS):
                yield [Failure(**row._mapping) for row in rows]

    def suppressed(self, contains: str | None, limit: int) -> list[Entry]:
        """The first ``limit`` entries in force whose address or reason holds ``contains``
        (any case), by address."""
        with self._engine.connect() as conn:
            return [Entry.from_row(row) for row in conn.execute(
                sql.SUPPRESSION_PAGE, {"contains": contains, "limit": limit})]

    def suppress(self, address: str, reason: str | None, expiry_s: float,
                 action: Action) -> Entry:
        with self._engine.begin() as conn:  # the entry and its audit line, or neither
            entry = suppression.add(conn, address, reason, expiry_s)
            conn.execute(sql.AUDIT_INSERT, _audit_params(dataclasses.replace(
                action, target=entry.address)))
        return entry

    def unsuppress(self, address: str, action: Action) -> str:
        with self._engine.begin() as conn:
            held = suppression.remove(conn, address)
            conn.execute(sql.AUDIT_INSERT, _audit_params(dataclasses.replace(action, target=held)))
        return held

    def dead_letter_page(self, before: dict[int, int] | None, size: int) -> DeadLetterPage:
        return dlq_pages.read_dead_letter_page(self._settings, self._engine, before, size)

    def dead_letter_at(self, partition: int, offset: int) -> LetterHistory | None:
        return dlq_pages.read_dead_letter_at(self._settings, self._engine, partition, offset)

    def plan_replay(self, partition: int, offset: int) -> RedrivePlan:
        return replay_plan(self._engine, self.dead_letter_at(partition, offset), partition, offset)

    def plan_requeue(self, message_key: str, recipient: str | None) -> RedrivePlan:
        return redrive.plan_requeue(self._engine, message_key, recipient)

    def redrive(self, plan: RedrivePlan, action: Action) -> list[RedriveRow]:
        """redrive.redrive's statements with the audit line in the same transaction: a redrive
        the audit cannot record does not happen."""
        with self._engine.begin() as conn:
            moved = (conn.execute(operators.REDRIVE, {"ids": [row.id for row in plan.rows]}).all()
                     if plan.rows else [])
            if moved:
                conn.execute(operators.NOTIFY_RELAY)
            conn.execute(sql.AUDIT_INSERT, _audit_params(action, [row.id for row in moved]))
        return [RedriveRow(r.id, r.idempotency_key, r.recipient, r.was, r.attempts) for r in moved]

    def record(self, action: Action) -> None:
        with self._engine.begin() as conn:
            conn.execute(sql.AUDIT_INSERT, _audit_params(action))

    def audit(self, before_id: int | None, limit: int) -> list[AuditEntry]:
        with self._engine.connect() as conn:
            return [AuditEntry(r.id, r.at, r.who, r.role, r.action, r.target, tuple(r.row_ids),
                               r.detail) for r in conn.execute(sql.audit_query(before_id, limit))]

    def glance(self) -> dict[str, Any]:
        """Lag per group (records and seconds) and throughput per minute over the last hour; one
        reading serves GLANCE_CACHE_S."""
        with self._glance_lock:
            now = time.monotonic()
            if self._glance is not None and now - self._glance[0] < GLANCE_CACHE_S:
                return self._glance[1]
            value = {"at": dt.datetime.now(dt.UTC).isoformat(), **self._throughput(),
                     **self._lag()}
            self._glance = (now, value)
            return value

    def open_session(self, session_id: str, who: Identity, token_mac: str,
                     limits: SessionLimits) -> None:
        """Record a session signed in (and forget those past ``limits``: each sign-in prunes)."""
        with self._engine.begin() as conn:
            conn.execute(sql.SESSIONS_ENDED_DELETE, _limit_params(limits))
            conn.execute(sql.SESSION_OPEN, {"id": _session_key(session_id), "who": who.who,
                                            "role": who.role.value, "token_mac": token_mac})

    def session(self, session_id: str, limits: SessionLimits, *,
                active: bool) -> StoredSession | None:
        """The session while it is within ``limits``; a request that is ``active`` (not a page's
        background refresh) counts as its use."""
        key = _session_key(session_id)
        with self._engine.begin() as conn:
            found = conn.execute(sql.SESSION_OF, {"id": key, "touch_s": SESSION_SEEN_EVERY_S,
                                                  **_limit_params(limits)}).first()
            if found is None:
                return None
            if active and found.stale:
                conn.execute(sql.SESSION_SEEN, {"id": key})
        return StoredSession(Identity(found.who, Role(found.role), "token"), found.token_mac)

    def close_session(self, session_id: str, peer: str) -> None:
        """End the session; when there was one, its sign-out from ``peer`` is audited in the
        same transaction."""
        with self._engine.begin() as conn:
            ended = conn.execute(sql.SESSION_CLOSE, {"id": _session_key(session_id)}).first()
            if ended is not None:
                conn.execute(sql.AUDIT_INSERT, _audit_params(Action(
                    Identity(ended.who, Role(ended.role), "token"), "sign out", peer)))

    def _throughput(self) -> dict[str, Any]:
        with self._engine.connect() as conn:
            counted = {row.minute: (int(row.enqueued), int(row.sent))
                       for row in conn.execute(sql.THROUGHPUT_LAST_HOUR)}
            backlog, oldest_s = outbox_backlog(conn)
        last = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
        minutes = [last - dt.timedelta(minutes=n) for n in range(59, -1, -1)]
        return {"minutes": [m.strftime("%H:%M") for m in minutes],
                "enqueued": [counted.get(m, (0, 0))[0] for m in minutes],
                "sent": [counted.get(m, (0, 0))[1] for m in minutes],
                "outbox_backlog": backlog, "outbox_oldest_s": oldest_s}

    def _lag(self) -> dict[str, Any]:
        from postroom import lag
        from postroom.errors import PostroomError

        try:
            if self._lag_reader is None:
                self._lag_reader = lag.LagReader(self._settings,
                                                 lag.postroom_groups(self._settings))
            groups = self._lag_reader.sample()
        except PostroomError as exc:
            return {"groups": [], "lag_error": str(exc).splitlines()[0]}
        return {"groups": [{"group": g.group, "state": g.state, "members": len(g.members),
                            "lag": g.sum_lag, "lag_seconds": round(g.max_lag_seconds, 1),
                            "unavailable": g.unavailable} for g in groups]}

    def close(self) -> None:
        if self._lag_reader is not None:
            self._lag_reader.close()
