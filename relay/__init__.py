"""The outbox side of postroom: it owns PostgreSQL. Report jobs enqueue through ``postroom.enqueue``
(relay/outbox.py); the relay publishes committed rows (relay/publisher.py); the recorder, the last
hop, writes outcomes back into the outbox (relay/recorder.py) and lives here because the outbox
and its SQL are this package's; the migrations hold every table postroom keeps, the sender's
ledger included, so one `postroom db upgrade` and one Alembic history serve the whole database.
"""
