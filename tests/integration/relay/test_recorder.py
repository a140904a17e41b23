"""The recorder against the real broker and database: results move rows forward, never back,
and replaying the results topic from the beginning leaves the table as it was."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.relay import recorder
from postroom.relay.publisher import Relay
from postroom.relay.recorder import Recorder, RecorderStats
from postroom.relay.results import apply_each, apply_results
from postroom.schemas.codec import DeliveryStatus, EmailResult, encode
from postroom.schemas.framing import SCHEMA_HEADER, headers_for
from postroom.settings import Settings
from postroom.topics import results_topic
from support.metrics import counter
from support.rounds import publish_round

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 10, 1, 7, 0, 0, tzinfo=dt.UTC)
WAIT_S = 30.0


@pytest.fixture
def recorder_settings(settings: Settings) -> Settings:
    """A recorder group of this test's own, so tests never share a group's offsets."""
    return dataclasses.replace(settings, recorder_group=f"test-recorder-{uuid.uuid4().hex[:10]}")


@dataclasses.dataclass(frozen=True)
class Row:
    id: int
    idempotency_key: str
    recipient: str


def enqueue_and_publish(settings: Settings, engine: sa.Engine, key: str,
                        recipients: Sequence[str]) -> dict[str, Row]:
    """Rows of ``key`` for ``recipients``, relay-published; by recipient."""
    with engine.begin() as conn:
        enqueue(conn, key=key, recipients=recipients, subject="Report", body="b")
    publish_round(Relay(settings, engine))
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT id, idempotency_key, recipient, status FROM outbox WHERE message_key = :k "
            "ORDER BY id"),
            {"k": key}).all()
    assert {r.status for r in rows} == {"published"}
    return {r.recipient: Row(r.id, r.idempotency_key, r.recipient) for r in rows}


def result(row: Row, status: DeliveryStatus, attempt: int, *, minutes: int = 0,
           **fields: Any) -> EmailResult:
    return EmailResult(idempotency_key=row.idempotency_key, outbox_id=row.id,
                       recipient=row.recipient, status=status, attempt=attempt,
                       occurred_at=T0 + dt.timedelta(minutes=minutes), **fields)


def deferred(row: Row, attempt: int, minutes: int = 0) -> EmailResult:
    return result(row, DeliveryStatus.RETRYING, attempt, minutes=minutes, smtp_code=451,
                  enhanced_code="4.7.1", error=f"451 4.7.1 greylisted (attempt {attempt})",
                  next_attempt_at=T0 + dt.timedelta(minutes=minutes + 5))


def sent(row: Row, attempt: int, minutes: int = 0) -> EmailResult:
    return result(row, DeliveryStatus.SENT, attempt, minutes=minutes, smtp_code=250,
                  enhanced_code="2.0.0", message_id=f"<{row.id}.{attempt}@postroom.test>")


def rejected(row: Row, attempt: int, minutes: int = 0) -> EmailResult:
    return result(row, DeliveryStatus.FAILED, attempt, minutes=minutes, smtp_code=550,
                  enhanced_code="5.1.1", error="550 5.1.1 no such user")


def produce(settings: Settings, records: Sequence[EmailResult | tuple[bytes, Any]],
            key: bytes = b"poison") -> None:
    """Put results (or raw ``(value, headers)`` pairs) on the results topic, in this order."""
    producer = Producer({**settings.kafka_client_config(), "enable.idempotence": True})
    topic = results_topic(settings.topic_prefix)
    for record in records:
        if isinstance(record, EmailResult):
            producer.produce(topic, encode(record), record.idempotency_key.encode(),
                             headers=headers_for(record))
        else:
            value, headers = record
            producer.produce(topic, value, key, headers=headers)
    assert producer.flush(10) == 0, "results were not acknowledged"


class RecorderThread(threading.Thread):
    """A Recorder on a thread; a crash is kept for the test to see."""

    def __init__(self, settings: Settings, engine: sa.Engine) -> None:
        super().__init__(name="recorder", daemon=True)
        self.recorder = Recorder(settings, engine)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.recorder.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    @property
    def stats(self) -> RecorderStats:
        return self.recorder.stats

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError("recorder crashed") from self.error


@contextmanager
def running(settings: Settings, engine: sa.Engine) -> Iterator[RecorderThread]:
    thread = RecorderThread(settings, engine)
    thread.start()
    try:
        yield thread
    finally:
        thread.recorder.stop()
        thread.join(30)
    assert not thread.is_alive(), "recorder did not stop"
    thread.check()


def row_state(engine: sa.Engine, row: Row) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT status, attempts, last_error, smtp_code, enhanced_code, message_id, sent_at, "
            "next_attempt_at, published_at FROM outbox WHERE id = :id"), {"id": row.id}).one()


def snapshot(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text("SELECT * FROM outbox ORDER BY id")).mappings()]


def differences(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"<id>.<column>": (before, after)}`` for every value that changed."""
    assert [r["id"] for r in after] == [r["id"] for r in before]
    return {f"{old['id']}.{column}": (value, new[column])
            for old, new in zip(before, after, strict=True)
            for column, value in old.items() if new[column] != value}


