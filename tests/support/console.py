"""An in-memory ConsoleStore for the console's unit tests: rows, suppression entries, dead
letters, sessions and the audit entries its actions write, in lists and dicts."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from postroom.relay.dlq_pages import DeadLetterPage, LetterHistory, merge_newest
from postroom.relay.redrive import RedrivePlan, RedriveRow, skip_reason
from postroom.relay.report import Failure
from postroom.relay.suppression import Entry, NotSuppressedError, Source, checked, reason_of
from postroom.web.auth import Identity
from postroom.web.forms import SearchFilter
from postroom.web.store import (
    SEARCH_SCAN_ROWS,
    Action,
    AuditEntry,
    Email,
    ReportRun,
    SearchPage,
    SessionLimits,
    StoredSession,
)

NOW = dt.datetime(2026, 9, 30, 12, 0, tzinfo=dt.UTC)


def outbox_row(row_id: int, **values: Any) -> dict[str, Any]:
    """An outbox row as the store's queries give it."""
    row = {"id": row_id, "idempotency_key": f"report-{row_id}:a{row_id}@example.com",
           "message_key": "report-2026-09", "recipient": f"a{row_id}@example.com",
           "sender": None, "subject": "September report", "priority": "normal",
           "status": "sent", "attempts": 1, "last_error": None, "smtp_code": 250,
           "enhanced_code": None, "message_id": f"<{row_id}@postroom>", "traceparent": None,
           "created_at": NOW - dt.timedelta(minutes=row_id), "available_at": NOW,
           "published_at": NOW, "sent_at": NOW, "next_attempt_at": None, "updated_at": NOW}
    row.update(values)
    row["keyset_at"] = row["created_at"]
    return row


