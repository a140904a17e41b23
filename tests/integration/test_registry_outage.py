"""A Schema Registry that stops answering while a sender runs (the local stack's Apicurio behind a
TCP proxy the test starts and stops): a record framed with a schema id the sender has not seen
waits, its partition paused, and is delivered once the registry answers; it is not poison."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema as RegistrySchema

import support.registry
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.framing import confluent_prefix
from postroom.schemas.registry import framing_for, register_contract
from postroom.settings import Settings, TlsMode
from postroom.topics import dead_letter_topic, priority_topic, value_subject
from support.metrics import counter
from support.pipeline import SenderThread

# Its proxy, not the registry, goes down; it shares a worker with the tests that start and stop
# processes of a stack all the same (make test's --dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("stack-processes")]


class TcpProxy:
    """Forwards connections on a local port to ``upstream``; stopped, the port refuses them."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Close the port and every connection through it."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def registry_settings(settings: Settings) -> Iterator[Settings]:
    url = support.registry.registry_url()
    with_registry = dataclasses.replace(settings, schema_registry_url=url)
    yield with_registry
    support.registry.delete_subjects(url, with_registry)


def event(name: str) -> EmailRequested:
    return EmailRequested(
        idempotency_key=f"{name}|{name}@example.com", message_key=name, outbox_id=0,
        recipient=f"{name}@example.com", sender="reports@example.com", subject="S", body="b",
        attachments=(), priority="normal", created_at=dt.datetime.now(dt.UTC))


def test_a_new_schema_id_while_the_registry_is_down_waits_and_is_delivered(
        registry_settings: Settings, engine: Any, consume: Callable[..., Any]) -> None:
    """Issue 23: a registry blip during an upgrade dead-lettered legitimate mail as poison. Now
    the sender holds the record's partition, asks again with a growing pause, and delivers it
    when the registry answers; nothing is dead-lettered."""
    register_contract(registry_settings)
    url = urllib.parse.urlsplit(registry_settings.schema_registry_url or "")
    proxy = TcpProxy((url.hostname or "127.0.0.1", url.port or 80))
    proxy.start()
    proxied = url._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    server = DevSmtpServer(port=0)
    server.start()
    settings = dataclasses.replace(
        registry_settings, schema_registry_url=proxied, smtp_host="127.0.0.1",
        smtp_port=server.port, smtp_tls=TlsMode.NONE,
        schema_registry_config={"timeout": 1.0, "max.retries": 1, "retries.wait.ms": 10})
    topic = priority_topic(settings.topic_prefix, "normal")
    producer = Producer(settings.kafka_client_config())
    sender = SenderThread(settings, engine).start()
    try:
        # A record of today's contract: the sender is up and reading.
        value, headers = framing_for(registry_settings).frame(topic, event("before"))
        producer.produce(topic, partition=0, key=b"before", value=value, headers=headers)
        assert producer.flush(10) == 0
        wait_until(lambda: server.count() >= 1, 60, "the first email to be delivered")

        proxy.stop()
        # A writer upgraded meanwhile: a new version of the contract, an id the sender has not
        # seen, registered behind the sender's back.
        raw = json.loads(load_schema("email_requested").text)
        raw["fields"].append({"name": "cost_centre", "type": ["null", "string"],
                              "default": None})
        with support.registry.client(registry_settings.schema_registry_url or "") as client:
            new_id = client.register_schema(value_subject(topic),
                                            RegistrySchema(json.dumps(raw), "AVRO"))
        body = io.BytesIO()
        later = event("during")
        fastavro.schemaless_writer(body, fastavro.parse_schema(raw), {
            **dataclasses.asdict(later), "attachments": [], "inline": [], "cost_centre": "7"})
        producer.produce(topic, partition=0, key=b"during",
                         value=confluent_prefix(new_id) + body.getvalue())
        assert producer.flush(10) == 0
        metrics = sender.sender.metrics
        wait_until(lambda: counter(metrics, "registry_unavailable_total") >= 3, 60,
                   "the sender to ask the registry again, and again")
        assert server.count() == 1
        assert counter(metrics, "poison_total") == 0

        proxy.start()
        wait_until(lambda: server.count() >= 2, 60,
                   "the waiting email to be delivered once the registry answers")
    finally:
        sender.stop()  # raises when the sender crashed
        proxy.stop()
        server.stop()
    assert [m.rcpt for m in server.messages] == ["before@example.com", "during@example.com"]
    assert counter(sender.sender.metrics, "poison_total") == 0
    assert consume(settings, [dead_letter_topic(settings.topic_prefix)], expected=1,
                   timeout_s=3) == []
