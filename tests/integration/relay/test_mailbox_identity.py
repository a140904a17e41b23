"""One identity per mailbox against the local stack's PostgreSQL (issue 46): with one spelling of
a mailbox suppressed (case, U-label or A-label, full-width), the relay finishes an email to any
other spelling as suppressed, whether enqueue wrote its row or an earlier release wrote it as
given; enqueue keeps one row per mailbox; `suppression remove` takes any spelling; and migration
0015 rewrites what was stored before it, and back."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom import enqueue
from postroom.errors import InvalidContentError
from postroom.relay import suppression
from postroom.relay.db import downgrade, upgrade
from postroom.relay.publisher import Relay
from postroom.relay.results import (
    REPORT_STATUSES,
    ReportPolicy,
    ReportsApplied,
    apply_reports,
    apply_results,
    apply_soft_bounces,
)
from postroom.relay.validation import idempotency_key_prefix
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic
from support.fuzz import examples
from support.rounds import publish_round

pytestmark = pytest.mark.integration


def wide(text: str) -> str:
    """``text`` with its ASCII characters in their full-width forms (UTS-46 maps them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)

SPELLINGS = ["gone@bücher.example", "GONE@BÜCHER.EXAMPLE", "gone@xn--bcher-kva.example",
             "Gone@XN--BCHER-KVA.EXAMPLE", "gone@" + wide("bücher.example"),
             "gone@bücher\u3002example",
             "gone@bu\u0308cher.example"]

_OLD_ROW = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority)
    VALUES (:idempotency_key, :key, :recipient, 'S', 'b', 'normal') RETURNING id""")


def old_row(conn: sa.Connection, key: str, recipient: str) -> int:
    """A row as a release before 0015 wrote it: the recipient as given, its key ending with
    the recipient's lower case. Its id."""
    return int(conn.execute(_OLD_ROW, {
        "idempotency_key": idempotency_key_prefix(key) + recipient.lower(), "key": key,
        "recipient": recipient}).scalar_one())


def statuses(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.message_key: r.status
                for r in conn.execute(sa.text("SELECT message_key, status FROM outbox"))}


def test_a_suppressed_spelling_stops_every_other_spelling_and_the_rest_is_published(
        settings: Settings, engine: sa.Engine, consume: Callable[..., list[Any]]) -> None:
    with engine.begin() as conn:
        suppression.add(conn, "gone@bücher.example", "mailbox deleted", 86400)
        for n, spelling in enumerate(SPELLINGS):
            enqueue(conn, key=f"new{n}", recipients=[spelling], subject="S", body="b")
            old_row(conn, f"old{n}", spelling)
        enqueue(conn, key="other", recipients=["kept@bücher.example"], subject="S", body="b")
    relay = Relay(settings, engine)
    assert publish_round(relay) == 1
    assert relay.stats.suppressed == 2 * len(SPELLINGS)
    assert statuses(engine) == {**{f"{age}{n}": "suppressed" for age in ("new", "old")
                                   for n in range(len(SPELLINGS))}, "other": "published"}
    records = consume(settings, [priority_topic(settings.topic_prefix, Priority.NORMAL)], 1,
                      timeout_s=15)
    assert [r.key for r in records] == [b"other|kept@xn--bcher-kva.example"]


def test_enqueue_keeps_one_row_per_mailbox_in_its_one_spelling(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=SPELLINGS, subject="S", body="b")
        rows = conn.execute(sa.text("SELECT idempotency_key, recipient FROM outbox")).all()
    assert [tuple(r) for r in rows] == [("k|gone@xn--bcher-kva.example",
                                         "gone@xn--bcher-kva.example")]