def until(engine: sa.Engine, row: Row, check: Callable[[sa.Row[Any]], bool],
          what: str) -> sa.Row[Any]:
    def done() -> sa.Row[Any] | None:
        state = row_state(engine, row)
        return state if check(state) else None
    return wait_until(done, WAIT_S, what)


def consumed(recorder: RecorderThread) -> int:
    """Results the recorder has read and committed to the database (stats move after commit)."""
    recorder.check()  # a crash fails now, not at the timeout
    stats = recorder.stats
    return stats.applied + stats.ignored + stats.unreadable + stats.refused


def until_consumed(recorder: RecorderThread, expected: int) -> None:
    # Results of different keys may sit on different partitions: no one of them comes last.
    wait_until(lambda: consumed(recorder) >= expected, WAIT_S, f"{expected} results to be recorded")
    assert consumed(recorder) == expected


def test_published_then_retrying_then_sent_keeps_the_deferral(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    row = enqueue_and_publish(recorder_settings, engine, "k", ["anna@example.com"])[
        "anna@example.com"]
    published_at = row_state(engine, row).published_at
    with running(recorder_settings, engine) as recorder:
        produce(recorder_settings, [deferred(row, 1)])
        state = until(engine, row, lambda s: s.status == "retrying", "the deferral")
        assert state.attempts == 1
        assert state.last_error == "451 4.7.1 greylisted (attempt 1)"
        assert (state.smtp_code, state.enhanced_code) == (451, "4.7.1")
        assert state.next_attempt_at == T0 + dt.timedelta(minutes=5)
        assert state.sent_at is None

        produce(recorder_settings, [sent(row, 2, minutes=5)])
        state = until(engine, row, lambda s: s.status == "sent", "the delivery")
    assert state.attempts == 2
    assert state.last_error == "451 4.7.1 greylisted (attempt 1)", "the deferral's error is kept"
    assert (state.smtp_code, state.enhanced_code) == (250, "2.0.0")
    assert state.message_id == f"<{row.id}.2@postroom.test>"
    assert state.sent_at == T0 + dt.timedelta(minutes=5)
    assert state.next_attempt_at is None
    assert state.published_at == published_at
    assert (recorder.stats.applied, recorder.stats.ignored, recorder.stats.unreadable) == (2, 0, 0)


def test_a_permanent_failure_records_the_smtp_codes(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    rows = enqueue_and_publish(recorder_settings, engine, "k",
                               ["gone@example.com", "flaky@example.com"])
    gone, flaky = rows["gone@example.com"], rows["flaky@example.com"]
    produce(recorder_settings, [rejected(gone, 1), deferred(flaky, 1), rejected(flaky, 2)])
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 3)
    state = row_state(engine, gone)
    assert state.status == "failed"
    assert (state.attempts, state.smtp_code, state.enhanced_code) == (1, 550, "5.1.1")
    assert state.last_error == "550 5.1.1 no such user"
    assert state.sent_at is None
    assert state.message_id is None
    state = row_state(engine, flaky)
    assert (state.status, state.attempts, state.smtp_code, state.enhanced_code) == (
        "failed", 2, 550, "5.1.1")
    assert state.last_error == "550 5.1.1 no such user"


def test_an_older_result_arriving_late_does_not_regress_the_row(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    rows = enqueue_and_publish(recorder_settings, engine, "k", [
        "sent@example.com", "retrying@example.com", "failed@example.com"])
    done, waiting, failed = (rows[f"{name}@example.com"] for name in ("sent", "retrying", "failed"))
    produce(recorder_settings, [
        deferred(done, 1), deferred(done, 2, minutes=5), sent(done, 3, minutes=15),
        deferred(done, 1),  # a duplicate of attempt 1 after the delivery
        deferred(done, 3), rejected(done, 4),  # whatever comes after it, sent is never undone
        deferred(waiting, 3, minutes=15), deferred(waiting, 2, minutes=5),
        rejected(failed, 2), deferred(failed, 2), deferred(failed, 1),
    ])
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 11)
    state = row_state(engine, done)
    assert (state.status, state.attempts) == ("sent", 3)
    assert state.sent_at == T0 + dt.timedelta(minutes=15)
    assert state.next_attempt_at is None
    assert state.last_error == "451 4.7.1 greylisted (attempt 2)"
    state = row_state(engine, waiting)
    assert (state.status, state.attempts) == ("retrying", 3)
    assert state.last_error == "451 4.7.1 greylisted (attempt 3)"
    assert state.next_attempt_at == T0 + dt.timedelta(minutes=20)
    state = row_state(engine, failed)
    assert (state.status, state.attempts, state.smtp_code) == ("failed", 2, 550)
    assert state.last_error == "550 5.1.1 no such user"
    assert recorder.stats.ignored == 6


def test_replaying_the_results_topic_gives_the_same_table(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    rows = list(enqueue_and_publish(recorder_settings, engine, "k",
                                    [f"user{i}@example.com" for i in range(6)]).values())
    produce(recorder_settings, [
        deferred(rows[0], 1), sent(rows[0], 2, minutes=5),
        rejected(rows[1], 1),
        deferred(rows[2], 1), deferred(rows[2], 2, minutes=5), deferred(rows[2], 3, minutes=15),
        deferred(rows[3], 1), result(rows[3], DeliveryStatus.DEAD, 2, minutes=5,
                                     error="gave up after 2 attempts: 451 4.7.1 greylisted"),
        sent(rows[4], 1),
        # rows[5] gets no result: it stays published.
    ])
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 9)
    before = snapshot(engine)
    assert [r["status"] for r in before] == [
        "sent", "failed", "retrying", "dead", "sent", "published"]

    replay = dataclasses.replace(recorder_settings,
                                 recorder_group=recorder_settings.recorder_group + "-replay")
    with running(replay, engine) as recorder:
        until_consumed(recorder, 9)
    after = snapshot(engine)
    assert differences(before, after) == {}  # updated_at included: nothing was rewritten
    assert recorder.stats.applied == 0


def test_an_unreadable_result_is_skipped_and_later_ones_still_apply(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    rows = enqueue_and_publish(recorder_settings, engine, "k", ["a@example.com", "b@example.com"])
    first, second = rows["a@example.com"], rows["b@example.com"]
    fingerprint = headers_for(sent(first, 1))
    produce(recorder_settings, [
        sent(first, 1),
        (b"\xff" * 12, fingerprint),  # garbage under today's fingerprint
        (encode(sent(second, 1)), []),  # a result without the schema header
        (encode(sent(second, 1)), [(SCHEMA_HEADER, b"0123456789abcdef")]),  # unknown writer
        (encode(sent(second, 1))[:9], fingerprint),  # truncated
        rejected(second, 1),
    ], key=second.idempotency_key.encode())
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 6)
    assert recorder.stats.unreadable == 4
    state = row_state(engine, second)
    assert (state.status, state.attempts, state.smtp_code) == ("failed", 1, 550)
    assert row_state(engine, first).status == "sent"
    assert recorder.stats.applied == 2


def test_results_that_do_not_fit_their_row_change_nothing(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    """Issue 10: anything on the results topic used to be applied to the row its key named."""
    rows = enqueue_and_publish(recorder_settings, engine, "forged", ["a@example.com",
                                                                      "b@example.com"])
    a, b = rows["a@example.com"], rows["b@example.com"]
    before = snapshot(engine)
    forged = [
        dataclasses.replace(sent(a, 1), outbox_id=b.id),           # another row's id
        dataclasses.replace(sent(a, 1), recipient="eve@evil.example"),
        dataclasses.replace(rejected(a, 1), idempotency_key=b.idempotency_key),
        sent(a, 0),                                                  # no such attempt
        sent(a, 99),                                                 # past the row's tiers
        result(a, DeliveryStatus.RETRYING, 1),                       # retrying, but when?
        dataclasses.replace(sent(a, 1), error="550 but sent?"),
    ]
    produce(recorder_settings, forged)
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, len(forged))
        assert recorder.stats.applied == 0
        # Refused on their own: attempt 0, retrying without a time, sent with an error; the
        # rest name no row consistently, or an attempt past the row's (redrive lets attempts go
        # on past the tiers, so that bound is the row's), and change nothing.
        assert (recorder.stats.refused, recorder.stats.ignored) == (3, 4)
    assert differences(before, snapshot(engine)) == {}
    produce(recorder_settings, [sent(a, 1)])
    with running(recorder_settings, engine) as recorder:
        until(engine, a, lambda state: state.status == "sent", "the genuine result")


def test_one_batch_applies_its_results_in_order(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    """The results of one batch go to the database together, yet each sees what the ones before
    it did: a deferral then a delivery of one row, a late copy of the deferral after them, a
    rejection of a second row, a result for a row that does not exist."""
    rows = enqueue_and_publish(recorder_settings, engine, "batch",
                               ["anna@example.com", "ben@example.com"])
    anna, ben = rows["anna@example.com"], rows["ben@example.com"]
    missing = Row(anna.id + 1000, "nobody|x@example.com", "x@example.com")
    with engine.begin() as conn:
        changed = apply_results(conn, [deferred(anna, 1), sent(anna, 2, minutes=5),
                                       deferred(anna, 1), rejected(ben, 1), sent(missing, 1)],
                                max_attempt=5)
    assert changed == 3
    state = row_state(engine, anna)
    assert (state.status, state.attempts, state.message_id) == ("sent", 2,
                                                                f"<{anna.id}.2@postroom.test>")
    assert state.last_error == "451 4.7.1 greylisted (attempt 1)"
    assert (row_state(engine, ben).status, row_state(engine, ben).smtp_code) == ("failed", 550)
    with engine.begin() as conn:
        assert apply_results(conn, [], max_attempt=5) == 0


# -- hostile results (issue 23): the recorder records what it can and goes on --------------------

def written_as(result: EmailResult, types: dict[str, Any], values: dict[str, Any]) -> bytes:
    """``result``'s bytes under a writer schema whose field types are changed as given (same
    layout on the wire: a string written as bytes, an enum with more symbols) with ``values``,
    so a record under today's fingerprint holds what today's writer cannot write."""
    import io

    import fastavro

    from postroom.schemas.codec import load_schema

    raw = json.loads(load_schema("email_result").text)
    for field in raw["fields"]:
        if field["name"] in types:
            field["type"] = types[field["name"]]
    record = {name: getattr(result, name) for name in (f["name"] for f in raw["fields"])}
    record.update({"status": result.status.value, **values})
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(raw), record)
    return buf.getvalue()


def test_hostile_results_are_recorded_as_far_as_they_can_be_and_the_recorder_goes_on(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    keys = ["nul", "huge", "nul-id", "nul-code", "utf8", "state", "later"]
    rows = enqueue_and_publish(recorder_settings, engine, "hostile",
                               [f"{key}@example.com" for key in keys])
    nul, huge, nul_id, nul_code, utf8, state, later = (rows[f"{k}@example.com"] for k in keys)
    schema = headers_for(EmailResult)
    # One symbol past today's: its index names no status.
    statuses = {"type": "enum", "name": "DeliveryStatus",
                "symbols": [*(status.value for status in DeliveryStatus), "unheard_of"]}
    produce(recorder_settings, [
        dataclasses.replace(rejected(nul, 1), error="550 no\x00such\x00user"),
        dataclasses.replace(rejected(huge, 1), error="550 " + "x" * 300_000),
        dataclasses.replace(sent(nul_id, 1), message_id="<a\x00b@x>"),
        dataclasses.replace(rejected(nul_code, 1), enhanced_code="5.1.1\x00" + "9" * 100),
        (written_as(rejected(utf8, 1), {"error": ["null", "bytes"]},
                    {"error": b"550 \xff\xfe no such user"}), schema),  # invalid UTF-8
        (written_as(sent(state, 1), {"status": statuses}, {"status": "unheard_of"}), schema),
        dataclasses.replace(sent(state, 1), idempotency_key="hostile|\x00@example.com"),
        dataclasses.replace(sent(later, 1), outbox_id=later.id + 10_000),  # no such row
        rejected(later, 1),
    ], key=b"hostile")
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 9)
        assert recorder.is_alive()
    found = row_state(engine, nul)
    assert (found.status, found.last_error) == ("failed", "550 no\\x00such\\x00user")
    found = row_state(engine, huge)
    assert found.status == "failed"
    assert len(found.last_error) == 2000 and found.last_error.endswith("...")
    found = row_state(engine, nul_id)
    assert (found.status, found.message_id) == ("sent", "<a\\x00b@x>")
    found = row_state(engine, nul_code)
    assert found.status == "failed" and found.enhanced_code.startswith("5.1.1\\x00")
    assert len(found.enhanced_code) == 32
    # Unreadable (invalid UTF-8, a status this contract does not know), or naming no row: the
    # rows stay as they were.
    assert row_state(engine, utf8).status == "published"
    assert row_state(engine, state).status == "published"
    assert row_state(engine, later).status == "failed"
    stats = recorder.stats
    assert (stats.applied, stats.unreadable, stats.refused, stats.ignored) == (5, 2, 1, 1)


def test_a_poison_result_ends_a_published_row_and_a_sent_one_of_its_attempt_outranks_it(
        recorder_settings: Settings, engine: sa.Engine) -> None:
    """A record the sender refused at admission publishes a failed result, 'poison: <reason>'
    (engineer C1's sender): its published row ends failed. Should a genuine copy of that
    attempt go out after all, its sent result wins."""
    rows = enqueue_and_publish(recorder_settings, engine, "poison",
                               ["a@example.com", "b@example.com"])
    a, b = rows["a@example.com"], rows["b@example.com"]

    def poison(row: Row) -> EmailResult:
        return result(row, DeliveryStatus.FAILED, 1, error="poison: body is 600000 bytes, over "
                      "the limit of 100000 (POSTROOM_BODY_MAX_BYTES)")

    produce(recorder_settings, [poison(a), poison(b), sent(b, 1, minutes=1), poison(b)])
    with running(recorder_settings, engine) as recorder:
        until_consumed(recorder, 4)
    found = row_state(engine, a)
    assert (found.status, found.attempts) == ("failed", 1)
    assert found.last_error.startswith("poison: body is 600000 bytes")
    found = row_state(engine, b)
    assert (found.status, found.attempts, found.smtp_code) == ("sent", 1, 250)
    # Not a poison refusal: a rejection of the same attempt is not outranked by a late sent.
    with engine.begin() as conn:
        assert apply_results(conn, [rejected(a, 1)], max_attempt=5) == 0
        conn.execute(sa.text("UPDATE outbox SET last_error = '550 no' WHERE id = :id"),
                     {"id": a.id})
        assert apply_results(conn, [sent(a, 1)], max_attempt=5) == 0


def test_a_forged_poison_refusal_neither_jumps_ahead_nor_hides_a_delivery(
        engine: sa.Engine, settings: Settings) -> None:
    """Anyone with produce rights can write garbage under a row's key, row id and a
    postroom.attempt_base of their choosing: the sender refuses it and publishes a poison
    result at that attempt. It must not end the row past its next attempt, and a genuine sent
    of an earlier attempt still wins (review: a forged attempt 5 ended a row the genuine attempt
    1 then delivered, and the sent result was ignored)."""
    rows = enqueue_and_publish(settings, engine, "forged", ["a@example.com", "b@example.com"])
    a, b = rows["a@example.com"], rows["b@example.com"]

    def poison(row: Row, attempt: int) -> EmailResult:
        return result(row, DeliveryStatus.FAILED, attempt, error="poison: cannot decode")

    with engine.begin() as conn:
        assert apply_results(conn, [poison(a, 5)], max_attempt=5) == 0  # past the next attempt
        assert row_state(engine, a).status == "published"
        assert apply_results(conn, [poison(b, 1), deferred(b, 1), sent(b, 2)], max_attempt=5) == 2
    found = row_state(engine, b)
    assert (found.status, found.attempts) == ("sent", 2)
    # The genuine sent comes after a poison refusal of a later attempt: it still wins.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'failed', attempts = 2, "
                             "last_error = 'poison: forged' WHERE id = :id"), {"id": a.id})
        assert apply_results(conn, [sent(a, 1)], max_attempt=5) == 1
    found = row_state(engine, a)
    assert (found.status, found.attempts, found.smtp_code) == ("sent", 1, 250)


