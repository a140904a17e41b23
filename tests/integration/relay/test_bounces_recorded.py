"""The recorder applies the bounce intake's reports against a real PostgreSQL: a hard bounce turns
a sent row bounced and suppresses its address, a delay notice is its last error, a complaint
suppresses; soft bounces in a row suppress; each read twice changes nothing more; a report naming
no row changes nothing; the relay finishes a suppressed address's email without publishing it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.relay import redrive, sql, suppression
from postroom.relay.publisher import Relay
from postroom.relay.recorder import Recorder
from postroom.relay.results import (
    REPORT_STATUSES,
    ReportPolicy,
    ReportsApplied,
    apply_reports,
    apply_results,
    apply_soft_bounces,
)
from postroom.schemas.codec import DeliveryStatus, EmailResult, encode
from postroom.schemas.framing import headers_for
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic, results_topic
from support.metrics import counter
from support.rounds import publish_round

pytestmark = pytest.mark.integration

T0 = dt.datetime.now(dt.UTC).replace(microsecond=0)
POLICY = ReportPolicy(expiry_s=30 * 86400, soft_limit=3)
MAX_ATTEMPT = 5
S = DeliveryStatus


@dataclasses.dataclass(frozen=True)
class Row:
    id: int
    idempotency_key: str
    recipient: str


def rows_of(engine: sa.Engine, key: str, recipients: Sequence[str]) -> dict[str, Row]:
    with engine.begin() as conn:
        enqueue(conn, key=key, recipients=recipients, subject="Report", body="b")
        found = conn.execute(sa.text("SELECT id, idempotency_key, recipient FROM outbox "
                                     "WHERE message_key = :k ORDER BY id"), {"k": key}).all()
    return {r.recipient: Row(r.id, r.idempotency_key, r.recipient) for r in found}


def result(row: Row, status: DeliveryStatus, *, attempt: int = 1, minutes: int = 0,
           **fields: Any) -> EmailResult:
    return EmailResult(idempotency_key=row.idempotency_key, outbox_id=row.id,
                       recipient=row.recipient, status=status, attempt=attempt,
                       occurred_at=T0 + dt.timedelta(minutes=minutes), **fields)


def sent(row: Row, minutes: int = 0) -> EmailResult:
    return result(row, S.SENT, minutes=minutes, smtp_code=250, message_id=f"<{row.id}@t>")


def bounced(row: Row, minutes: int = 1) -> EmailResult:
    return result(row, S.BOUNCED, minutes=minutes, smtp_code=550, enhanced_code="5.1.1",
                  error="smtp; 550 5.1.1 <old.manager@example.com>: Recipient address rejected")


def delayed(row: Row, minutes: int = 1) -> EmailResult:
    return result(row, S.DELAYED, minutes=minutes, smtp_code=451, enhanced_code="4.4.1",
                  error="smtp; 451 4.4.1 try again later")


def dead(row: Row, minutes: int = 0) -> EmailResult:
    return result(row, S.DEAD, attempt=MAX_ATTEMPT, minutes=minutes, smtp_code=451,
                  error="451 4.3.0 try again later")


def record(engine: sa.Engine, results: Sequence[EmailResult],
           policy: ReportPolicy = POLICY) -> ReportsApplied:
    """What the recorder does with one batch, in its one transaction."""
    applied = ReportsApplied()
    outcomes = [r for r in results if r.status not in REPORT_STATUSES]
    with engine.begin() as conn:
        applied.changed += apply_results(conn, outcomes, MAX_ATTEMPT)
        apply_reports(conn, [r for r in results if r.status in REPORT_STATUSES], policy, applied)
        apply_soft_bounces(conn, outcomes, policy, applied)
    return applied


def state(engine: sa.Engine, row: Row) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT status, last_error, smtp_code, enhanced_code, "
                                    "sent_at FROM outbox WHERE id = :id"), {"id": row.id}).one()


def tables(engine: sa.Engine) -> tuple[list[Any], list[Any], list[Any]]:
    with engine.connect() as conn:
        return tuple(conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1, 2")).all()  # type: ignore[return-value]
                     for t in ("outbox", "suppression", "soft_bounces"))


def listed(engine: sa.Engine) -> dict[str, suppression.Entry]:
    with engine.connect() as conn:
        return {e.address: e for e in suppression.entries(conn)}


def test_a_hard_bounce_turns_a_sent_row_bounced_and_suppresses_its_address(
        engine: sa.Engine) -> None:
    rows = rows_of(engine, "sales-09", ["Old.Manager@Example.com", "ceo@example.com"])
    old, ceo = rows["Old.Manager@Example.com"], rows["ceo@example.com"]
    record(engine, [sent(old), sent(ceo)])
    applied = record(engine, [bounced(old)])

    after = state(engine, old)
    assert after.status == "bounced" and after.sent_at is not None
    assert after.last_error == ("bounced 5.1.1: smtp; 550 5.1.1 <old.manager@example.com>: "
                                "Recipient address rejected")
    assert (after.smtp_code, after.enhanced_code) == (550, "5.1.1")
    assert state(engine, ceo).status == "sent"
    [entry] = listed(engine).values()
    assert (entry.address, entry.source) == ("old.manager@example.com", suppression.Source.BOUNCE)
    assert entry.reason.startswith("bounced 5.1.1: smtp; 550 5.1.1")
    assert entry.expires_at == T0 + dt.timedelta(minutes=1, days=30)
    assert (applied.changed, applied.suppressed) == (1, {"bounce": 1})


def test_every_report_read_twice_changes_nothing_more(engine: sa.Engine) -> None:
    rows = rows_of(engine, "k", ["a@example.com", "b@example.com", "c@example.com"])
    a, b, c = rows.values()
    record(engine, [sent(a), sent(b), sent(c)])
    batch = [delayed(a), bounced(a, minutes=2), delayed(b),
             result(c, S.COMPLAINED, minutes=3, error="abuse: feedback report")]
    first = record(engine, batch)
    before = tables(engine)
    again = record(engine, batch)
    assert tables(engine) == before
    assert (first.changed, first.suppressed) == (4, {"bounce": 1, "complaint": 1})
    assert (again.changed, again.ignored, again.suppressed) == (0, 4, {})


def test_a_bounce_before_the_sent_result_still_ends_bounced(engine: sa.Engine) -> None:
    """Postfix's bounce reached the intake 31-38 ms after the 250 (issue 24): its result may be
    recorded before the sender's; the row ends bounced whichever comes first."""
    [row] = rows_of(engine, "early", ["gone@example.com"]).values()
    with engine.begin() as conn:  # as the relay marks it
        conn.execute(sa.text("UPDATE outbox SET status = 'published' WHERE id = :id"),
                     {"id": row.id})
    record(engine, [bounced(row, minutes=0)])
    record(engine, [sent(row)])
    assert state(engine, row).status == "bounced"


