"""postroom against a real Schema Registry (the local stack's Apicurio, over HTTP): registering the
contract, the Confluent wire format on every topic, records of both framings read side by side,
and postroom's records read by confluent-kafka's own deserializer, as a foreign consumer would."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import support.registry
from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.lag import LagReader, postroom_groups
from postroom.relay.publisher import Relay
from postroom.schemas.codec import EmailRequested, encode, load_schema
from postroom.schemas.framing import SCHEMA_HEADER, headers_for
from postroom.schemas.registry import (
    Registry,
    RegistryError,
    check_registry,
    framing_for,
    register_contract,
)
from postroom.settings import Settings, TlsMode
from postroom.topics import (
    priority_topic,
    results_topic,
    retry_topic,
    topic_schemas,
    value_subject,
)
from support.pipeline import Pipeline, outbox_rows
from support.rounds import publish_round

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def registry_url() -> str:
    return support.registry.registry_url()


def with_registry(settings: Settings, url: str) -> Settings:
    return dataclasses.replace(settings, schema_registry_url=url)


@pytest.fixture
def registry_settings(kafka_settings: Settings, registry_url: str) -> Iterator[Settings]:
    """This test's own topics, hence its own subjects; they are deleted afterwards."""
    settings = with_registry(kafka_settings, registry_url)
    yield settings
    support.registry.delete_subjects(registry_url, settings)


def foreign_read(url: str, topic: str, value: bytes) -> dict[str, Any]:
    """What a consumer with confluent-kafka's AvroDeserializer and no postroom code reads."""
    with support.registry.client(url) as client:
        record = AvroDeserializer(client)(value, SerializationContext(topic, MessageField.VALUE))
    assert isinstance(record, dict)
    return record


def test_register_is_idempotent_and_sets_the_compatibility(registry_settings: Settings) -> None:
    with pytest.raises(RegistryError, match="run `postroom schemas register`"):
        check_registry(registry_settings)

    first = register_contract(registry_settings, "BACKWARD")
    again = register_contract(registry_settings, "BACKWARD")

    topics = topic_schemas(registry_settings.topic_prefix, len(registry_settings.retry_delays_s))
    assert [d.subject for d in first] == [value_subject(t) for t in topics]
    assert all(d.new for d in first)
    assert [d.schema_name for d in first] == list(topics.values())
    assert not any(d.new for d in again)
    assert [(d.schema_id, d.version) for d in again] == [(d.schema_id, d.version) for d in first]
    registry = Registry(registry_settings)
    assert {registry.compatibility(d.subject) for d in first} == {"BACKWARD"}
    assert "all 9 subjects hold today's contract (compatibility BACKWARD)" in check_registry(
        registry_settings)


