"""The database grants docs/security.md lists are enough: each role's own code runs against a real
PostgreSQL as a role that has only the grants its row of the "Database roles" table names (and, as
the text under it says, USAGE on the schema and SELECT on alembic_version)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from postroom import Batch, enqueue
from postroom.bounces.adapters import DatabaseRows
from postroom.relay import retention, suppression
from postroom.relay.db import check_schema, make_engine
from postroom.relay.publisher import Relay
from postroom.relay.results import (
    ReportPolicy,
    ReportsApplied,
    apply_reports,
    apply_results,
    apply_soft_bounces,
)
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.settings import Settings
from support.rounds import publish_round

pytestmark = pytest.mark.integration

SECURITY_MD = Path(__file__).resolve().parents[3] / "docs" / "security.md"
_PRIVILEGE = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b(?: \(([\w, ]+)\))?")
NOW = dt.datetime.now(dt.UTC)


def documented_grants(tables: set[str]) -> dict[str, list[str]]:
    """Each role's GRANT statements (``{role}`` for its name), as the table writes them:
    ``SELECT, UPDATE on `outbox`; SELECT (id, status) on `a` and `b` (why); ...``; a name in
    backquotes is a table when ``tables`` holds it."""
    section = SECURITY_MD.read_text().split("### Database roles", 1)[1]
    table = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    grants: dict[str, list[str]] = {}
    for line in table[2:]:
        role, needs = (cell.strip() for cell in line.strip().strip("|").split("|"))
        statements = []
        for clause in needs.split(";"):
            what, on, where = clause.partition(" on ")
            named = [name for name in re.findall(r"`(\w+)`", where) if name in tables]
            privileges = ", ".join(f"{name} ({columns})" if columns else name
                                   for name, columns in _PRIVILEGE.findall(what))
            if on and privileges and named:
                statements.append(f"GRANT {privileges} ON {', '.join(named)} TO {{role}}")
        grants[role] = statements
    return grants


@contextlib.contextmanager
def engine_as(settings: Settings, documented_role: str) -> Iterator[sa.Engine]:
    """An engine whose every connection acts as a new role with the documented grants only."""
    role = f"postroom_doc_{uuid.uuid4().hex[:8]}"
    owner = make_engine(settings)
    with owner.connect() as conn:
        tables = set(conn.execute(sa.text(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")).scalars())
    grants = documented_grants(tables)[documented_role]
    assert grants, f"docs/security.md grants {documented_role!r} nothing"
    with owner.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} NOLOGIN"))
        conn.execute(sa.text(f"GRANT {role} TO CURRENT_USER"))
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{settings.database_schema}" TO {role}'))
        conn.execute(sa.text(f"GRANT SELECT ON alembic_version TO {role}"))
        for grant in grants:
            conn.execute(sa.text(grant.format(role=role)))
    engine = make_engine(settings)

    @sa.event.listens_for(engine, "connect")
    def _as_role(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET ROLE {role}")
        dbapi_connection.commit()  # else the pool's reset rolls the SET back

    try:
        yield engine
    finally:
        engine.dispose()
        with owner.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))  # its grants
            conn.execute(sa.text(f"DROP ROLE {role}"))
        owner.dispose()


def row_of(engine: sa.Engine, key: str, recipient: str) -> sa.Row[Any]:
    with engine.begin() as conn:
        enqueue(conn, key=key, recipients=[recipient], subject="S", body="b")
        return conn.execute(sa.text("SELECT id, idempotency_key, recipient FROM outbox "
                                    "WHERE message_key = :k"), {"k": key}).one()


def result(row: sa.Row[Any], status: DeliveryStatus, **fields: Any) -> EmailResult:
    return EmailResult(idempotency_key=row.idempotency_key, outbox_id=row.id,
                       recipient=row.recipient, status=status,
                       attempt=fields.pop("attempt", 1), occurred_at=NOW, **fields)


def test_the_role_has_only_what_the_table_grants(settings: Settings, engine: sa.Engine) -> None:
    """The check's own check: a statement the grants do not cover is refused."""
    with engine_as(settings, "`postroom status`") as as_status, as_status.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one()
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            conn.execute(sa.text("SELECT count(*) FROM suppression"))


