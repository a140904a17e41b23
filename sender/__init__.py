"""The delivery side of postroom: it owns SMTP. service.py wires the sender group member; pure
decision modules (outcome, retry, routing, claims, offsets, priority) beside adapters (consumer,
producer, smtp, ledger, delivery, message); devsmtp.py is the local test server."""
