"""A sender whose Kafka client is in librdkafka's fatal state exits non-zero with one line, for
its supervisor to restart it, instead of living on unable to work: two senders given one
``group.instance.id`` (a deploy's mistake), one of which the group fences (the classic
protocol) or refuses (KIP-848's)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.processes import PostroomProcesses
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.errors import KafkaFatalError
from postroom.kafka import KafkaError, fatal, make_admin
from postroom.settings import Settings, TlsMode
from support.commands import start_postroom
from support.foreign import force_fatal
from support.pipeline import SenderThread

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def members(admin: AdminClient, group: str) -> int:
    [future] = admin.describe_consumer_groups([group]).values()
    return len(future.result(timeout=30).members)


@pytest.mark.timeout(180)
def test_two_senders_with_one_group_instance_id_one_exits_with_one_line(
        settings: Settings, tmp_path: Path) -> None:
    server = DevSmtpServer(port=0)
    server.start()
    env = {**os.environ, **scratch_env(settings),
           "POSTROOM_SMTP_HOST": "127.0.0.1", "POSTROOM_SMTP_PORT": str(server.port),
           "POSTROOM_SMTP_TLS": "none", "POSTROOM_MAIL_FROM": "reports@example.com",
           "POSTROOM_LOG_LEVEL": "WARNING", "POSTROOM_RETRY_DELAYS": "1s,2s,4s,8s",
           "POSTROOM_KAFKA_CONSUMER_CONFIG": "group.instance.id=the-one-sender"}
    senders = PostroomProcesses(env, tmp_path, starter=start_postroom)
    admin = make_admin(settings)
    try:
        first = senders.start("first", "sender")
        wait_until(lambda: members(admin, settings.sender_group) == 1, 90,
                   "the first sender to join its group")
        second = senders.start("second", "sender")
        wait_until(lambda: first.poll() is not None or second.poll() is not None, 90,
                   "one of the two senders to exit")
        gone, kept = ("first", "second") if first.poll() is not None else ("second", "first")
        assert senders.processes[kept].poll() is None, senders.log(kept)
    finally:
        codes = senders.stop_all(timeout_s=60)
        server.stop()
    assert codes[gone] == 1, senders.log(gone)
    assert codes[kept] == 0, senders.log(kept)
    errors = [line for line in senders.log(gone).splitlines()
              if line.startswith("postroom sender: error:")]
    assert len(errors) == 1, senders.log(gone)
    # Classic: "Static consumer fenced by other consumer with same group.instance.id"; KIP-848:
    # "The instance ID is still used by another member in the consumer group".
    assert "fatal state" in errors[0], errors
    assert "group.instance.id" in errors[0] or "instance ID" in errors[0], errors
    assert "Traceback" not in senders.log(gone)


@pytest.mark.timeout(120)
def test_a_sender_whose_producer_is_fatal_stops_with_its_error(
        settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idempotent producer in librdkafka's fatal state (forced by its test hook): the sender's
    loop ends with KafkaFatalError, which the command prints as its one line (before, librdkafka's
    KafkaException escaped the loop, a traceback)."""
    monkeypatch.setattr(fatal, "FATAL", fatal.FatalState())  # this test's process state
    server = DevSmtpServer(port=0)
    server.start()
    sender = SenderThread(dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE),
        engine).start()
    try:
        wait_until(lambda: sender.sender._producer._producer is not None, 60,
                   "the sender's producer to start")
        force_fatal(sender.sender._producer._producer, KafkaError.INVALID_PRODUCER_EPOCH)
        sender.thread.join(60)
        assert not sender.thread.is_alive(), "the sender lives on with a producer that cannot work"
    finally:
        with contextlib.suppress(AssertionError):
            sender.stop()
        server.stop()
    assert isinstance(sender.error, KafkaFatalError), sender.error
    assert sender.error.code == "INVALID_PRODUCER_EPOCH"