@dataclasses.dataclass
class MemoryStore:
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    entries: dict[str, Entry] = dataclasses.field(default_factory=dict)
    letters: list[LetterHistory] = dataclasses.field(default_factory=list)
    audited: list[Action] = dataclasses.field(default_factory=list)
    redriven: list[int] = dataclasses.field(default_factory=list)
    scan_rows: int = SEARCH_SCAN_ROWS
    # The sessions signed in, by id: who with its token's MAC, when signed in and when last used
    # (by ``clock``, as SESSION_OF's).
    sessions: dict[str, tuple[StoredSession, float, float]] = dataclasses.field(
        default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def search(self, wanted: SearchFilter, limit: int) -> SearchPage:
        """As DatabaseStore's: a search by state looks through ``scan_rows`` rows at most."""
        walked = sorted((r for r in self.rows
                         if (wanted.message_key is None or r["message_key"] == wanted.message_key)
                         and (wanted.recipient is None
                              or r["recipient"].lower() == wanted.recipient.lower())
                         and (wanted.after is None
                              or (r["created_at"], r["id"]) < wanted.after)),
                        key=lambda r: (r["created_at"], r["id"]), reverse=True)
        if wanted.status is None:
            return SearchPage(walked[:limit])
        walked = walked[:self.scan_rows]
        found = [r for r in walked if r["status"] == wanted.status]
        if len(found) >= limit or len(walked) < self.scan_rows:
            return SearchPage(found[:limit])
        return SearchPage(found, (walked[-1]["created_at"], walked[-1]["id"]))

    def email(self, row_id: int) -> Email | None:
        for row in self.rows:
            if row["id"] == row_id:
                entry = self.entries.get(row["recipient"].lower())
                return Email(row, None, None if entry is None else {
                    **dataclasses.asdict(entry), "source": entry.source.value, "active": True})
        return None

    def report_run(self, message_key: str, limit: int | None = None) -> ReportRun:
        rows = [r for r in self.rows if r["message_key"] == message_key]
        states = sorted({r["status"] for r in rows})
        return ReportRun(tuple((s, sum(1 for r in rows if r["status"] == s)) for s in states),
                         tuple(Failure(r["id"], r["recipient"], r["message_key"],
                                       r["idempotency_key"], r["subject"], r["status"],
                                       r["attempts"], r["last_error"], r["updated_at"])
                               for r in rows if r["status"] in ("failed", "dead", "bounced",
                                                                "suppressed"))[:limit])

    def failure_batches(self, message_key: str) -> Any:
        failures = list(self.report_run(message_key).failures)
        for start in range(0, len(failures), 1000):
            yield failures[start:start + 1000]

    def suppressed(self, contains: str | None, limit: int) -> list[Entry]:
        wanted = (contains or "").lower()
        return sorted((e for e in self.entries.values()
                       if wanted in e.address or wanted in e.reason.lower()),
                      key=lambda e: e.address)[:limit]

    def suppress(self, address: str, reason: str | None, expiry_s: float,
                 action: Action) -> Entry:
        held = checked(address).lower()
        entry = Entry(held, reason_of(reason), Source.OPERATOR, NOW,
                      NOW + dt.timedelta(seconds=expiry_s))
        self.entries[held] = entry
        self.audited.append(dataclasses.replace(action, target=held))
        return entry

    def unsuppress(self, address: str, action: Action) -> str:
        held = checked(address).lower()
        if self.entries.pop(held, None) is None:
            raise NotSuppressedError(f"{held} is not on the suppression list")
        self.audited.append(dataclasses.replace(action, target=held))
        return held

    def dead_letter_page(self, before: dict[int, int] | None, size: int) -> DeadLetterPage:
        ends = before or {}
        if before is None:
            for h in self.letters:
                ends[h.letter.partition] = max(ends.get(h.letter.partition, 0), h.letter.offset + 1)
        left = [h for h in self.letters if h.letter.offset < ends.get(h.letter.partition, 0)]
        shown = merge_newest(left, size)
        cursor = {p: min([h.letter.offset for h in shown if h.letter.partition == p], default=end)
                  for p, end in ends.items()}
        return DeadLetterPage(tuple(shown), cursor if len(left) > len(shown) else None)

    def dead_letter_at(self, partition: int, offset: int) -> LetterHistory | None:
        return next((h for h in self.letters
                     if (h.letter.partition, h.letter.offset) == (partition, offset)), None)

    def _redrivable(self, keys: set[str], recipient: str | None) -> tuple[RedriveRow, ...]:
        return tuple(RedriveRow(r["id"], r["idempotency_key"], r["recipient"], r["status"],
                                r["attempts"]) for r in self.rows
                     if r["status"] in ("failed", "dead")
                     and keys & {r["idempotency_key"], r["message_key"]}
                     and (recipient is None or r["recipient"].lower() == recipient.lower()))

    def plan_replay(self, partition: int, offset: int) -> RedrivePlan:
        found = self.dead_letter_at(partition, offset)
        if found is None:
            place = f"{partition}@{offset}"
            return RedrivePlan((), ((place, "not on the dead-letter topic"),), unknown=place)
        why = skip_reason(found.letter)
        if why is not None:
            return RedrivePlan((), ((found.letter.name, why),))
        return RedrivePlan(self._redrivable({found.letter.key or ""}, None))

    def plan_requeue(self, message_key: str, recipient: str | None) -> RedrivePlan:
        return RedrivePlan(self._redrivable({message_key}, recipient))

    def redrive(self, plan: RedrivePlan, action: Action) -> list[RedriveRow]:
        for row in self.rows:
            if row["id"] in {r.id for r in plan.rows}:
                row["status"] = "pending"
        self.redriven += [r.id for r in plan.rows]
        self.audited.append(dataclasses.replace(action, row_ids=tuple(r.id for r in plan.rows)))
        return list(plan.rows)

    def record(self, action: Action) -> None:
        self.audited.append(action)

    def audit(self, before_id: int | None, limit: int) -> list[AuditEntry]:
        entries = [AuditEntry(n, NOW, a.who.who, a.who.role.value, a.action, a.target,
                              a.row_ids, a.detail) for n, a in enumerate(self.audited, 1)]
        entries.reverse()
        return [e for e in entries if before_id is None or e.id < before_id][:limit]

    def glance(self) -> dict[str, Any]:
        return {"at": NOW.isoformat(), "minutes": ["11:59"], "enqueued": [3], "sent": [2],
                "outbox_backlog": 0, "outbox_oldest_s": None,
                "groups": [{"group": "postroom.sender", "state": "STABLE", "members": 1,
                            "lag": 0, "lag_seconds": 0.0, "unavailable": 0}]}

    def open_session(self, session_id: str, who: Identity, token_mac: str,
                     limits: SessionLimits) -> None:
        self.sessions = {sid: held for sid, held in self.sessions.items()
                         if self._live(held, limits)}
        now = self.clock()
        self.sessions[session_id] = (StoredSession(who, token_mac), now, now)

    def _live(self, held: tuple[StoredSession, float, float], limits: SessionLimits) -> bool:
        now = self.clock()
        return now - held[2] < limits.idle_s and now - held[1] < limits.lifetime_s

    def session(self, session_id: str, limits: SessionLimits, *,
                active: bool) -> StoredSession | None:
        found = self.sessions.get(session_id)
        if found is None or not self._live(found, limits):
            return None
        if active:
            self.sessions[session_id] = (found[0], found[1], self.clock())
        return found[0]

    def close_session(self, session_id: str, peer: str) -> None:
        ended = self.sessions.pop(session_id, None)
        if ended is not None:
            self.audited.append(Action(ended[0].who, "sign out", peer))
