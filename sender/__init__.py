"""The delivery side of postroom: it owns SMTP. service.py wires the sender group member; pure
decision modules (outcome, retry, routing, claims, offsets, priority, admission, throttle) beside
adapters (consumer, producer, publishing, smtp, delivery, destinations, message, ledger);
the local test server is postroom/devkit/devsmtp.py."""