def test_the_relay_publishes_and_suppresses_with_its_grants(settings: Settings,
                                                            engine: sa.Engine) -> None:
    with engine.begin() as conn:
        suppression.add(conn, "gone@example.com", "mailbox deleted", 86400)
    gone, kept = row_of(engine, "a", "gone@example.com"), row_of(engine, "b", "ok@example.com")
    with engine_as(settings, "relay") as as_relay:
        check_schema(as_relay)
        relay = Relay(settings, as_relay)
        assert publish_round(relay) == 1
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT id, status FROM outbox")).all())
    assert states == {gone.id: "suppressed", kept.id: "published"}


def test_the_recorder_applies_results_reports_and_soft_bounces_with_its_grants(
        settings: Settings, engine: sa.Engine) -> None:
    sent, bounced, dead, complained = (row_of(engine, k, f"{k}@example.com")
                                       for k in ("sent", "bounced", "dead", "complained"))
    outcomes = [result(sent, DeliveryStatus.SENT, smtp_code=250, message_id="<m@t>"),
                result(bounced, DeliveryStatus.SENT, smtp_code=250),
                result(dead, DeliveryStatus.DEAD, attempt=5, smtp_code=451, error="451 later"),
                result(complained, DeliveryStatus.SENT, smtp_code=250)]
    reports = [result(bounced, DeliveryStatus.BOUNCED, smtp_code=550, enhanced_code="5.1.1",
                      error="smtp; 550 5.1.1 gone"),
               result(sent, DeliveryStatus.DELAYED, smtp_code=451, error="smtp; 451 later"),
               result(complained, DeliveryStatus.COMPLAINED, error="abuse")]
    policy, applied = ReportPolicy(30 * 86400, 1), ReportsApplied()
    with engine_as(settings, "recorder") as as_recorder:
        check_schema(as_recorder)
        for _ in range(2):  # read again: the ON CONFLICT updates and the DELETEs run too
            with as_recorder.begin() as conn:
                apply_results(conn, outcomes, 5)
                apply_reports(conn, reports, policy, applied)
                apply_soft_bounces(conn, outcomes, policy, applied)
    with engine.connect() as conn:
        listed = {e.address: e.source.value for e in suppression.entries(conn)}
    assert listed == {"bounced@example.com": "bounce", "complained@example.com": "complaint",
                      "dead@example.com": "soft"}


def test_the_bounce_intake_reads_a_row_with_its_grants(settings: Settings,
                                                       engine: sa.Engine) -> None:
    row = row_of(engine, "k", "gone@example.com")
    with engine_as(settings, "bounces") as as_bounces:
        check_schema(as_bounces)
        found = DatabaseRows(as_bounces).row(row.id)
    assert found is not None and (found.outbox_id, found.recipient) == (row.id, row.recipient)


def test_purge_deletes_rows_the_ledger_and_the_list_with_its_grants(
        settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "PAUSE_BETWEEN_BATCHES_S", 0.0)
    old = row_of(engine, "old", "gone@example.com")
    with engine.begin() as conn:  # published long ago, bounced
        conn.execute(sa.text("DELETE FROM outbox_queue"))
        conn.execute(sa.text("UPDATE outbox SET status = 'bounced', updated_at = :at, "
                             "created_at = :at WHERE id = :id"),
                     {"at": NOW - dt.timedelta(days=90), "id": old.id})
        conn.execute(sa.text("INSERT INTO sender_ledger (idempotency_key, state, owner, "
                             "attempt, updated_at) VALUES ('gone|x@example.com', 'sent', 's', "
                             "1, :at)"),
                     {"at": NOW - dt.timedelta(days=90)})
        suppression.add(conn, "gone@example.com", "mailbox deleted", 86400)
        conn.execute(sa.text("UPDATE suppression SET expires_at = :at"),
                     {"at": NOW - dt.timedelta(days=60)})
        conn.execute(sa.text("INSERT INTO soft_bounces (address, outbox_id, occurred_at) "
                             "VALUES ('flaky@example.com', 1, :at)"),
                     {"at": NOW - dt.timedelta(days=60)})
    with engine_as(settings, "`postroom purge`") as as_purge:
        plan = retention.plan(as_purge, 30 * 86400, NOW, 7 * 86400)
        assert dataclasses.astuple(plan)[3:] == ({"bounced": 1}, 1)
        assert retention.purge(as_purge, plan, progress=lambda _line: None) == (1, 1)
    with engine.connect() as conn:
        left = [conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in ("outbox", "sender_ledger", "suppression", "soft_bounces")]
    assert left == [0, 0, 0, 0]