def test_a_bounce_for_a_row_that_ended_failed_records_only_its_error(engine: sa.Engine) -> None:
    [row] = rows_of(engine, "failed", ["x@example.com"]).values()
    record(engine, [result(row, S.FAILED, smtp_code=550, error="550 no")])
    record(engine, [bounced(row)])
    after = state(engine, row)
    assert after.status == "failed" and after.last_error.startswith("bounced 5.1.1")
    assert "x@example.com" in listed(engine)


def test_a_bounce_for_a_row_queued_again_leaves_it_to_the_relay_to_suppress(
        settings: Settings, engine: sa.Engine) -> None:
    """A redriven row is pending on the relay's queue: a late bounce of its earlier attempt
    records its error and suppresses the address; the relay then finishes the row suppressed
    instead of publishing it to a bounced address."""
    [row] = rows_of(engine, "again", ["moved@example.com"]).values()
    assert publish_round(Relay(settings, engine)) == 1
    record(engine, [result(row, S.FAILED, smtp_code=550, error="550 5.1.1 moved")])
    assert [r.id for r in redrive.redrive(engine, redrive.plan_requeue(engine, "again", None))
            ] == [row.id]
    record(engine, [bounced(row)])
    after = state(engine, row)
    assert after.status == "pending" and after.last_error.startswith("bounced 5.1.1")
    assert publish_round(Relay(settings, engine)) == 0
    assert state(engine, row).status == "suppressed"


