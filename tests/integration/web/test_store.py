"""The console's store on a real outbox (a schema of the test's own): the search's filters and
keyset pages, one row whole with its trace context, a run's counts and failures, suppression
with its audit line in the same transaction, the audit's pages, and the hour's throughput."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
import sqlalchemy as sa

from postroom.relay.outbox import enqueue
from postroom.relay.suppression import NotSuppressedError
from postroom.settings import Settings
from postroom.web.auth import Identity, Role
from postroom.web.forms import SearchFilter
from postroom.web.store import Action, DatabaseStore, SearchPage, SessionLimits, StoredSession

pytestmark = pytest.mark.integration

OPERATOR = Identity("ops@example.com", Role.OPERATOR, "proxy")
LIMITS = SessionLimits(idle_s=3600, lifetime_s=4 * 3600)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def store(db_settings: Settings, engine: sa.Engine) -> DatabaseStore:
    return DatabaseStore(db_settings, engine)


def seed(engine: sa.Engine, count: int) -> list[int]:
    """``count`` rows of run m, a minute apart (the newest last), every third one dead."""
    with engine.begin() as conn:
        enqueue(conn, key="m", subject="S", body="b",
                recipients=[f"User{n}@Example.com" for n in range(count)])
        conn.execute(sa.text("""
            UPDATE outbox SET created_at = TIMESTAMPTZ '2026-09-30 12:00+00'
                                           + (id - (SELECT min(id) FROM outbox)) * interval '1 minute',
                status = CASE WHEN id % 3 = 0 THEN 'dead' ELSE 'sent' END,
                last_error = CASE WHEN id % 3 = 0 THEN '550 5.1.1 unknown' END,
                updated_at = now(), traceparent = :t"""), {"t": TRACEPARENT})
        return list(conn.scalars(sa.text("SELECT id FROM outbox ORDER BY id")))


def test_search_pages_by_keyset_newest_first(store: DatabaseStore, engine: sa.Engine) -> None:
    ids = seed(engine, 25)
    seen: list[int] = []
    wanted = SearchFilter(message_key="m")
    while True:
        page = store.search(wanted, 10).rows
        seen += [row["id"] for row in page]
        if len(page) < 10:
            break
        wanted = dataclasses.replace(wanted, after=(page[-1]["keyset_at"], page[-1]["id"]))
    assert seen == ids[::-1]


def test_search_filters(store: DatabaseStore, engine: sa.Engine) -> None:
    ids = seed(engine, 9)
    by_recipient = store.search(SearchFilter(recipient="user4@example.com"), 50).rows
    assert [r["recipient"] for r in by_recipient] == ["User4@Example.com"]
    dead = store.search(SearchFilter(status="dead"), 50).rows
    assert sorted(r["id"] for r in dead) == [i for i in ids if i % 3 == 0]
    start = dt.datetime(2026, 9, 30, 12, 2, tzinfo=dt.UTC)
    window = store.search(SearchFilter(created_from=start,
                                       created_until=start + dt.timedelta(minutes=3)), 50).rows
    assert [r["id"] for r in window] == ids[2:5][::-1]
    assert store.search(SearchFilter(message_key="other"), 50) == SearchPage([])


def searched_by_state(store: DatabaseStore, wanted: SearchFilter,
                      limit: int) -> list[tuple[list[int], bool]]:
    """Each page of a search by state, followed to its end: its ids, and whether it stopped at
    the bound (then the next page goes on from where it stopped)."""
    pages = []
    while True:
        page = store.search(wanted, limit)
        pages.append(([row["id"] for row in page.rows], page.scanned_to is not None))
        if len(page.rows) >= limit:
            wanted = dataclasses.replace(wanted, after=(page.rows[limit - 2]["keyset_at"],
                                                        page.rows[limit - 2]["id"]))
        elif page.scanned_to is not None:
            wanted = dataclasses.replace(wanted, after=page.scanned_to)
        else:
            return pages


def test_a_search_by_state_looks_at_a_bounded_number_of_rows_a_page(
        db_settings: Settings, engine: sa.Engine) -> None:
    ids = seed(engine, 25)  # ids[2], ids[5], ... dead: 8 of them (as id % 3 == 0 gives)
    dead = [i for i in ids if i % 3 == 0][::-1]
    store = DatabaseStore(db_settings, engine, scan_rows=7)
    pages = searched_by_state(store, SearchFilter(status="dead"), 3)
    # Each page holds the dead rows among 7 rows at most, or fills up first; in all, each once.
    assert [i for page, _ in pages for i in page[:2]] == dead
    assert all(bounded for page, bounded in pages[:-1] if len(page) < 3)
    assert not pages[-1][1]
    # A state no row is in: four pages of 7, 7, 7 and 4 rows walked, each saying so but the last.
    assert searched_by_state(store, SearchFilter(status="retrying"), 3) == [
        ([], True), ([], True), ([], True), ([], False)]
    # Another filter bounds the walk too: the run's rows only.
    assert searched_by_state(store, SearchFilter(status="retrying", message_key="m",
                                                 recipient="user3@example.com"), 3) == [
        ([], False)]


def test_one_row_whole_and_a_runs_counts_and_failures(store: DatabaseStore,
                                                      engine: sa.Engine) -> None:
    ids = seed(engine, 6)
    found = store.email(ids[0])
    assert found is not None
    assert found.row["traceparent"] == TRACEPARENT
    assert found.row["recipient"] == "User0@Example.com"
    assert found.ledger is None and found.suppression is None
    assert store.email(max(ids) + 1) is None
    run = store.report_run("m")
    assert dict(run.counts) == {"dead": 2, "sent": 4}
    assert sorted(f.id for f in run.failures) == [i for i in ids if i % 3 == 0]
    assert {f.last_error for f in run.failures} == {"550 5.1.1 unknown"}


def test_suppression_and_its_audit_line_go_together(store: DatabaseStore,
                                                    engine: sa.Engine) -> None:
    ids = seed(engine, 1)
    entry = store.suppress("User0@Example.com", "asked", 3600,
                           Action(OPERATOR, "suppression add", "User0@Example.com"))
    assert entry.address == "user0@example.com"
    found = store.email(ids[0])
    assert found is not None and found.suppression is not None
    assert found.suppression["active"] is True and found.suppression["source"] == "operator"
    assert store.unsuppress("user0@example.com", Action(OPERATOR, "suppression remove", "x")) \
        == "user0@example.com"
    with pytest.raises(NotSuppressedError):
        store.unsuppress("user0@example.com", Action(OPERATOR, "suppression remove", "x"))
    entries = store.audit(None, 10)
    assert [(e.who, e.role, e.action, e.target) for e in entries] == [
        ("ops@example.com", "operator", "suppression remove", "user0@example.com"),
        ("ops@example.com", "operator", "suppression add", "user0@example.com")]
    assert store.audit(entries[0].id, 10) == entries[1:]


def test_the_hours_throughput(store: DatabaseStore, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="t", subject="S", body="b",
                recipients=["a@example.com", "b@example.com"])
        conn.execute(sa.text("UPDATE outbox SET status = 'sent', sent_at = now() "
                             "WHERE recipient = 'a@example.com'"))
    counted = store._throughput()
    assert len(counted["minutes"]) == 60
    assert sum(counted["enqueued"]) == 2 and sum(counted["sent"]) == 1
    assert counted["outbox_backlog"] == 2


def test_a_redrive_the_audit_cannot_record_does_not_happen(store: DatabaseStore,
                                                           engine: sa.Engine) -> None:
    ids = seed(engine, 3)
    dead = [i for i in ids if i % 3 == 0]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM outbox_queue"))  # published and ended: not queued
    plan = store.plan_requeue("m", None)
    assert [row.id for row in plan.rows] == dead
    nobody = Identity(None, Role.OPERATOR, "proxy")  # type: ignore[arg-type]  # NOT NULL refuses it
    with pytest.raises(sa.exc.IntegrityError):
        store.redrive(plan, Action(nobody, "requeue", "m"))
    with engine.connect() as conn:
        assert set(conn.scalars(sa.text("SELECT status FROM outbox WHERE id = ANY(:i)"),
                                {"i": dead})) == {"dead"}
    moved = store.redrive(plan, Action(OPERATOR, "requeue", "m"))
    assert [row.id for row in moved] == dead
    [entry] = store.audit(None, 10)
    assert (entry.action, entry.row_ids) == ("requeue", tuple(dead))


def test_the_suppression_page_is_searched_and_cut_by_the_database(store: DatabaseStore) -> None:
    for n, reason in enumerate(("asked by phone", "hard bounce", "Asked twice")):
        store.suppress(f"User{n}@Example.com", reason, 3600,
                       Action(OPERATOR, "suppression add", f"user{n}@example.com"))
    assert [e.address for e in store.suppressed(None, 2)] == ["user0@example.com",
                                                              "user1@example.com"]
    assert [e.address for e in store.suppressed("ASKED", 10)] == ["user0@example.com",
                                                                  "user2@example.com"]
    assert [e.address for e in store.suppressed("USER1@", 10)] == ["user1@example.com"]
    assert store.suppressed("100%_", 10) == []  # the search is text, not a LIKE pattern


def test_the_csv_export_reads_in_batches_what_render_csv_writes(store: DatabaseStore,
                                                       engine: sa.Engine) -> None:
    from postroom.relay.report import render_csv
    from postroom.web.pages import csv_pieces
    from postroom.web.store import CSV_BATCH_ROWS

    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority,
                                status, attempts, last_error)
            SELECT 'big|a' || n || '@example.com', 'big', 'a' || n || '@example.com', '=s', 'b',
                   'normal', 'failed', 2, '-550 no'
            FROM generate_series(1, :rows) AS n"""), {"rows": CSV_BATCH_ROWS * 2 + 5})
    batches = list(store.failure_batches("big"))
    assert [len(b) for b in batches] == [CSV_BATCH_ROWS, CSV_BATCH_ROWS, 5]
    assert [f for b in batches for f in b] == list(store.report_run("big").failures)
    assert "".join(csv_pieces(batches[0], iter(batches[1:]))) == render_csv(
        store.report_run("big").failures)