def test_the_suppression_commands_work_with_their_grants(settings: Settings) -> None:
    with engine_as(settings, "`postroom suppression`") as as_operator:
        with as_operator.begin() as conn:
            suppression.add(conn, "Gone@Example.com", "left", 86400)
            suppression.add(conn, "gone@example.com", "left for good", 86400)
        with as_operator.begin() as conn:
            assert [e.reason for e in suppression.entries(conn)] == ["left for good"]
            suppression.remove(conn, "gone@example.com")
            assert suppression.entries(conn) == []


def test_a_report_job_enqueues_with_its_grants(settings: Settings, engine: sa.Engine) -> None:
    """One recipient, several, a rerun, and a Batch: the insert, its ON CONFLICT, the queue
    trigger and its wake-up, as the job's role."""
    with engine_as(settings, "report jobs (`enqueue`)") as as_job, as_job.begin() as conn:
        assert enqueue(conn, key="one", recipients=["a@example.com"], subject="S", body="b") == 1
        assert enqueue(conn, key="two", recipients=["a@example.com", "b@example.com"],
                       subject="S", body="b") == 2
        assert enqueue(conn, key="one", recipients=["a@example.com"], subject="S", body="b") == 0
        with Batch(conn) as batch:
            batch.enqueue(key="three", recipients=["c@example.com"], subject="S", body="b")
        assert batch.new == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 4


def test_the_console_works_with_its_grants(settings: Settings, engine: sa.Engine) -> None:
    from postroom.web.auth import Identity, Role
    from postroom.web.forms import SearchFilter
    from postroom.web.store import Action, DatabaseStore, SessionLimits

    row = row_of(engine, "run", "a@example.com")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'dead', attempts = 5 WHERE id = :i"),
                     {"i": row.id})
        conn.execute(sa.text("DELETE FROM outbox_queue"))
    who = Identity("ops@example.com", Role.OPERATOR, "proxy")
    with engine_as(settings, "`postroom web`") as as_web:
        store = DatabaseStore(settings, as_web)
        assert [r["id"] for r in store.search(SearchFilter(recipient="A@example.com"),
                                              10).rows] == [row.id]
        found = store.email(row.id)
        assert found is not None and found.row["status"] == "dead"
        assert dict(store.report_run("run").counts) == {"dead": 1}
        store.suppress("b@example.com", "asked", 3600, Action(who, "suppression add", "b"))
        store.unsuppress("b@example.com", Action(who, "suppression remove", "b"))
        moved = store.redrive(store.plan_requeue("run", None), Action(who, "requeue", "run"))
        assert [r.id for r in moved] == [row.id]
        assert [e.action for e in store.audit(None, 10)] == [
            "requeue", "suppression remove", "suppression add"]
        assert store._throughput()["outbox_backlog"] == 1
        limits = SessionLimits(3600, 7200)
        store.open_session("sid", who, "mac", limits)
        assert store.session("sid", limits, active=True) is not None
        store.close_session("sid", "127.0.0.1")  # audits the sign-out
        assert store.session("sid", limits, active=True) is None
        assert store.audit(None, 1)[0].action == "sign out"
