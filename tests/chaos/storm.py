"""The poison storm's hostile inputs, drawn from a seeded RNG, and how each must be accounted for:
records on every topic the roles read (values, keys, headers), outbox rows written by SQL, rows
enqueued past the sender's own body cap. The mail server's broken replies are in mailserver.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import struct
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from postroom.devkit.histograms import scrape
from postroom.schemas.codec import DeliveryStatus, EmailRequested, EmailResult, encode
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import headers_for
from postroom.topics import Priority, priority_topic, results_topic, retry_topic

ATTEMPT_BASE = "postroom.attempt_base"
ROW_ID = "postroom.row_id"
SCHEMA = "postroom.schema"
# Header values that str.isdigit() takes and int() refuses, or that no writer of ours writes.
HOSTILE_NUMBERS: tuple[bytes, ...] = (
    "²".encode(), b"9" * 5000, b"\x00", b"\xff\xfe", b"-1", b"", b"1e9", b" 3", "٣".encode())
HOSTILE_KEYS: tuple[bytes | None, ...] = (
    None, b"", b"\xff\xfe\xfd", b"a\x00b", b"k" * 100_000, b"line\nbreak")
OVERSIZE_BYTES = 850 * 1024  # over the event cap plus headers (800 KiB), under the broker's 1 MB
PLACE = "QQQQ"  # replaced in encoded Avro by bytes no encoder writes


@dataclasses.dataclass(frozen=True)
class HostileRecord:
    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclasses.dataclass(frozen=True)
class HostileRow:
    """An outbox row written by SQL: its columns (SQL expressions) and what it holds."""

    kind: str
    columns: dict[str, str]


def _event(tag: str, n: int, **changes: Any) -> EmailRequested:
    event = EmailRequested(
        idempotency_key=f"{tag}-hostile-{n}|hostile-{n}@example.com", message_key=f"{tag}-hostile",
        outbox_id=900_000_000 + n, recipient=f"hostile-{tag}-{n}@example.com",
        sender="reports@example.com", subject="hostile", body="hostile",
        attachments=(), priority="normal", created_at=dt.datetime.now(dt.UTC), attempt=1)
    return dataclasses.replace(event, **changes)


def _result(tag: str, n: int, **changes: Any) -> EmailResult:
    result = EmailResult(
        idempotency_key=f"{tag}-noone-{n}|noone-{n}@example.com", outbox_id=910_000_000 + n,
        recipient=f"noone-{tag}-{n}@example.com", status=DeliveryStatus.FAILED, attempt=1,
        occurred_at=dt.datetime.now(dt.UTC), smtp_code=550, enhanced_code="5.1.1",
        error="550 5.1.1 User unknown")
    return dataclasses.replace(result, **changes)


def _garbled(encoded: bytes, raw: bytes) -> bytes:
    """``encoded`` with the placeholder replaced by ``raw`` of the same length (an Avro string
    whose bytes are not UTF-8, or a lone surrogate, which no encoder writes)."""
    assert len(raw) == len(PLACE)
    return encoded.replace(PLACE.encode(), raw, 1)


GARBLE = (b"\xff\xfe\xfd\xfc", b"\xed\xa0\x80x", b"\xc3(\x00x")


def event_values(rng: random.Random, tag: str, n: int) -> tuple[str, bytes, list[tuple[str, bytes | None]]]:
    """A hostile event value with its schema header: bytes, a cut event, or an event the rules
    refuse (every one names a recipient ``hostile-...``: one the server accepts is a finding)."""
    schema = headers_for(EmailRequested)
    ok = encode(_event(tag, n))
    choices: list[tuple[str, Any]] = [
        ("random bytes", lambda: os.urandom(rng.randrange(0, 3000))),
        ("truncated avro", lambda: ok[:rng.randrange(0, len(ok))]),
        ("avro + trailing bytes", lambda: ok + b"\x00\xff" * rng.randrange(1, 50)),
        ("attempt 0", lambda: encode(_event(tag, n, attempt=0))),
        ("attempt 2^31-1", lambda: encode(_event(tag, n, attempt=(1 << 31) - 1))),
        ("attempt -7", lambda: encode(_event(tag, n, attempt=-7))),
        ("recipient without @", lambda: encode(_event(tag, n, recipient=f"hostile-{n}"))),
        ("recipient with NUL", lambda: encode(_event(tag, n,
                                                     recipient=f"hostile-{n}\x00@example.com"))),
        ("subject with CRLF", lambda: encode(_event(tag, n, subject="x\r\nBcc: a@example.com"))),
        ("body with NUL", lambda: encode(_event(tag, n, body="a\x00b"))),
        ("empty idempotency key", lambda: encode(_event(tag, n, idempotency_key=""))),
        ("attachment on /proc", lambda: encode(_event(tag, n, attachments=("/proc/self/environ",)))),
        ("attachment '..'", lambda: encode(_event(tag, n, attachments=("a/..",)))),
        ("101 attachments", lambda: encode(_event(tag, n, attachments=("files/x",) * 101))),
        ("priority and time far", lambda: encode(_event(
            tag, n, recipient="", created_at=dt.datetime(9999, 12, 31, tzinfo=dt.UTC)))),
        ("recipient not UTF-8", lambda: _garbled(encode(_event(
            tag, n, recipient=f"hostile-{PLACE}-{n}@example.com")), rng.choice(GARBLE))),
        ("key not UTF-8", lambda: _garbled(encode(_event(
            tag, n, idempotency_key=f"{tag}-{PLACE}-{n}")), rng.choice(GARBLE))),
        ("unknown schema fingerprint", lambda: ok),
        ("confluent framing, unknown id", lambda: b"\x00" + struct.pack(">I", 987_654) + ok),
        ("oversize", lambda: os.urandom(OVERSIZE_BYTES)),
    ]
    kind, make = rng.choice(choices)
    value: bytes = make()
    headers: list[tuple[str, bytes | None]] = list(schema)
    if kind == "unknown schema fingerprint":
        headers = [(SCHEMA, rng.choice([b"0" * 16, b"\x00" * 16, b"zz", b"f" * 10_000]))]
    elif kind.startswith("confluent"):
        headers = []
    return kind, value, headers


def forged_headers(rng: random.Random, tag: str, n: int,
                   ) -> tuple[str, bytes, list[tuple[str, bytes | None]]]:
    """A valid event made hostile by its headers alone: an attempt base or row id no writer of
    ours writes, or an attempt base its attempt does not fit."""
    value = encode(_event(tag, n))
    headers: list[tuple[str, bytes | None]] = list(headers_for(EmailRequested))
    which = rng.choice([ATTEMPT_BASE, ROW_ID, "fit"])
    if which == "fit":
        headers.append((ATTEMPT_BASE, b"3"))  # attempt 1 is below 4..8
        return "attempt below its attempt base", value, headers
    bad = rng.choice(HOSTILE_NUMBERS)
    if rng.random() < 0.3:
        headers.append((which, b"1"))  # repeated: the last one counts
    headers.append((which, bad))
    return f"{which}={bad[:12]!r}", value, headers


def sender_records(rng: random.Random, tag: str, start: int, count: int,
                   topics: list[str]) -> list[HostileRecord]:
    out = []
    for n in range(start, start + count):
        topic = rng.choice(topics)
        if rng.random() < 0.35:
            kind, value, headers = forged_headers(rng, tag, n)
        else:
            kind, value, headers = event_values(rng, tag, n)
        key: bytes | None = f"{tag}-hostile-{n}".encode()
        if rng.random() < 0.3:
            key = rng.choice(HOSTILE_KEYS)
            kind += f", key {'none' if key is None else repr(key[:8])}"
        if rng.random() < 0.1:
            headers.append(("x-junk", rng.choice([None, b"\x00\xff", b"j" * 20_000])))
        out.append(HostileRecord(kind, topic, key, value, headers))
    return out


def result_records(rng: random.Random, tag: str, start: int, count: int,
                   topic: str) -> list[HostileRecord]:
    """Hostile results: unreadable ones, and readable ones that name no row or hold what a row
    cannot (NUL, 100 KB of error, lone surrogates) or whose fields do not fit together."""
    schema = headers_for(EmailResult)
    out = []
    for n in range(start, start + count):
        ok = encode(_result(tag, n))
        choices: list[tuple[str, Any]] = [
            ("random bytes", lambda: os.urandom(rng.randrange(0, 2000))),
            ("truncated avro", lambda ok=ok: ok[:rng.randrange(0, len(ok))]),
            ("NUL in error", lambda n=n: encode(_result(tag, n, error="bad\x00reply"))),
            ("NUL in key", lambda n=n: encode(_result(tag, n, idempotency_key="k\x00|x@e.com"))),
            ("NUL in message id", lambda n=n: encode(_result(
                tag, n, status=DeliveryStatus.SENT, error=None, message_id="<a\x00@b>"))),
            ("100 KB error", lambda n=n: encode(_result(tag, n, error="e" * 100_000))),
            ("5,000-char enhanced code", lambda n=n: encode(_result(tag, n,
                                                                    enhanced_code="5" * 5000))),
            ("attempt 0", lambda n=n: encode(_result(tag, n, attempt=0))),
            ("attempt 2^31-1", lambda n=n: encode(_result(tag, n, attempt=(1 << 31) - 1))),
            ("outbox id -1", lambda n=n: encode(_result(tag, n, outbox_id=-1))),
            ("sent with an error", lambda n=n: encode(_result(tag, n, status=DeliveryStatus.SENT))),
            ("retrying without a time", lambda n=n: encode(_result(
                tag, n, status=DeliveryStatus.RETRYING))),
            ("year 9999", lambda n=n: encode(_result(
                tag, n, occurred_at=dt.datetime(9999, 12, 31, tzinfo=dt.UTC)))),
            ("error not UTF-8", lambda n=n: _garbled(encode(_result(
                tag, n, error=f"x{PLACE}x")), rng.choice(GARBLE))),
            ("key a lone surrogate", lambda n=n: _garbled(encode(_result(
                tag, n, idempotency_key=f"{PLACE}|x@example.com")), b"\xed\xa0\x80x")),
            ("unknown schema fingerprint", lambda ok=ok: ok),
            ("confluent framing, unknown id", lambda ok=ok: b"\x00" + struct.pack(">I", 987_655)
             + ok),
        ]
        kind, make = rng.choice(choices)
        headers: list[tuple[str, bytes | None]] = list(schema)
        if kind == "unknown schema fingerprint":
            headers = [(SCHEMA, rng.choice([b"1" * 16, b"\xff" * 16]))]
        elif kind.startswith("confluent"):
            headers = []
        key = rng.choice([None, b"\xff\xfe", f"{tag}-noone-{n}".encode(), b"r" * 50_000])
        out.append(HostileRecord(kind, topic, key, make(), headers))
    return out


def sender_topics_of(prefix: str, tiers: int) -> list[str]:
    return [*(priority_topic(prefix, p) for p in Priority),
            *(retry_topic(prefix, n) for n in range(1, tiers + 1))]


def storm_records(rng: random.Random, tag: str, prefix: str, tiers: int, start: int,
                  per_round: int) -> list[HostileRecord]:
    """One round: ``per_round`` records on the sender's topics and a third as many results."""
    return [*sender_records(rng, tag, start, per_round, sender_topics_of(prefix, tiers)),
            *result_records(rng, tag, start + per_round, max(1, per_round // 3),
                            results_topic(prefix))]


def result_readable(record: HostileRecord) -> bool | None:
    """Whether the recorder can decode ``record`` without a registry: True, False, or None when
    it would wait for a registry (which this suite does not run)."""
    from postroom.schemas.errors import SchemaUnavailableError
    try:
        decode(EmailResult, record.value, record.headers)
    except SchemaUnavailableError:
        return None
    except SchemaError:
        return False
    return True


def hostile_rows(tag: str) -> list[HostileRow]:
    """Rows no enqueue writes, as a job's SQL can: each must end failed (or dead) with why."""
    def row(n: int, kind: str, **cols: str) -> HostileRow:
        base = {"idempotency_key": f"'{tag}-row-{n}|row-{n}@example.com'",
                "message_key": f"'{tag}-rows'", "recipient": f"'row-{tag}-{n}@example.com'",
                "subject": "'hostile row'", "body": "'hostile row'", "priority": "'normal'"}
        return HostileRow(kind, {**base, **cols})
    return [
        row(0, "attachments holding NULL", attachments="ARRAY[NULL]::text[]"),
        row(1, "inline holding NULL", inline="ARRAY['a.png', NULL]::text[]"),
        row(2, "attachments two-dimensional", attachments="'{{a,b},{c,d}}'::text[]"),
        row(3, "created_at infinity", created_at="'infinity'"),
        row(4, "created_at -infinity", created_at="'-infinity'"),
        row(5, "attempts at the int limit", attempts="2147483647"),
        row(6, "attempts negative", attempts="-5"),
        row(7, "recipient without @", recipient="'no-at-sign'"),
        row(8, "recipient 300 characters", recipient="repeat('r', 288) || '@example.com'"),
        row(9, "subject with CRLF", subject="E'Report\\r\\nBcc: x@example.com'"),
        row(10, "body of 600,000 bytes, over every cap", body="repeat('b', 600000)"),
        row(11, "idempotency key with a control character", idempotency_key=f"E'{tag}-\\x01k'"),
        row(12, "message key 3,000 characters", message_key="repeat('m', 3000)"),
        row(13, "sender not an address", sender="'not an address'"),
        row(14, "attachment on /proc", attachments="ARRAY['/proc/self/environ']"),
        row(15, "101 attachments", attachments="array_fill('/tmp/a'::text, ARRAY[101])"),
        row(16, "HTML past the event cap", html="repeat('<p>', 300000)"),
        row(17, "attachment path empty", attachments="ARRAY['']"),
        row(18, "recipient empty", recipient="''"),
        row(19, "subject 5,000 characters", subject="repeat('s', 5000)"),
        row(20, "attempts 2147483646 (the next attempt at the limit)", attempts="2147483646"),
        row(21, "inline two-dimensional", inline="'{{a.png},{b.png}}'::text[]"),
    ]


def counters(port: int) -> dict[str, float]:
    """Every counter a role serves, summed over its labels, by its exported name less the
    postroom_ prefix (the parser names a counter's family without its _total)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(scrape(port)):
        if family.type != "counter":
            continue
        name = family.name.removeprefix("postroom_") + "_total"
        totals[name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def odd_rows(tag: str) -> list[tuple[str, dict[str, str]]]:
    """Rows written by SQL that are odd but valid: each must be delivered once, like the feed."""
    def row(n: int, **cols: str) -> tuple[str, dict[str, str]]:
        rcpt = f"accept-odd{tag}-{n}@example.com"
        base = {"idempotency_key": f"'{tag}-odd-{n}|{rcpt}'", "message_key": f"'{tag}-odd'",
                "recipient": f"'{rcpt}'", "subject": "'odd'", "body": "'odd'",
                "priority": "'normal'"}
        return rcpt, {**base, **cols}
    return [
        row(0, subject="'Ünïcødé ✉ ' || repeat('ß', 400)"),
        row(1, body="E'.\\r\\n..\\r\\n.\\n\\n.'"),
        row(2, sender="NULL", html="''"),
        row(3, priority="'high'", message_key="repeat('k', 1000)"),
        row(4, priority="'low'", body="repeat('long line ', 9000)"),  # one 90 KB line
        row(5, subject="'\t tab and spaces  '", html="'<p>x</p>'"),
    ]


# Sender-only settings of the storm: a body cap below enqueue's default, so a row enqueue takes
# (as README shows it, with the default cap) is refused by the sender (issue 23).
SENDER_BODY_MAX_BYTES = 100_000
CAPPED_BODY_CHARS = 200_000


@dataclasses.dataclass(frozen=True)
class Injected:
    record: HostileRecord
    partition: int
    offset: int


@dataclasses.dataclass
class Storm:
    """What one poison storm injected, and the checks of how each input was accounted for."""

    records: list[Injected] = dataclasses.field(default_factory=list)
    produce_errors: list[str] = dataclasses.field(default_factory=list)
    rows: dict[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)

    def write_rows(self, run: Any) -> None:
        """The hostile rows, the odd valid ones and the rows past the sender's cap."""
        import sqlalchemy as sa

        from chaos.harness import expected_status
        from postroom import enqueue
        rows = hostile_rows(run.tag)
        # The first two in one transaction, so that one claim likely holds them alone: a
        # batch of only refused rows, one of them too large (the relay exited on it, 19:46).
        for group in [[rows[16], rows[0]], *([r] for n, r in enumerate(rows) if n not in (0, 16))]:
            with run.engine.begin() as conn:
                for hostile in group:
                    names = ", ".join(hostile.columns)
                    values = ", ".join(hostile.columns.values())
                    row_id = conn.execute(sa.text(
                        f"INSERT INTO outbox ({names}) VALUES ({values}) RETURNING id")
                    ).scalar_one()
                    run.hostile_rows[row_id] = hostile.kind
        for rcpt, cols in odd_rows(run.tag):
            run.expected[rcpt] = expected_status(rcpt)
            with run.engine.begin() as conn:
                conn.execute(sa.text(f"INSERT INTO outbox ({', '.join(cols)}) "
                                     f"VALUES ({', '.join(cols.values())})"))
        capped = [f"capped-{run.tag}-{n}@example.com" for n in range(3)]
        with run.engine.begin() as conn:
            enqueue(conn, key=f"{run.tag}-capped", recipients=capped, subject="Report",
                    body="c" * CAPPED_BODY_CHARS)
        for (row_id,) in run.query("SELECT id FROM outbox WHERE message_key = :k",
                                   k=f"{run.tag}-capped"):
            run.hostile_rows[row_id] = "body over the sender's cap, under enqueue's (enqueue)"

    def forged(self, run: Any, rng: random.Random, count: int) -> list[HostileRecord]:
        """Unreadable records under the key and row id of genuine rows still in flight (what a
        corrupted copy, or a forgery, of the relay's record looks like): the genuine record still
        comes, so each row must still end as its input says (a sent result outranks a poison
        refusal of its attempt)."""
        rows = run.query("SELECT id, idempotency_key FROM outbox WHERE status IN "
                         "('published', 'retrying') AND NOT id = ANY(:ids) ORDER BY id LIMIT 200",
                         ids=list(run.hostile_rows))
        topic = priority_topic(run.settings.topic_prefix, Priority.NORMAL)
        return [HostileRecord("a genuine row's key over random bytes", topic,
                              row.idempotency_key.encode(), os.urandom(rng.randrange(1, 200)),
                              [(SCHEMA, headers_for(EmailRequested)[0][1]),
                               (ROW_ID, str(row.id).encode())])
                for row in rng.sample(rows, min(count, len(rows)))]

    def foreign(self, run: Any, rng: random.Random, start: int, count: int) -> None:
        """Records whose header names are not UTF-8, as a Go or C producer may write them
        (confluent-kafka's Python producer cannot: support.foreign drives librdkafka itself),
        on the high and low topics, which only the storm writes while it runs: each one's offset
        is found by reading back the end of its partition for its key."""
        from confluent_kafka import Consumer, TopicPartition

        from support.foreign import produce_raw
        fingerprint = headers_for(EmailRequested)[0][1]
        names = [b"\xff\xfe\xfd", b"postroom.row_id\xff", b"x\xc3(", b"\xed\xa0\x80"]
        consumer = Consumer({**run.settings.kafka_client_config(), "group.id": f"storm-{run.tag}",
                             "enable.auto.commit": False})
        try:
            for n in range(start, start + count):
                topic = priority_topic(run.settings.topic_prefix,
                                       rng.choice([Priority.HIGH, Priority.LOW]))
                partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
                partition = rng.choice(sorted(partitions))
                key = f"{run.tag}-foreign-{n}".encode()
                value = encode(_event(run.tag, n))
                headers = [(rng.choice(names), b"1"), (SCHEMA.encode(), fingerprint)]
                produce_raw(run.settings, topic, partition, key, value, headers)
                offset = self._offset_of(consumer, TopicPartition(topic, partition), key)
                shown = [(name.decode(errors="replace"), v) for name, v in headers]
                record = HostileRecord(f"header name {headers[0][0]!r}", topic, key, value,
                                       list(shown))
                if offset is None:
                    self.produce_errors.append(f"{record.kind}: not found on {topic}[{partition}]")
                else:
                    self.records.append(Injected(record, partition, offset))
        finally:
            consumer.close()

    @staticmethod
    def _offset_of(consumer: Any, tp: Any, key: bytes) -> int | None:
        from confluent_kafka import TopicPartition
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(tp.topic, tp.partition, max(low, high - 50))])
        found = None
        while True:
            msg = consumer.poll(5)
            if msg is None:
                return found
            if msg.error() is None and msg.key() == key:
                found = msg.offset()
            if msg.offset() + 1 >= high:
                return found

    def cross_framed(self, run: Any, rng: random.Random, count: int) -> list[HostileRecord]:
        """With a registry: a valid event framed with the id the registry holds for the results
        schema, and a valid result framed with the event schema's id (a writer that took the
        wrong subject). None without a registry."""
        url = run.settings.schema_registry_url
        if not url:
            return []
        from postroom.topics import value_subject
        from support.registry import client
        prefix = run.settings.topic_prefix
        with client(url) as registry:
            result_id = registry.get_latest_version(
                value_subject(results_topic(prefix))).schema_id
            event_id = registry.get_latest_version(
                value_subject(priority_topic(prefix, Priority.NORMAL))).schema_id
        out = []
        for _ in range(count):
            n = rng.randrange(1 << 30)
            out.append(HostileRecord(
                "the results schema's id on an event", rng.choice(sender_topics_of(prefix, 4)),
                f"{run.tag}-cross-{n}".encode(),
                b"\x00" + struct.pack(">I", result_id) + encode(_event(run.tag, n)), []))
            out.append(HostileRecord(
                "the event schema's id on a result", results_topic(prefix), None,
                b"\x00" + struct.pack(">I", event_id) + encode(_result(run.tag, n)), []))
        return out

    def produce(self, run: Any, records: list[HostileRecord]) -> None:
        from confluent_kafka import KafkaError, Message, Producer
        producer = Producer({**run.settings.kafka_client_config(), "linger.ms": 5})

        def on_delivery(record: HostileRecord) -> Any:
            def done(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    self.produce_errors.append(f"{record.kind} on {record.topic}: {err}")
                else:
                    self.records.append(Injected(record, msg.partition() or 0, msg.offset() or 0))
            return done
        for record in records:
            producer.produce(record.topic, key=record.key, value=record.value,
                             headers=record.headers, on_delivery=on_delivery(record))
            producer.poll(0)
        assert producer.flush(30) == 0


FINAL = ("sent", "failed", "dead")
SETTLE_S = 20.0  # after the known input drained: for the hostile rows to end, and the lag to go


def lag(run: Any) -> dict[str, int]:
    """Records each group has not committed, per partition it reads (only those behind)."""
    from confluent_kafka import Consumer, TopicPartition

    from chaos.harness import TIERS
    prefix = run.settings.topic_prefix
    behind: dict[str, int] = {}
    for group, topics in ((run.settings.sender_group, sender_topics_of(prefix, TIERS)),
                          (run.settings.recorder_group, [results_topic(prefix)])):
        consumer = Consumer({**run.settings.kafka_client_config(), "group.id": group,
                             "enable.auto.commit": False})
        try:
            metadata = consumer.list_topics(timeout=30)
            tps = [TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions]
            for tp in consumer.committed(tps, timeout=30):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=30)
                position = tp.offset if tp.offset >= 0 else low
                if high > position:
                    behind[f"{group} {tp.topic}[{tp.partition}]"] = high - position
        finally:
            consumer.close()
    return behind