def test_a_result_the_database_refuses_is_skipped_and_the_rest_of_its_batch_recorded(
        engine: sa.Engine, settings: Settings) -> None:
    """Whatever a check did not foresee (here a NUL, which the recorder escapes before it gets
    this far): the batch fails on it, then each result is recorded on its own."""
    rows = enqueue_and_publish(settings, engine, "db", ["a@example.com", "b@example.com"])
    a, b = rows["a@example.com"], rows["b@example.com"]
    bad = dataclasses.replace(rejected(a, 1), error="550 \x00")
    with pytest.raises(sa.exc.DataError), engine.begin() as conn:
        apply_results(conn, [bad, sent(b, 1)], max_attempt=5)
    with engine.begin() as conn:
        changed, refused = apply_each(conn, [bad, sent(b, 1)], max_attempt=5)
    assert changed == 1
    assert [(r.idempotency_key, "NUL" in why) for r, why in refused] == [(a.idempotency_key, True)]
    assert row_state(engine, b).status == "sent"
    assert row_state(engine, a).status == "published"


def test_a_database_that_refuses_every_write_holds_the_results_until_it_takes_them(
        engine: sa.Engine, recorder_settings: Settings, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A read-only database (a standby after a failover) refuses every result alike: that is
    the database's fault, not a result's. The batch waits uncommitted and is recorded once a
    recorder can write. Before, each result was refused on its own, counted as unrecordable and
    its offset committed: the row stayed published for good."""
    monkeypatch.setattr(recorder, "RETRY_BACKOFF_S", 0.2)
    caplog.set_level(logging.WARNING, logger="postroom.relay.recorder")
    a = enqueue_and_publish(recorder_settings, engine, "read-only", ["a@example.com"])[
        "a@example.com"]
    with engine.begin() as conn, pytest.raises(sa.exc.DBAPIError) as refused:
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
        apply_each(conn, [sent(a, 1)], max_attempt=5)
    assert refused.value.orig.sqlstate == "25006"  # type: ignore[union-attr]
    produce(recorder_settings, [sent(a, 1)])
    schema = recorder_settings.database_schema
    read_only = sa.create_engine(engine.url, connect_args={
        "options": f"-c search_path={schema} -c default_transaction_read_only=on"})
    try:
        with running(recorder_settings, read_only) as thread:
            def retries() -> int:
                thread.check()
                return sum("retrying in" in r.getMessage() for r in caplog.records
                           if r.name == "postroom.relay.recorder")

            wait_until(lambda: retries() >= 3, WAIT_S, "the batch to be tried three times")
            assert thread.stats.unrecordable == 0
            assert counter(thread.recorder.metrics, "recorder_unrecordable_total") == 0
            assert row_state(engine, a).status == "published"
    finally:
        read_only.dispose()
    with running(recorder_settings, engine) as thread:
        until(engine, a, lambda row: row.status == "sent", "the held result to be recorded")