def test_suppression_holds_one_entry_per_mailbox_and_any_spelling_removes_it(
        engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for spelling in SPELLINGS:
            assert suppression.add(conn, spelling, "left", 3600).address == \
                "gone@xn--bcher-kva.example"
        assert [e.address for e in suppression.entries(conn)] == ["gone@xn--bcher-kva.example"]
        assert suppression.remove(conn, "GONE@" + wide("bücher.example")) == \
            "gone@xn--bcher-kva.example"
        assert suppression.entries(conn) == []
        with pytest.raises(InvalidContentError, match="invalid domain"):
            suppression.add(conn, "gone@☃.example", None, 3600)


LOCALS = st.sampled_from(["gone", "Gone", "GONE", "a.b+tag", "A.B+Tag"])
DOMAINS = st.sampled_from(SPELLINGS).map(lambda address: address.partition("@")[2])


@settings(max_examples=examples(15), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LOCALS, DOMAINS, st.lists(DOMAINS, min_size=1, max_size=3))
def test_any_spelling_suppressed_stops_any_other(
        db_settings: Settings, engine: sa.Engine, local: str, suppressed: str,
        written: list[str]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE outbox, outbox_queue, suppression"))
        suppression.add(conn, f"{local}@{suppressed}", None, 3600)
        for domain in written:
            cased = local.swapcase()
            enqueue(conn, key=uuid.uuid4().hex, recipients=[f"{cased}@{domain}"], subject="S",
                    body="b")
            old_row(conn, uuid.uuid4().hex, f"{cased}@{domain}")
    relay = Relay(db_settings, engine)  # nothing to publish: no producer is made
    assert publish_round(relay) == 0
    assert set(statuses(engine).values()) == {"suppressed"}


def rows_by_id(conn: sa.Connection) -> dict[int, tuple[str, str]]:
    return {r.id: (r.recipient, r.idempotency_key) for r in conn.execute(sa.text(
        "SELECT id, recipient, idempotency_key FROM outbox"))}


def entries_of(conn: sa.Connection) -> dict[str, str]:
    return {r.address: r.reason
            for r in conn.execute(sa.text("SELECT address, reason FROM suppression"))}


OLD_ENTRY = sa.text("""
    INSERT INTO suppression (address, reason, source, expires_at)
    VALUES (lower(:address), :reason, 'bounce', now() + make_interval(secs => :s))""")


def test_0015_rewrites_non_ascii_domains_stored_before_it_and_goes_back(
        engine: sa.Engine) -> None:
    assert downgrade(engine, "0014") == "0014"
    with engine.begin() as conn:
        ids = {key: old_row(conn, key, recipient) for key, recipient in [
            ("a", "GONE@BÜCHER.EXAMPLE"), ("a|b", "x@straße.de"), ("c", "plain@Example.COM"),
            ("d", "josé@example.com"), ("e", "x@☃.example")]}
        # Two spellings of one mailbox in one message: the second keeps its key.
        for recipient in ("gone@xn--bcher-kva.example", "Gone@Bücher.example"):
            old_row(conn, "two", recipient)
        conn.execute(OLD_ENTRY, {"address": "gone@bücher.example", "reason": "short", "s": 60})
        conn.execute(OLD_ENTRY, {"address": "gone@xn--bcher-kva.example", "reason": "long",
                                 "s": 3600})
        conn.execute(OLD_ENTRY, {"address": "x@straße.de", "reason": "r", "s": 60})
        conn.execute(sa.text("INSERT INTO soft_bounces VALUES ('gone@bücher.example', 1, now()),"
                             " ('gone@xn--bcher-kva.example', 1, now()),"
                             " ('gone@bücher.example', 2, now())"))

    assert upgrade(engine) != "0014"
    with engine.connect() as conn:
        rows = rows_by_id(conn)
        entries = entries_of(conn)
        counted = [(r.address, r.outbox_id) for r in conn.execute(sa.text(
            "SELECT address, outbox_id FROM soft_bounces ORDER BY 1, 2"))]
        two = [(r.recipient, r.idempotency_key) for r in conn.execute(sa.text(
            "SELECT recipient, idempotency_key FROM outbox WHERE message_key = 'two' "
            "ORDER BY id"))]
    assert rows[ids["a"]] == ("GONE@xn--bcher-kva.example", "a|gone@xn--bcher-kva.example")
    assert rows[ids["a|b"]] == ("x@xn--strae-oqa.de", "a\\|b|x@xn--strae-oqa.de")
    assert rows[ids["c"]] == ("plain@Example.COM", "c|plain@example.com")
    assert rows[ids["d"]] == ("josé@example.com", "d|josé@example.com")
    assert rows[ids["e"]] == ("x@☃.example", "e|x@☃.example")  # refused: left as it is
    assert two == [("gone@xn--bcher-kva.example", "two|gone@xn--bcher-kva.example"),
                   ("Gone@xn--bcher-kva.example", "two|gone@bücher.example")]
    assert entries == {"gone@xn--bcher-kva.example": "long", "x@xn--strae-oqa.de": "r"}
    assert counted == [("gone@xn--bcher-kva.example", 1), ("gone@xn--bcher-kva.example", 2)]

    assert downgrade(engine, "0014") == "0014"
    with engine.connect() as conn:
        rows = rows_by_id(conn)
        entries = entries_of(conn)
    assert rows[ids["a"]] == ("GONE@bücher.example", "a|gone@bücher.example")
    assert rows[ids["a|b"]] == ("x@straße.de", "a\\|b|x@straße.de")
    assert rows[ids["c"]] == ("plain@Example.COM", "c|plain@example.com")
    # An earlier release compares spellings as written: both spellings of each entry stop it.
    assert entries == {"gone@xn--bcher-kva.example": "long", "gone@bücher.example": "long",
                       "x@xn--strae-oqa.de": "r", "x@straße.de": "r"}
    assert upgrade(engine) != "0014"  # and up again, over what the downgrade left


# -- the recorder: results and reports name their row as written or as 0015 spells it

T0 = dt.datetime.now(dt.UTC).replace(microsecond=0)
POLICY = ReportPolicy(expiry_s=86400, soft_limit=2)


def recorded(engine: sa.Engine, results: list[EmailResult]) -> None:
    """What the recorder does with one batch, in its one transaction."""
    applied = ReportsApplied()
    outcomes = [r for r in results if r.status not in REPORT_STATUSES]
    with engine.begin() as conn:
        apply_results(conn, outcomes, 5)
        apply_reports(conn, [r for r in results if r.status in REPORT_STATUSES], POLICY,
                      applied)
        apply_soft_bounces(conn, outcomes, POLICY, applied)


def named(row_id: int, key: str, recipient: str, status: DeliveryStatus, attempt: int = 1,
          **fields: Any) -> EmailResult:
    return EmailResult(idempotency_key=key, outbox_id=row_id, recipient=recipient,
                       status=status, attempt=attempt, occurred_at=T0, **fields)


def test_results_of_events_published_before_0015_match_their_rewritten_rows(
        engine: sa.Engine) -> None:
    assert downgrade(engine, "0014") == "0014"
    spelled = {"sent": "GONE@BÜCHER.EXAMPLE", "dead1": "a@bücher.example",
               "dead2": "A@Bücher.Example"}
    with engine.begin() as conn:
        ids = {key: old_row(conn, key, recipient) for key, recipient in spelled.items()}
        conn.execute(sa.text("UPDATE outbox SET status = 'published', published_at = now()"))
    assert upgrade(engine) != "0014"
    # The events in flight carry the key and recipient as the rows held them before.
    in_flight = {key: (ids[key], idempotency_key_prefix(key) + r.lower(), r)
                 for key, r in spelled.items()}
    recorded(engine, [named(*in_flight["sent"], DeliveryStatus.SENT, smtp_code=250),
                      *(named(*in_flight[key], DeliveryStatus.DEAD, attempt=5, smtp_code=451,
                              error="451 4.3.0 later") for key in ("dead1", "dead2"))])
    assert statuses(engine) == {"sent": "sent", "dead1": "dead", "dead2": "dead"}
    with engine.connect() as conn:
        # Two soft bounces of one mailbox, written in two spellings: suppressed as one.
        assert entries_of(conn) == {"a@xn--bcher-kva.example": "2 soft bounces in a row "
                                                               "(every retry spent)"}
    recorded(engine, [named(*in_flight["sent"], DeliveryStatus.BOUNCED, smtp_code=550,
                            error="smtp; 550 5.1.1 gone")])
    with engine.connect() as conn:
        assert set(entries_of(conn)) == {"a@xn--bcher-kva.example", "gone@xn--bcher-kva.example"}
    assert statuses(engine)["sent"] == "bounced"


def test_a_report_on_a_row_an_earlier_release_wrote_suppresses_the_mailbox(
        engine: sa.Engine) -> None:
    with engine.begin() as conn:
        row_id = old_row(conn, "k", "Gone@BÜCHER.example")
        conn.execute(sa.text("UPDATE outbox SET status = 'sent'"))
    recorded(engine, [named(row_id, "k|gone@bücher.example", "Gone@BÜCHER.example",
                            DeliveryStatus.COMPLAINED)])
    with engine.connect() as conn:
        assert list(entries_of(conn)) == ["gone@xn--bcher-kva.example"]
