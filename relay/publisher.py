"""The relay: publishes committed outbox rows to the priority topics, each exactly once normally.

A round claims a batch of due, unpublished rows (short transaction), produces them with an
idempotent acks=all producer (relay/producing.py), and marks published only the rows the broker
acknowledged (second short transaction). Nothing is held open while Kafka answers: the claim
keeps another relay off those rows while this relay's claims session lives, and hands them back
when that session ends (this process died, or closed its connections after a failed round), or,
for a relay that hangs with its session open, when the claim expires.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import sqlalchemy as sa

from postroom import kafka
from postroom.errors import KafkaClientError, KafkaFatalError
from postroom.kafka import Producer
from postroom.metrics import (
    RELAY_POISON_TOTAL,
    RELAY_PUBLISHED_TOTAL,
    RELAY_SUPPRESSED_TOTAL,
    RELAY_TOO_LARGE_TOTAL,
    RELAY_UNACKNOWLEDGED_TOTAL,
    Metrics,
)
from postroom.relay import sql
from postroom.relay.connections import Connections, Listener
from postroom.relay.connections import one_line as _one_line
from postroom.relay.producing import TOO_LARGE_ERROR, send_batch
from postroom.relay.rounds import Claim, RelayStats, Sent
from postroom.rules import ascii_domain_address
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.framing import Framing
from postroom.schemas.registry import framing_for
from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS, Settings
from postroom.tracing import OFF, Tracing

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
STATS_EVERY_S = 30.0


class Relay:
    """Tails committed outbox rows into Kafka. ``run()`` until ``stop()``; safe to run many at once."""

    def __init__(self, settings: Settings, engine: sa.Engine,
                 producer_factory: Callable[[], Producer] | None = None,
                 metrics: Metrics | None = None, framing: Framing | None = None,
                 tracing: Tracing = OFF) -> None:
        self._settings = settings
        self._tracing = tracing
        # None: from the settings (and the registry, when one is set) at the first round.
        self._framing = framing
        self._engine = engine
        self._producer_factory = producer_factory or (lambda: kafka.make_producer(
            settings, **{"delivery.report.only.error": True}))
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._listener = Listener(engine, self._stop)
        self.stats = RelayStats()
        self.metrics = metrics or Metrics()
        fields = load_schema(EmailRequested.SCHEMA_NAME).field_names
        self._id_at = fields.index("outbox_id")
        self._recipient_at = fields.index("recipient")

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._producer_factory()
        return self._producer

    @property
    def framing(self) -> Framing:
        if self._framing is None:
            self._framing = framing_for(self._settings)
        return self._framing

    def stop(self) -> None:
        self._stop.set()

    def rounds(self) -> Rounds:
        """This relay's rounds on connections of their own (:class:`Rounds`); ``run()`` steps
        through them until ``stop()``. A context manager: leaving it finishes what is in
        flight."""
        return Rounds(self)

    def _claim(self, db: Connections) -> Claim:
        settings = self._settings
        owner = db.owner
        rows = sql.claim_due(db.claims(), settings.relay_batch_size, settings.relay_claim_ttl_s,
                             owner=owner, pinned=True)
        # Part of the claim, so a round, whichever thread claims it, finishes suppressed
        # addresses before anything is produced; whether the batch was full is judged before,
        # so suppressed rows do not make run() wait.
        full = len(rows) == settings.relay_batch_size
        return Claim(self._without_suppressed(db, rows, owner) if rows else rows, full, owner)

    def _without_suppressed(self, db: Connections, rows: Sequence[sa.Row[Any]],
                            owner: int) -> Sequence[sa.Row[Any]]:
        """The claimed rows less those whose address is suppressed: those end ``suppressed``,
        off the queue, in one statement for the batch (relay/suppression.py). Each row's
        address is compared in its mailbox spelling (its domain in IDNA form), however the row
        spells it: a row written by an earlier release, or by SQL, is matched all the same."""
        id_at, recipient_at = self._id_at, self._recipient_at
        suppressed = set(db.claims().execute(sql.MARK_SUPPRESSED, {
            "ids": [row[id_at] for row in rows],
            "addresses": [ascii_domain_address(row[recipient_at]) for row in rows],
            "owner": owner}).scalars())
        if not suppressed:
            return rows
        self.stats.suppressed += len(suppressed)
        self.metrics.inc(RELAY_SUPPRESSED_TOTAL, len(suppressed))
        log.info("%d email(s) to suppressed addresses finished as suppressed, not published",
                 len(suppressed))
        return [row for row in rows if row[id_at] not in suppressed]

    def _send(self, rows: Sequence[sa.Row[Any]]) -> Sent:
        """Produce every row and wait for the broker (relay/producing.py)."""
        return send_batch(rows, self.producer, self.framing, self._settings, self._tracing,
                          self.metrics)

    def _account(self, claimed: int, sent: Sent) -> int:
        acked, released = sent.acked, sent.released
        self.stats.rounds += 1
        if sent.too_large:
            self.metrics.inc(RELAY_TOO_LARGE_TOTAL, len(sent.too_large))
        if sent.poison:
            self.stats.poison += len(sent.poison)
            self.metrics.inc(RELAY_POISON_TOTAL, len(sent.poison))
        self.stats.published += len(acked)
        self.stats.failed += len(released)
        self.metrics.inc(RELAY_PUBLISHED_TOTAL, len(acked))
        if released:
            self.metrics.inc(RELAY_UNACKNOWLEDGED_TOTAL, len(released))
            raise KafkaClientError(
                f"{len(released)} of {claimed} rows were not acknowledged; "
                "their claims are released for the next round", retriable=True)
        return len(acked)

    def _mark(self, db: Connections, sent: Sent, owner: int) -> None:
        # Separate statements, each its own transaction: they touch different rows. A relay that
        # dies before marking a poison row leaves it claimed; the next claim takes it and refuses
        # it again, as rows not acknowledged are published again.
        failed = [*sent.poison, *((row_id, TOO_LARGE_ERROR) for row_id in sent.too_large)]
        if failed:
            db.marks().execute(sql.MARK_FAILED, {"ids": [row_id for row_id, _ in failed],
                                                 "errors": [error for _, error in failed],
                                                 "owner": owner})
        if sent.acked:
            db.marks().execute(sql.MARK_PUBLISHED, {"ids": sent.acked, "owner": owner})
        if sent.released:
            db.marks().execute(sql.RELEASE_CLAIMS, {"ids": sent.released, "owner": owner})

    def run(self) -> None:
        """Publish until stop(): wake on NOTIFY, fall back to polling, back off on errors."""
        settings = self._settings
        log.info("relay started: batch=%d poll=%.1fs prefix=%r", settings.relay_batch_size,
                 settings.relay_poll_interval_s, settings.topic_prefix)
        failures = 0
        last_stats = time.monotonic()
        self._stop.clear()
        log.info("relay writes %s", "the Confluent wire format" if self.framing.uses_registry
                 else "schemaless Avro")
        # Created now, the producer connects to the brokers while the relay waits for rows,
        # instead of when the first rows are already waiting.
        self.producer.poll(0)
        with self.rounds() as rounds:
            while not self._stop.is_set():
                # A producer in librdkafka's fatal state never works again: the relay exits
                # and its supervisor starts it afresh (its claims end with its sessions).
                kafka.raise_if_fatal()
                try:
                    self._listener.ensure()
                    published = rounds.step()
                    failures = 0
                except KafkaFatalError:
                    raise
                except (sa.exc.DBAPIError, psycopg.Error, KafkaClientError) as exc:
                    # The database or the broker, not a row (a row no event can carry is
                    # poison): a lost connection, a read-only standby after a failover, a
                    # revoked grant. The round's claims are released and it is tried again.
                    rounds.abandon()
                    delay = RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S) - 1)]
                    failures += 1
                    self.stats.errors += 1
                    log.warning("relay round failed (%s); retrying in %.1fs", _one_line(exc), delay)
                    self._listener.close()
                    self._stop.wait(delay)
                    continue
                if time.monotonic() - last_stats > STATS_EVERY_S:
                    last_stats = time.monotonic()
                    log.info("relay: published=%d failed=%d poison=%d rounds=%d",
                             self.stats.published, self.stats.failed, self.stats.poison,
                             self.stats.rounds)
                if published < settings.relay_batch_size and not rounds.ahead:
                    self._listener.wait_for_rows(settings.relay_poll_interval_s)
            # Before the rounds close their connections, and with them this relay's claims.
            self._flush_at_stop()
        self._listener.close()
        log.info("relay stopped: published=%d", self.stats.published)

    def _flush_at_stop(self) -> None:
        if self._producer is None:
            return
        remaining = self._producer.flush(PRODUCER_MESSAGE_TIMEOUT_MS / 1000)
        if remaining:
            log.warning("relay stopped with %d records unacknowledged; their rows stay "
                        "unpublished, and the next relay round publishes them", remaining)


class Rounds:
    """A relay's rounds, one :meth:`step` at a time: claim, produce, wait for the acks, mark.

    Under a backlog the rounds overlap: while the caller's thread encodes and produces one batch,
    two database threads mark the previous batch and claim the next one. At most one claim and
    one mark are in flight, on rows no other statement of ours touches. Leaving the context (or
    :meth:`close`) finishes the marks in flight and hands back rows claimed ahead.
    """

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._db = Connections(relay._engine)
        self._database = ThreadPoolExecutor(2, thread_name_prefix="relay-db")
        self._claimed: Future[Claim] | None = None
        self._marking: Future[None] | None = None

    def __enter__(self) -> Rounds:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def ahead(self) -> bool:
        """Whether the next round's claim is under way: the last claim took a whole batch."""
        return self._claimed is not None

    def step(self) -> int:
        """One round; the rows published (acknowledged; their marks may still be in flight).
        Raises the database's or the broker's error; then :meth:`abandon` before the next."""
        relay, db = self._relay, self._db
        claimed, self._claimed = self._claimed, None
        claim = claimed.result() if claimed is not None else relay._claim(db)
        rows = claim.rows
        if claim.full:
            self._claimed = self._database.submit(relay._claim, db)
        sent = relay._send(rows) if rows else None
        if self._marking is not None:
            # The previous batch's bookkeeping, which ran while this one was sent.
            done, self._marking = self._marking, None
            done.result()
        if sent is None:
            return 0
        self._marking = self._database.submit(relay._mark, db, sent, claim.owner)
        return relay._account(len(rows), sent)

    def abandon(self) -> None:
        """After a failed step: finish the marks in flight, hand back rows claimed ahead but not
        sent (else they wait out the TTL), and start again on fresh connections."""
        for future in (self._marking, self._claimed):
            if future is None:
                continue
            try:
                done = future.result()
                if isinstance(done, Claim) and done.rows:
                    self._relay._mark(self._db, Sent([], [row.outbox_id for row in done.rows]),
                                      done.owner)
            except Exception as exc:  # noqa: BLE001 - already failing; the claims end with the session
                log.debug("database work of an abandoned round: %s", exc)
        self._claimed = self._marking = None
        self._db.close()

    def close(self) -> None:
        try:
            self.abandon()
        finally:
            self._database.shutdown()
