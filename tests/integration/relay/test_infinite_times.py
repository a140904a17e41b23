"""Times PostgreSQL holds and Python cannot ('infinity', written by hand: a suppression "for
ever", a row inserted by SQL) read as the nearest time Python can hold: `postroom status` and
`suppression list` show them, and a row stopped by a "for ever" entry says so."""

from __future__ import annotations

import sqlalchemy as sa

from postroom import enqueue
from postroom.relay import sql, suppression
from postroom.settings import Settings
from support.rounds import publish_round

FAR = 9999


def test_status_reads_a_row_whose_times_sql_wrote_as_infinity(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="inf", recipients=["a@example.com"], subject="S", body="b")
        conn.execute(sa.text("UPDATE outbox SET created_at = '-infinity', "
                             "next_attempt_at = 'infinity' WHERE message_key = 'inf'"))
    with engine.connect() as conn:
        [row] = conn.execute(sql.status_query("inf", None)).all()
    assert (row.created_at.year, row.next_attempt_at.year) == (1, FAR)


def test_a_suppression_for_ever_is_listed_and_named_on_the_rows_it_stops(
        settings: Settings, engine: sa.Engine) -> None:
    from postroom.relay.publisher import Relay

    with engine.begin() as conn:
        suppression.add(conn, "gone@example.com", "left", 3600)
        conn.execute(sa.text("UPDATE suppression SET expires_at = 'infinity'"))
        enqueue(conn, key="stop", recipients=["gone@example.com"], subject="S", body="b")
    with engine.connect() as conn:
        [entry] = suppression.entries(conn)
    assert entry.expires_at.year == FAR
    assert publish_round(Relay(settings, engine)) == 0
    with engine.connect() as conn:
        status, error = conn.execute(sa.text(
            "SELECT status, last_error FROM outbox WHERE message_key = 'stop'")).one()
    assert status == "suppressed"
    assert error == "suppressed (operator, until further notice): left"


def test_the_failures_report_reads_a_row_changed_at_infinity(engine: sa.Engine) -> None:
    import datetime as dt

    from postroom.relay.report import failures_since

    with engine.begin() as conn:
        enqueue(conn, key="rep", recipients=["a@example.com"], subject="S", body="b")
        conn.execute(sa.text("UPDATE outbox SET status = 'failed', updated_at = 'infinity' "
                             "WHERE message_key = 'rep'"))
    [failure] = failures_since(engine, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert failure.updated_at.year == FAR
