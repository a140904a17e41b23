"""The intake's two outside services: the outbox row a token names (read-only, PostgreSQL) and
the results topic (Kafka, in the platform's framing), each outage raised as UnavailableError."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import sqlalchemy as sa

from postroom import kafka
from postroom.bounces.intake import UnavailableError
from postroom.bounces.mapping import OutboxRow
from postroom.errors import first_line
from postroom.kafka import KafkaError, KafkaException, Message, Producer
from postroom.relay.sql import ROW_OF_REPORT
from postroom.schemas.codec import EmailResult
from postroom.schemas.framing import Framing
from postroom.settings import Settings
from postroom.topics import results_topic

# How long a report's results may wait for the broker's acknowledgement before the MTA is told
# to try again (Postfix waits 600 s for the reply to the message: smtp_data_done_timeout).
PUBLISH_TIMEOUT_S = 30.0
POLL_S = 0.05
# How long the read of a token's row may take before the MTA is told to try again: a database
# that does not answer (a migration's ACCESS EXCLUSIVE lock held, a server stalled) must not
# hold the session until the MTA gives up on it. The connection itself is bounded by
# relay.db's connect_timeout and the pool's wait.
READ_TIMEOUT_S = 30.0
_STATEMENT_TIMEOUT = sa.text("SELECT set_config('statement_timeout', :ms, true)")


class DatabaseRows:
    """Reads the row a token names."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def row(self, outbox_id: int) -> OutboxRow | None:
        try:
            with self._engine.connect() as conn:
                # For this transaction only (set_config's is_local): the pool's connection
                # goes back to its other users as it came.
                conn.execute(_STATEMENT_TIMEOUT, {"ms": str(round(READ_TIMEOUT_S * 1000))})
                found = conn.execute(ROW_OF_REPORT, {"id": outbox_id}).first()
        except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:
            # TimeoutError: no connection came from the pool in time.
            raise UnavailableError(f"the database: {first_line(exc)}") from exc
        if found is None:
            return None
        return OutboxRow(int(found.id), str(found.idempotency_key), str(found.recipient),
                         int(found.attempts), str(found.status))


class KafkaResults:
    """Publishes results to the results topic and waits for their acknowledgement. Results
    left unacknowledged at the timeout may still arrive: the recorder applies a repeated
    result as once."""

    def __init__(self, settings: Settings, framing: Framing,
                 timeout_s: float = PUBLISH_TIMEOUT_S) -> None:
        self._settings = settings
        self._framing = framing
        self._topic = results_topic(settings.topic_prefix)
        self._timeout_s = timeout_s
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Build the producer now: a setting librdkafka refuses raises KafkaClientError (one
        line, naming the property) before the intake takes a report."""
        self._client()

    def _client(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = kafka.make_producer(
                    self._settings, **{"message.timeout.ms": int(self._timeout_s * 1000)})
            return self._producer

    def publish(self, results: Sequence[EmailResult]) -> None:
        producer = self._client()
        pending = {"left": len(results)}
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            pending["left"] -= 1
            if err is not None:
                errors.append(err)

        try:
            for result in results:
                value, schema_headers = self._framing.frame(self._topic, result)
                headers: list[tuple[str, str | bytes | None]] = list(schema_headers)
                producer.produce(self._topic, key=result.idempotency_key, value=value,
                                 headers=headers, on_delivery=on_delivery)
        except (KafkaException, BufferError) as exc:
            raise UnavailableError(f"Kafka refused a result: {exc}") from exc
        deadline = time.monotonic() + self._timeout_s
        while pending["left"] > 0 and time.monotonic() < deadline:
            producer.poll(POLL_S)
        if errors or pending["left"]:
            what = errors[0].str() if errors else f"no acknowledgement in {self._timeout_s:g}s"
            raise UnavailableError(f"Kafka: {what}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(1.0)
