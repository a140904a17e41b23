"""Runs relay, sender and recorder on threads against the local stack, for integration tests."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa

from postroom.metrics import Metrics
from postroom.relay.db import libpq_conninfo
from postroom.relay.publisher import Relay
from postroom.relay.recorder import Recorder
from postroom.sender.claims import lease_s
from postroom.sender.ledger import Ledger, sender_identity
from postroom.sender.service import Sender
from postroom.settings import Settings, TlsMode
from postroom.tracing import OFF, Tracing


class SenderThread:
    """One sender group member on a thread with its own event loop."""

    def __init__(self, settings: Settings, engine: sa.Engine, **kwargs: Any) -> None:
        self.ledger = Ledger(libpq_conninfo(engine), sender_identity(), lease_s(settings),
                             schema=settings.database_schema)
        self.sender = Sender.from_settings(settings, ledger=self.ledger, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="sender", daemon=True)

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self.sender.run())
        except BaseException as exc:  # noqa: BLE001 - reported to the test by stop()
            self.error = exc
        finally:
            self._loop.close()

    def start(self) -> SenderThread:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 60) -> None:
        while self._loop is None and self.thread.is_alive():
            time.sleep(0.01)
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self.sender.stop)
            except RuntimeError:
                pass  # the loop closed meanwhile: the sender has already stopped
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "sender did not stop"
        if self.error is not None:
            raise AssertionError("sender crashed") from self.error


@dataclasses.dataclass
class Pipeline:
    """relay + sender + recorder, started together and stopped together."""

    settings: Settings
    engine: sa.Engine
    # Settings of one role where it differs from ``settings`` ("relay", "sender", "recorder"):
    # its own Kafka credentials, say.
    role_settings: dict[str, Settings] = dataclasses.field(default_factory=dict)
    metrics: Metrics | None = None  # shared by the three, when given
    tracing: Tracing = OFF  # shared by the three
    relay: Relay | None = None
    recorder: Recorder | None = None
    sender: SenderThread | None = None
    threads: list[threading.Thread] = dataclasses.field(default_factory=list)

    def start(self) -> Pipeline:
        def settings_of(role: str) -> Settings:
            return self.role_settings.get(role, self.settings)

        self.relay = Relay(settings_of("relay"), self.engine, metrics=self.metrics,
                           tracing=self.tracing)
        self.recorder = Recorder(settings_of("recorder"), self.engine, metrics=self.metrics,
                                 tracing=self.tracing)
        for target in (self.relay.run, self.recorder.run):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)
        self.sender = SenderThread(settings_of("sender"), self.engine,
                                   metrics=self.metrics, tracing=self.tracing).start()
        return self

    def stop(self) -> None:
        if self.sender is not None:
            self.sender.stop()
        for component in (self.relay, self.recorder):
            if component is not None:
                component.stop()
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive(), "relay or recorder did not stop"


def fast_pipeline(settings: Settings, engine: sa.Engine, smtp_port: int,
                  groups: str) -> Pipeline:
    """A started pipeline on a local plain-text SMTP server, with short timeouts and two retry
    tiers of 0.5 s, in consumer groups of its own (named from ``groups``): what the operators'
    procedures are run against."""
    suffix = uuid.uuid4().hex[:8]
    return Pipeline(dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=smtp_port, smtp_tls=TlsMode.NONE,
        smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0, retry_delays_s=(0.5, 0.5),
        sender_group=f"{groups}-{suffix}", recorder_group=f"rec-{suffix}"), engine).start()


def outbox_rows(engine: sa.Engine, message_key: str) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT recipient, status, attempts, last_error, smtp_code, enhanced_code, sent_at, "
            "message_id, next_attempt_at FROM outbox WHERE message_key = :k ORDER BY id"),
            {"k": message_key}))