def test_sessions_are_kept_by_their_ids_hash_and_end_idle_or_signed_out(
        store: DatabaseStore, engine: sa.Engine) -> None:
    reader = Identity("reader token", Role.READER, "token")
    store.open_session("sid-1", reader, "mac-1", LIMITS)
    with engine.connect() as conn:
        held = conn.execute(sa.text(
            "SELECT id_sha256, who, role, token_mac FROM console_session")).all()
    assert [(h.who, h.role, h.token_mac) for h in held] == [("reader token", "reader", "mac-1")]
    assert "sid-1" not in held[0].id_sha256  # the id itself is not in the table
    live = StoredSession(reader, "mac-1")

    def seen_ago(seconds: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE console_session SET seen_at = now() - make_interval("
                                 "secs => :s)"), {"s": seconds})

    def last_seen_s() -> float:
        with engine.connect() as conn:
            return float(conn.scalar(sa.text(
                "SELECT extract(epoch FROM now() - seen_at) FROM console_session")))

    seen_ago(1800)
    assert store.session("sid-1", LIMITS, active=False) == live  # a background refresh ...
    assert last_seen_s() >= 1800  # ... is not a use
    assert store.session("sid-1", LIMITS, active=True) == live
    assert last_seen_s() < 60
    assert store.session("sid-2", LIMITS, active=True) is None
    seen_ago(3601)
    assert store.session("sid-1", LIMITS, active=True) is None  # idle past the limit
    store.open_session("sid-3", reader, "mac-3", LIMITS)  # forgets the idle ones
    store.close_session("sid-3", "10.0.0.9")
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM console_session")) == 0
    signed_out = store.audit(None, 1)[0]
    assert (signed_out.who, signed_out.role, signed_out.action, signed_out.target) == (
        "reader token", "reader", "sign out", "10.0.0.9")
    store.close_session("sid-3", "10.0.0.9")  # no session: no sign-out to audit
    assert store.audit(None, 1)[0].id == signed_out.id


def test_a_session_ends_its_lifetime_after_its_sign_in_however_much_it_is_used(
        store: DatabaseStore, engine: sa.Engine) -> None:
    """By the database's clock, so every replica ends it at the same time; the next sign-in
    forgets it."""
    reader = Identity("reader token", Role.READER, "token")
    store.open_session("sid-1", reader, "mac-1", LIMITS)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE console_session SET signed_in_at = now() - make_interval("
                             "secs => :s), seen_at = now()"), {"s": LIMITS.lifetime_s - 30})
    assert store.session("sid-1", LIMITS, active=True) is not None
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE console_session SET signed_in_at = now() - make_interval("
                             "secs => :s), seen_at = now()"), {"s": LIMITS.lifetime_s})
    assert store.session("sid-1", LIMITS, active=True) is None
    store.open_session("sid-2", reader, "mac-2", LIMITS)
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM console_session")) == 1