def test_a_bounce_before_the_relay_marks_its_row_published_ends_it_bounced(
        settings: Settings, engine: sa.Engine) -> None:
    """Between Kafka's acknowledgement and the relay's MARK_PUBLISHED the row is still pending
    (and on the queue): a bounce then is of the email just sent, not of an earlier attempt, so
    the row ends bounced as a published one does, and the mark keeps it so. It stayed pending,
    and with the relay's claim gone by then nothing finished it (issue 24's review)."""
    [row] = rows_of(engine, "fast", ["gone@example.com"]).values()
    with engine.begin() as conn:  # the relay's claim, published and acknowledged, unmarked
        [claimed] = sql.claim_due(conn, 10, 30.0)
    record(engine, [bounced(row, minutes=0)])
    assert state(engine, row).status == "bounced"
    with engine.begin() as conn:
        conn.execute(sql.MARK_PUBLISHED, {"ids": [claimed.outbox_id], "owner": None})
    after = state(engine, row)
    assert after.status == "bounced" and after.last_error.startswith("bounced 5.1.1")
    record(engine, [sent(row)])
    assert state(engine, row).status == "bounced"
    assert "gone@example.com" in listed(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 0


def retrying(row: Row, attempt: int) -> EmailResult:
    return result(row, S.RETRYING, attempt=attempt, minutes=attempt, smtp_code=451,
                  error="451 4.3.0 try again later",
                  next_attempt_at=T0 + dt.timedelta(minutes=attempt, seconds=30))


# What the sender reports of one email, in its order; the bounce may be recorded before, between
# or after any of them, in the same batch or another.
SENDER_RESULTS: dict[str, Callable[[Row], list[EmailResult]]] = {
    "sent": lambda r: [result(r, S.SENT, smtp_code=250, message_id="<m@t>")],
    "retrying, sent": lambda r: [retrying(r, 1), result(r, S.SENT, attempt=2, minutes=2,
                                                        smtp_code=250, message_id="<m@t>")],
    "retrying": lambda r: [retrying(r, 1)],
    "retrying, failed": lambda r: [retrying(r, 1), result(r, S.FAILED, attempt=2, minutes=2,
                                                          smtp_code=550, error="550 no")],
    "retrying twice, dead": lambda r: [retrying(r, 1), retrying(r, 2),
                                       result(r, S.DEAD, attempt=3, minutes=3, smtp_code=451,
                                              error="451 4.3.0 try again later")],
}
ROW_FIELDS = ("status, attempts, last_error, smtp_code, enhanced_code, message_id, sent_at, "
              "next_attempt_at")


def batchings(results: Sequence[EmailResult]) -> Iterator[list[list[EmailResult]]]:
    """``results`` cut into consecutive batches in every way (one batch, one each, ...)."""
    for cuts in itertools.product([False, True], repeat=len(results) - 1):
        batches, current = [], [results[0]]
        for cut, item in zip(cuts, results[1:], strict=True):
            if cut:
                batches.append(current)
                current = []
            current.append(item)
        yield [*batches, current]


@pytest.mark.parametrize("story", list(SENDER_RESULTS))
def test_a_row_ends_the_same_whenever_its_bounce_is_recorded(engine: sa.Engine,
                                                             story: str) -> None:
    """Every place of the bounce among the sender's results, every cut into batches: one final
    row, the one a batch holding them all leaves (the recorder applies a batch's results before
    its reports). A bounce recorded before the sender's 'sent' left attempts 0, sent_at and
    message_id NULL; before a 'failed' it left the row bounced, where in one batch it ended
    failed (issue 24's review). Read again, nothing changes."""
    def final(batches: list[list[EmailResult]], n: int) -> tuple[Any, ...]:
        [row] = rows_of(engine, f"{story}-{n}", [f"gone.{n}@example.com"]).values()
        for batch in batches:
            record(engine, [dataclasses.replace(item, idempotency_key=row.idempotency_key,
                                                outbox_id=row.id, recipient=row.recipient)
                            for item in batch])
        with engine.connect() as conn:
            return tuple(conn.execute(sa.text(f"SELECT {ROW_FIELDS} FROM outbox WHERE id = :id"),
                                      {"id": row.id}).one())

    template = Row(0, "", "gone@example.com")
    own = SENDER_RESULTS[story](template)
    report = bounced(template)
    orders = [[*own[:at], report, *own[at:]] for at in range(len(own) + 1)]
    expected = final([[*own, report]], 0)
    ends = {" / ".join(" ".join(f"{r.status.value}({r.attempt})" for r in batch)
                       for batch in batches): final(batches, n)
            for n, batches in enumerate((b for order in orders for b in batchings(order)), 1)}
    assert {order: end for order, end in ends.items() if end != expected} == {}
    status, attempts, last_error, _smtp, _enhanced, message_id, sent_at, _next = expected
    assert last_error.startswith("bounced 5.1.1")
    assert (status, attempts) == {"sent": ("bounced", 1), "retrying, sent": ("bounced", 2),
                                  "retrying": ("bounced", 1), "retrying, failed": ("failed", 2),
                                  "retrying twice, dead": ("dead", 3)}[story]
    assert (message_id is not None, sent_at is not None) == (("sent" in story,) * 2)


def test_a_bounced_row_read_again_changes_nothing(engine: sa.Engine) -> None:
    [row] = rows_of(engine, "k", ["gone@example.com"]).values()
    everything = [retrying(row, 1), bounced(row),
                  result(row, S.SENT, attempt=2, minutes=2, smtp_code=250, message_id="<m@t>")]
    for item in everything:
        record(engine, [item])
    before = tables(engine)
    record(engine, everything)
    for item in everything:
        record(engine, [item])
    assert tables(engine) == before


def test_a_delay_notice_is_the_last_error_and_the_state_stays(engine: sa.Engine) -> None:
    [row] = rows_of(engine, "slow", ["slow@example.com"]).values()
    record(engine, [sent(row)])
    record(engine, [delayed(row)])
    after = state(engine, row)
    assert (after.status, after.last_error) == ("sent",
                                                "delayed 4.4.1: smtp; 451 4.4.1 try again later")
    assert listed(engine) == {}
    record(engine, [bounced(row, minutes=5), delayed(row, minutes=6)])  # the bounce has the word
    assert state(engine, row).last_error.startswith("bounced 5.1.1")


def test_a_complaint_suppresses_and_leaves_the_row_delivered(engine: sa.Engine) -> None:
    [row] = rows_of(engine, "spam", ["angry@example.com"]).values()
    record(engine, [sent(row)])
    record(engine, [result(row, S.COMPLAINED, error="abuse")])
    assert state(engine, row).status == "sent"
    assert listed(engine)["angry@example.com"].source is suppression.Source.COMPLAINT


@pytest.mark.parametrize("forge", [
    lambda r: dataclasses.replace(r, idempotency_key="other|x@example.com"),
    lambda r: dataclasses.replace(r, recipient="someone.else@example.com"),
    lambda r: dataclasses.replace(r, outbox_id=r.outbox_id + 1000),
], ids=["key", "recipient", "id"])
def test_a_report_naming_no_row_changes_nothing(
        engine: sa.Engine, forge: Callable[[EmailResult], EmailResult]) -> None:
    [row] = rows_of(engine, "k", ["x@example.com"]).values()
    record(engine, [sent(row)])
    before = tables(engine)
    applied = record(engine, [forge(bounced(row)), forge(result(row, S.COMPLAINED)),
                              forge(delayed(row))])
    assert tables(engine) == before and applied.changed == 0


def test_soft_bounces_in_a_row_suppress_and_a_sent_email_clears_them(engine: sa.Engine) -> None:
    emails = [rows_of(engine, f"run-{n}", ["flaky@example.com", "fine@example.com"])
              for n in range(6)]
    flaky = [e["flaky@example.com"] for e in emails]
    fine = [e["fine@example.com"] for e in emails]
    # two dead, then a sent one: the count starts again
    record(engine, [dead(flaky[0], 0), dead(flaky[1], 1), dead(fine[0], 1)])
    record(engine, [sent(flaky[2], 2)])
    assert listed(engine) == {}
    # a dead row read twice counts once
    record(engine, [dead(flaky[3], 3)])
    record(engine, [dead(flaky[3], 3)])
    record(engine, [dead(flaky[4], 4)])
    assert listed(engine) == {}
    applied = record(engine, [dead(flaky[5], 5)])
    entry = listed(engine)["flaky@example.com"]
    assert entry.source is suppression.Source.SOFT and entry.reason.startswith("3 soft bounces")
    assert entry.expires_at == T0 + dt.timedelta(minutes=5, days=30)
    assert applied.suppressed == {"soft": 1} and "fine@example.com" not in listed(engine)
    with engine.connect() as conn:  # counting starts again for the next time
        assert conn.execute(sa.text("SELECT count(*) FROM soft_bounces WHERE address = "
                                    "'flaky@example.com'")).scalar_one() == 0


@pytest.mark.parametrize("reply", [{"smtp_code": None, "error": "connection refused"},
                                   {"smtp_code": 421, "error": "421 4.3.2 closing"}],
                         ids=["no reply", "421"])
def test_an_email_dead_without_the_servers_4xx_is_no_soft_bounce(
        engine: sa.Engine, reply: dict[str, Any]) -> None:
    rows = [rows_of(engine, f"r{n}", ["down@example.com"])["down@example.com"]
            for n in range(4)]
    record(engine, [dataclasses.replace(dead(r, n), **reply) for n, r in enumerate(rows)])
    assert listed(engine) == {}


def test_no_soft_limit_counts_nothing(engine: sa.Engine) -> None:
    rows = [rows_of(engine, f"r{n}", ["flaky@example.com"])["flaky@example.com"]
            for n in range(4)]
    record(engine, [dead(r, n) for n, r in enumerate(rows)], ReportPolicy(86400, 0))
    assert listed(engine) == {}


def test_the_relay_finishes_a_suppressed_address_without_publishing(
        settings: Settings, engine: sa.Engine,
        consume: Callable[..., list[Any]]) -> None:
    with engine.begin() as conn:
        suppression.add(conn, "Gone@Example.com", "mailbox deleted", 86400)
        suppression.add(conn, "expired@example.com", "old", 86400)
        conn.execute(sa.text("UPDATE suppression SET expires_at = now() - interval '1 s' "
                             "WHERE address = 'expired@example.com'"))
    rows = rows_of(engine, "sep", ["gone@example.com", "ceo@example.com",
                                   "expired@example.com"])
    relay = Relay(settings, engine)
    assert publish_round(relay) == 2
    assert relay.stats.suppressed == 1
    assert counter(relay.metrics, "relay_suppressed_total") == 1
    gone = state(engine, rows["gone@example.com"])
    assert gone.status == "suppressed"
    assert gone.last_error.startswith("suppressed (operator, until ")
    assert gone.last_error.endswith(" UTC): mailbox deleted")
    assert {state(engine, rows[r]).status for r in ("ceo@example.com", "expired@example.com")} == {
        "published"}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 0
    records = consume(settings, [priority_topic(settings.topic_prefix, Priority.NORMAL)], 2,
                      timeout_s=15)
    assert sorted(r.key for r in records) == [rows["ceo@example.com"].idempotency_key.encode(),
                                              rows["expired@example.com"].idempotency_key.encode()]
    assert publish_round(relay) == 0  # nothing left: the suppressed row is final


def test_a_suppressed_row_takes_no_later_result(engine: sa.Engine) -> None:
    [row] = rows_of(engine, "k", ["gone@example.com"]).values()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'suppressed' WHERE id = :id"),
                     {"id": row.id})
    record(engine, [sent(row), bounced(row)])
    assert state(engine, row).status == "suppressed"