def test_a_registry_that_never_answers_is_an_error_not_a_hang(kafka_settings: Settings) -> None:
    """A registry that takes the connection and says nothing (a stalled JVM, a half-open proxy):
    each request gives up after the timeout, is retried, and then names the registry. Without a
    timeout the client would wait for ever, and so would the relay starting on it."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        settings = dataclasses.replace(
            kafka_settings, schema_registry_url=f"http://127.0.0.1:{port}",
            schema_registry_config={"timeout": 0.3, "max.retries": 1, "retries.wait.ms": 10})
        with pytest.raises(RegistryError, match=rf"no answer from the schema registry at "
                                                rf"http://127.0.0.1:{port}: ReadTimeout"):
            Registry(settings).subjects()
        accepted = 0
        silent.settimeout(0)
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = silent.accept()
                conn.close()
                accepted += 1
    assert accepted == 2, "one request and one retry"


def test_a_schema_the_rule_rejects_is_refused_with_the_registrys_message(
        registry_settings: Settings, tmp_path: Path) -> None:
    register_contract(registry_settings)
    for name in ("email_requested", "email_result"):
        raw = json.loads(load_schema(name).text)
        if name == "email_requested":
            # a new field without a default: today's records could not be read with it
            raw["fields"].append({"name": "cost_centre", "type": "string"})
        (tmp_path / f"{name}.avsc").write_text(json.dumps(raw))

    with pytest.raises(RegistryError) as refused:
        register_contract(registry_settings, schema_dir=tmp_path)

    assert refused.value.status == 409
    message = str(refused.value)
    assert "the registry refused email_requested.avsc under" in message
    assert "Incompatible" in message  # Apicurio's own words
    assert "cost_centre" in message


def test_our_bytes_are_the_avro_serializers(registry_settings: Settings, registry_url: str) -> None:
    """The relay keeps its fast writer and only prefixes the id: the same bytes confluent-kafka's
    AvroSerializer writes (topic subject strategy, no auto-registration)."""
    register_contract(registry_settings)
    framing = framing_for(registry_settings)
    topic = priority_topic(registry_settings.topic_prefix, "normal")
    event = EmailRequested(
        idempotency_key="k|anna@example.com", message_key="k", outbox_id=12,
        recipient="anna@example.com", sender="reports@example.com", subject="Umsätze 📈",
        body="Hallo", attachments=("/srv/a.xlsx",), priority="normal",
        created_at=dt.datetime(2026, 9, 30, tzinfo=dt.UTC))
    with support.registry.client(registry_url) as client:
        serializer = AvroSerializer(client, load_schema("email_requested").text,
                                    conf={"auto.register.schemas": False,
                                          "subject.name.strategy.type": "TOPIC"})
        theirs = serializer({**dataclasses.asdict(event), "attachments": list(event.attachments)},
                            SerializationContext(topic, MessageField.VALUE))

    ours, headers = framing.frame(topic, event)

    assert ours == theirs
    assert headers == []


def test_the_pipeline_on_a_registry_reads_both_framings(
        registry_settings: Settings, db_settings: Settings, registry_url: str,
        consume: Callable[..., Any]) -> None:
    """A platform moving to the registry: a schemaless record written before the switch and
    framed ones after it are all delivered; every record postroom writes is framed, and a
    foreign consumer reads them."""
    from postroom.relay.db import make_engine

    settings = dataclasses.replace(registry_settings, database_schema=db_settings.database_schema)
    prefix = settings.topic_prefix
    register_contract(settings)
    engine = make_engine(settings)
    server = DevSmtpServer(port=0)
    server.start()
    try:
        # written by a relay of the previous release: schemaless, with the fingerprint header
        old = EmailRequested(
            idempotency_key="old|o@example.com", message_key="old", outbox_id=0,
            recipient="o@example.com", sender="reports@example.com", subject="Old", body="b",
            attachments=(), priority="normal",
            created_at=dt.datetime(2026, 9, 1, tzinfo=dt.UTC))
        producer = Producer(settings.kafka_client_config())
        producer.produce(priority_topic(prefix, "normal"), key=old.idempotency_key.encode(),
                         value=encode(old), headers=headers_for(old))
        assert producer.flush(10) == 0
        with engine.begin() as conn:
            enqueue(conn, key="new", recipients=["a@example.com", "b@example.com"],
                    subject="New", body="b")
        assert publish_round(Relay(settings, engine)) == 2

        smtp = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                                   smtp_tls=TlsMode.NONE)
        pipeline = Pipeline(smtp, engine).start()
        try:
            wait_until(lambda: all(r.status == "sent" for r in outbox_rows(engine, "new")), 60,
                     "both new emails to be recorded as sent")
            wait_until(lambda: len(server.messages) >= 3, 30, "all three emails at the server")
            requested = consume(settings, [priority_topic(prefix, "normal")], expected=3)
            results = consume(settings, [results_topic(prefix)], expected=3)
        finally:
            pipeline.stop()
    finally:
        server.stop()
        engine.dispose()

    assert sorted(m.rcpt for m in server.messages) == ["a@example.com", "b@example.com",
                                                       "o@example.com"]
    framed = [r for r in requested if SCHEMA_HEADER not in dict(r.headers)]
    assert len(framed) == 2 and all(r.value[:1] == b"\x00" for r in framed)
    for record in framed:
        seen = foreign_read(registry_url, record.topic, record.value)
        assert seen["message_key"] == "new" and seen["subject"] == "New"
    assert len(results) == 3
    for record in results:
        assert SCHEMA_HEADER not in dict(record.headers)
        seen = foreign_read(registry_url, record.topic, record.value)
        assert seen["status"] == "sent"
    assert {foreign_read(registry_url, r.topic, r.value)["recipient"] for r in results} == {
        "a@example.com", "b@example.com", "o@example.com"}


def test_lag_reads_a_framed_retry_records_not_before(registry_settings: Settings) -> None:
    """`postroom lag` with a registry: retry records in the Confluent wire format count as
    overdue only when their not_before has passed, as schemaless ones do."""
    register_contract(registry_settings)
    settings = dataclasses.replace(registry_settings, sender_group=f"g-{time.time_ns()}")
    tier = retry_topic(settings.topic_prefix, 1)
    framing = framing_for(settings)
    now = dt.datetime.now(dt.UTC)
    producer = Producer(settings.kafka_client_config())
    for n in range(5):
        due = now - dt.timedelta(seconds=60) if n < 2 else now + dt.timedelta(hours=1)
        event = EmailRequested(
            idempotency_key=f"k|r{n}@example.com", message_key="k", outbox_id=n,
            recipient=f"r{n}@example.com", sender="", subject="S", body="b", attachments=(),
            priority="normal", created_at=now, attempt=2, not_before=due)
        value, headers = framing.frame(tier, event)
        assert headers == []  # framed: the writer schema is the registry's
        producer.produce(tier, key=event.idempotency_key, value=value, headers=headers,
                         partition=0)
    assert producer.flush(30) == 0
    reader = LagReader(settings, postroom_groups(settings, settings.sender_group))
    try:
        [group] = reader.sample()
        row = next(p for p in group.partitions if (p.topic, p.partition) == (tier, 0))
        assert (row.tier, row.lag, row.overdue) == (1, 5, 2)
    finally:
        reader.close()
