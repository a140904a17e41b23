"""Records another client on the platform can write and confluent-kafka's Python client cannot:
a header name that is not UTF-8 (a Go or C producer sends names as bytes). librdkafka is driven
through ctypes here, as such a producer would. The sender dead-letters the record and goes on."""

from __future__ import annotations

import ctypes
import dataclasses
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from postroom.topics import dead_letter_topic, priority_topic
from schemas.codec import EmailRequested, encode, headers_for
from sender.devsmtp import DevSmtpServer
from sender.routing import DLQ_CLASS_HEADER, DLQ_REASON_HEADER
from support.pipeline import SenderThread

pytestmark = [pytest.mark.integration]

# rd_kafka_vtype_t of rdkafka.h
_VTYPE_END, _VTYPE_TOPIC, _VTYPE_PARTITION, _VTYPE_VALUE, _VTYPE_KEY, _VTYPE_HEADERS = (
    0, 1, 3, 4, 5, 10)


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Value(ctypes.Union):
    _fields_ = [("cstr", ctypes.c_char_p), ("i32", ctypes.c_int32), ("mem", _Mem),
                ("ptr", ctypes.c_void_p), ("_pad", ctypes.c_char * 64)]


class _Vu(ctypes.Structure):
    _fields_ = [("vtype", ctypes.c_int), ("u", _Value)]


def librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent-kafka ships, with the signatures used here."""
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    [path] = libs.glob("librdkafka*.so*")
    lib = ctypes.CDLL(str(path))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_header_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t,
                                        ctypes.c_char_p, ctypes.c_ssize_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Vu), ctypes.c_size_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


def produce_raw(settings: Settings, topic: str, partition: int, key: bytes, value: bytes,
                headers: list[tuple[bytes, bytes]]) -> None:
    """One record with header names as bytes, through librdkafka's C API (plaintext local
    stack only)."""
    lib = librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    assert lib.rd_kafka_conf_set(conf, b"bootstrap.servers",
                                 (settings.kafka_bootstrap_servers or "").encode(),
                                 error, 512) == 0, error.value
    producer = lib.rd_kafka_new(0, conf, error, 512)  # RD_KAFKA_PRODUCER
    assert producer, error.value
    try:
        found = lib.rd_kafka_headers_new(len(headers))
        for name, header_value in headers:
            assert lib.rd_kafka_header_add(found, name, len(name), header_value,
                                           len(header_value)) == 0
        key_buf = ctypes.create_string_buffer(key, len(key))
        value_buf = ctypes.create_string_buffer(value, len(value))
        vus = (_Vu * 6)()
        vus[0].vtype, vus[0].u.cstr = _VTYPE_TOPIC, topic.encode()
        vus[1].vtype, vus[1].u.i32 = _VTYPE_PARTITION, partition
        vus[2].vtype, vus[2].u.mem = _VTYPE_KEY, _Mem(ctypes.cast(key_buf, ctypes.c_void_p),
                                                      len(key))
        vus[3].vtype, vus[3].u.mem = _VTYPE_VALUE, _Mem(ctypes.cast(value_buf, ctypes.c_void_p),
                                                        len(value))
        vus[4].vtype, vus[4].u.ptr = _VTYPE_HEADERS, found
        vus[5].vtype = _VTYPE_END
        assert not lib.rd_kafka_produceva(producer, vus, 5), "rd_kafka_produceva failed"
        assert lib.rd_kafka_flush(producer, 10_000) == 0, "not acknowledged"
    finally:
        lib.rd_kafka_destroy(producer)


def event(name: str) -> EmailRequested:
    return EmailRequested(
        idempotency_key=f"{name}|{name}@example.com", message_key=name, outbox_id=0,
        recipient=f"{name}@example.com", sender="", subject="S", body="b", attachments=(),
        priority="normal", created_at=dt.datetime.now(dt.UTC))


def test_a_header_name_that_is_not_utf8_is_poison_not_a_crash(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """confluent-kafka's Message.headers() gives such a record a pair whose name is NULL and
    leaves the decode error pending: a first call raised SystemError in the sender's loop, a
    call the interpreter had specialised (after a few records) returned the list, and touching
    the name crashed the process. Now the record is poison, with the bad name first or last,
    after enough records that the call is specialised, and the email behind it goes out."""
    server = DevSmtpServer(port=0)
    server.start()
    topic = priority_topic(settings.topic_prefix, "normal")
    [(schema_name, fingerprint)] = headers_for(EmailRequested)
    producer = Producer(settings.kafka_client_config())
    warm = [f"warm{n}" for n in range(12)]
    for name in warm:
        producer.produce(topic, partition=0, key=f"{name}|{name}@example.com".encode(),
                         value=encode(event(name)), headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    bad = b"\xff\xfe trace"
    produce_raw(settings, topic, 0, b"last|last@example.com", encode(event("last")),
                [(schema_name.encode(), fingerprint), (bad, b"1")])
    produce_raw(settings, topic, 0, b"first|first@example.com", encode(event("first")),
                [(bad, b"1"), (schema_name.encode(), fingerprint), (b"postroom.row_id", b"7")])
    producer.produce(topic, partition=0, key=b"next|next@example.com",
                     value=encode(event("next")), headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    sender = SenderThread(dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE),
        engine).start()
    try:
        wait_until(lambda: server.count() >= len(warm) + 1, 60,
                   "the emails around them to be delivered")
        dead = consume(settings, [dead_letter_topic(settings.topic_prefix)], expected=2)
    finally:
        sender.stop()  # raises when the sender crashed
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == sorted(
        f"{name}@example.com" for name in [*warm, "next"])
    assert len(dead) == 2
    for letter in dead:
        headers = dict(letter.headers)
        assert headers[DLQ_CLASS_HEADER] == b"poison"
        assert b"not UTF-8" in headers[DLQ_REASON_HEADER]


def test_message_headers_is_the_plain_call_for_every_other_record(
        settings: Settings) -> None:
    """The seam reads CPython's tuples by address: for records whose names decode it gives
    exactly what Message.headers() gives."""
    from confluent_kafka import Consumer

    from postroom.devkit.scratch import unique_name
    from postroom.kafka import message_headers

    topic = priority_topic(settings.topic_prefix, "low")
    producer = Producer(settings.kafka_client_config())
    sent = [[], [("a", b"1")], [("a", b"1"), ("a", None), ("ü", b"\xff" * 300), ("", b"")]]
    for headers in sent:
        producer.produce(topic, partition=0, value=b"v", headers=headers or None)
    assert producer.flush(10) == 0
    consumer = Consumer({**settings.kafka_client_config(), "group.id": unique_name("t"),
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen = []
    try:
        wait_until(lambda: _read_into(consumer, seen) >= len(sent), 30, "the records")
    finally:
        consumer.close()
    for msg in seen:
        assert message_headers(msg) == list(msg.headers() or [])
    assert [message_headers(msg) for msg in seen] == sent


def _read_into(consumer: Any, seen: list[Any]) -> int:
    msg = consumer.poll(0.2)
    if msg is not None and msg.error() is None:
        seen.append(msg)
    return len(seen)
