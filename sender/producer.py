"""Talks to Kafka for the sender's writes: produce one record and wait for the broker's
acknowledgement, retrying until it comes, so no outcome is dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from postroom import kafka
from postroom.kafka import KafkaError, KafkaException, Message, Producer
from postroom.metrics import PRODUCE_FAILURES_TOTAL, Metrics
from postroom.sender.errors import RecordTooLargeError
from postroom.settings import Settings

log = logging.getLogger(__name__)

PRODUCE_RETRY_S = 2.0
# Longer than the relay's: a sender that cannot write its outcome holds its partition anyway.
SENDER_MESSAGE_TIMEOUT_MS = 120_000


class AcknowledgedProducer:
    """An idempotent producer whose ``produce`` returns once the broker has the record.

    Delivery reports arrive only through ``poll()``: the owner's loop calls it often.
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._producer: Producer | None = None

    def start(self) -> None:
        self._producer = kafka.make_producer(
            self._settings, **{"message.timeout.ms": SENDER_MESSAGE_TIMEOUT_MS})

    def poll(self) -> None:
        if self._producer is not None:
            self._producer.poll(0)

    def flush(self, timeout_s: float) -> None:
        if self._producer is not None:
            self._producer.flush(timeout_s)

    async def produce(self, topic: str, key: str | bytes | None, value: bytes | None,
                      headers: Sequence[tuple[str, str | bytes | None]]) -> None:
        """Produce and wait for the broker's acknowledgement, retrying until it comes; a record
        Kafka refuses as too large raises RecordTooLargeError instead (it would never come)."""
        if self._producer is None:
            raise RuntimeError("the producer is not started")
        loop = asyncio.get_running_loop()
        while True:
            future: asyncio.Future[None] = loop.create_future()

            def on_delivery(err: KafkaError | None, _msg: Message,
                            future: asyncio.Future[None] = future) -> None:
                if future.done():
                    return
                if err is None:
                    future.set_result(None)
                else:
                    future.set_exception(KafkaException(err))
            try:
                self._producer.produce(topic, key=key, value=value, headers=list(headers),
                                       on_delivery=on_delivery)
                await future
            except (KafkaException, BufferError) as exc:
                if isinstance(exc, KafkaException) and kafka.is_too_large(exc):
                    self._metrics.inc(PRODUCE_FAILURES_TOTAL, topic=topic)
                    raise RecordTooLargeError(f"producing to {topic} failed: {exc}") from exc
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                # Not retriable (e.g. a record too large) means this partition is stuck until an
                # operator acts: say so loudly. Giving up would lose the email.
                level = logging.ERROR if err is not None and not err.retriable() else logging.WARNING
                log.log(level, "producing to %s failed (%s); retrying in %.0fs", topic, exc,
                        PRODUCE_RETRY_S)
                self._metrics.inc(PRODUCE_FAILURES_TOTAL, topic=topic)
                await asyncio.sleep(PRODUCE_RETRY_S)
                continue
            return