def test_the_recorder_applies_reports_from_the_results_topic_once(
        settings: Settings, engine: sa.Engine) -> None:
    """The wiring: reports read from Kafka among ordinary results, the batch read again by a
    new group (a replay from the beginning) changing nothing."""
    rows = rows_of(engine, "sep", ["old.manager@example.com", "ceo@example.com",
                                   "flaky@example.com"])
    old, ceo = rows["old.manager@example.com"], rows["ceo@example.com"]
    producer = Producer({**settings.kafka_client_config(), "enable.idempotence": True})
    for item in [sent(old), sent(ceo), bounced(old), delayed(ceo),
                 result(ceo, S.COMPLAINED, minutes=2, error="abuse")]:
        producer.produce(results_topic(settings.topic_prefix), encode(item),
                         item.idempotency_key.encode(), headers=headers_for(item))
    assert producer.flush(10) == 0

    def run_recorder(group: str, expected: int) -> Recorder:
        recorder = Recorder(dataclasses.replace(settings, recorder_group=group), engine)
        thread = threading.Thread(target=recorder.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: recorder.stats.applied + recorder.stats.ignored >= expected, 30,
                       f"{expected} results recorded")
        finally:
            recorder.stop()
            thread.join(30)
        assert (recorder.stats.unreadable, recorder.stats.refused) == (0, 0)
        return recorder

    first = run_recorder(f"first-{uuid.uuid4().hex[:8]}", 5)
    assert counter(first.metrics, "suppressed_addresses_total", source="bounce") == 1
    assert counter(first.metrics, "suppressed_addresses_total", source="complaint") == 1
    assert counter(first.metrics, "recorded_total", status="delayed") == 1
    assert counter(first.metrics, "undeliverable_total", status="bounced") == 1
    assert state(engine, old).status == "bounced"
    assert (state(engine, ceo).status, state(engine, ceo).last_error) == (
        "sent", "delayed 4.4.1: smtp; 451 4.4.1 try again later")
    assert set(listed(engine)) == {"old.manager@example.com", "ceo@example.com"}
    before = tables(engine)
    again = run_recorder(f"again-{uuid.uuid4().hex[:8]}", 5)
    assert tables(engine) == before
    assert again.metrics.counters("suppressed_addresses_total") == {}


def test_the_running_relay_suppresses_and_does_not_wait_after_a_full_claim(
        settings: Settings, engine: sa.Engine) -> None:
    """run() claims on a database thread and claims ahead after a full batch: a full batch with
    suppressed rows in it is still full, so the rows after it go at once, not after the poll
    interval (30 s here; the NOTIFY of their insert came before the relay listened)."""
    with engine.begin() as conn:
        suppression.add(conn, "gone@example.com", "mailbox deleted", 86400)
    rows = rows_of(engine, "oct", ["gone@example.com", "a@example.com", "b@example.com"])
    relay = Relay(dataclasses.replace(settings, relay_batch_size=2, relay_poll_interval_s=30.0),
                  engine)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: {state(engine, row).status for row in rows.values()} == {
            "suppressed", "published"}, 10, "October to be published and suppressed")
    finally:
        relay.stop()
        thread.join(40)
    assert state(engine, rows["gone@example.com"]).status == "suppressed"
    assert relay.stats.published == 2 and relay.stats.suppressed == 1