def _short(text: object, chars: int = 160) -> str:
    shown = repr(text)
    return shown if len(shown) <= chars else shown[:chars] + "..."


def before_stop(run: Any) -> list[str]:
    """While the roles still run: every hostile row final with a reason, every group's lag back
    to 0, and each role's counters scraped."""
    import time
    problems: list[str] = []
    ids = list(run.hostile_rows)
    deadline = time.monotonic() + SETTLE_S
    while True:
        rows = run.query("SELECT id, status, last_error FROM outbox WHERE id = ANY(:ids)", ids=ids)
        if all(r.status in FINAL for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    run.storm.rows = {run.hostile_rows[r.id]: (r.status, _short(r.last_error, 90)) for r in rows}
    for r in rows:
        kind = run.hostile_rows[r.id]
        if r.status not in ("failed", "dead"):
            problems.append(f"hostile row {r.id} ({kind}) is {r.status} {SETTLE_S:.0f} s after "
                            f"the input drained (last_error {_short(r.last_error)})")
        elif not r.last_error:
            problems.append(f"hostile row {r.id} ({kind}) is {r.status} without a reason")
    while True:
        behind = lag(run)
        if not behind or time.monotonic() > deadline + SETTLE_S / 2:
            break
        time.sleep(1.0)
    if behind:
        problems.append(f"lag not back to 0: {sorted(behind.items())[:8]}")
    for name, role in run.roles.items():
        if role.metrics_port is not None and role.proc is not None and role.proc.poll() is None:
            try:
                run.counters[name] = counters(role.metrics_port)
            except OSError as exc:
                problems.append(f"{name}: /metrics did not answer ({exc})")
    return problems


def after_stop(run: Any) -> list[str]:
    """After SIGTERM: every hostile record dead-lettered, none reached the server, the counters
    count them, no role started twice or logged a traceback. Prints what the storm injected."""
    from collections import Counter

    from chaos.checks import read_topic
    from postroom.headers import (
        DLQ_CLASS_HEADER,
        DLQ_OFFSET_HEADER,
        DLQ_PARTITION_HEADER,
        DLQ_TOPIC_HEADER,
    )
    from postroom.relay.results import result_problem
    from postroom.topics import dead_letter_topic
    storm: Storm = run.storm
    prefix = run.settings.topic_prefix
    problems = list(storm.produce_errors)
    letters: dict[tuple[bytes | None, ...], list[bytes | None]] = {}
    for msg in read_topic(run, dead_letter_topic(prefix)):
        headers = dict(msg.headers() or [])
        origin = (headers.get(DLQ_TOPIC_HEADER), headers.get(DLQ_PARTITION_HEADER),
                  headers.get(DLQ_OFFSET_HEADER))
        letters.setdefault(origin, []).append(headers.get(DLQ_CLASS_HEADER))
    results = results_topic(prefix)
    on_sender = [i for i in storm.records if i.record.topic != results]
    on_results = [i for i in storm.records if i.record.topic == results]
    classes: Counter[str] = Counter()
    twice = 0
    for inj in on_sender:
        got = letters.get((inj.record.topic.encode(), str(inj.partition).encode(),
                           str(inj.offset).encode()))
        if not got:
            problems.append(f"not dead-lettered: {inj.record.kind} at {inj.record.topic}"
                            f"[{inj.partition}]@{inj.offset}")
            continue
        if len(got) > 1:
            # Read again after a rebalance or a kill, a poison record finds its origin done
            # in the ledger: one dead letter each (issue 46).
            twice += 1
            problems.append(f"dead-lettered {len(got)} times: {inj.record.kind} at "
                            f"{inj.record.topic}[{inj.partition}]@{inj.offset}")
        classes.update((c or b"?").decode(errors="replace") for c in got)
    reached = sorted({r.rcpt for r in run.mail.replies if r.rcpt.startswith("hostile-")})
    if reached:
        problems.append(f"hostile records reached the mail server: {reached[:5]}")
    unreadable = sum(result_readable(i.record) is False for i in on_results)
    waiting = [i.record.kind for i in on_results if result_readable(i.record) is None]
    refused = 0
    for inj in on_results:
        if result_readable(inj.record):
            refused += result_problem(decode(EmailResult, inj.record.value,
                                             inj.record.headers)) is not None
    recorder = run.counters.get("recorder", {})
    if recorder.get("recorder_unreadable_total", 0) != unreadable + len(waiting):
        problems.append(f"recorder_unreadable_total {recorder.get('recorder_unreadable_total')}, "
                        f"but {unreadable} unreadable results and {len(waiting)} framed for a "
                        "registry the suite does not run were written")
    if recorder.get("recorder_refused_total", 0) < refused:
        problems.append(f"recorder_refused_total {recorder.get('recorder_refused_total')}, "
                        f"below the {refused} results written whose fields do not fit")
    poison = sum(run.counters.get(n, {}).get("poison_total", 0) for n in ("sender1", "sender2"))
    capped = sum(k.endswith("(enqueue)") for k in run.hostile_rows.values())
    if poison < len(on_sender) + capped:
        problems.append(f"poison_total {poison:.0f} over both senders, below the "
                        f"{len(on_sender)} hostile records and {capped} capped rows")
    for name, role in run.roles.items():
        if role.starts != 1:
            problems.append(f"{name} was started {role.starts} times")
    longest: dict[str, int] = {}
    for log in sorted(run.log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        longest[log.stem] = max((len(line) for line in text.splitlines()), default=0)
        if "Traceback" in text:
            at = text.index("Traceback")
            problems.append(f"{log.name}: a traceback: {_short(text[at:at + 1500], 1500)}")
    kinds = Counter(i.record.kind.split(", key")[0] for i in storm.records)
    relay = run.counters.get("relay", {})
    print(f"poison storm: {len(on_sender)} hostile records on the sender's topics "
          f"(dead-lettered as {dict(classes)}, {twice} twice), {len(on_results)} on the results "
          f"topic ({unreadable} unreadable, {len(waiting)} registry-framed, {refused} refused); "
          f"{len(run.hostile_rows)} hostile rows; counters: senders poison_total {poison:.0f}, "
          f"relay_poison_total {relay.get('relay_poison_total', 0):.0f}, recorder "
          f"{ {k: v for k, v in recorder.items() if k.startswith('recorder_')} }; "
          f"longest log line per role {longest}; kinds {dict(kinds)}; rows {storm.rows}",
          flush=True)
    return problems
