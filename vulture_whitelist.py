"""Names vulture (``python -m vulture``, min_confidence 60 in pyproject.toml) reports unused but
that are used where it cannot see: called by name by a library or the interpreter, read by a
library, looked up by value, or dev tooling (postroom/devkit) that tests, bench and the demo use.

Never imported by postroom; tests/unit/test_vulture_whitelist.py runs it, so an entry naming
what no longer exists fails there. ``_`` stands for an object of a library (or a class vulture
cannot import, such as one defined inside a function): any attribute of it is itself.
"""

from __future__ import annotations

from typing import Any

import postroom
from postroom.bounces.service import _Handler as BounceHandler
from postroom.bounces.session import BounceSession
from postroom.devkit import bouncemail, devsmtp, devsmtp_handler, histograms, otlp, processes, story
from postroom.health import _BoundedHTTPServer
from postroom.relay.suppression import Source
from postroom.schemas import framing
from postroom.sender.pipelining import Pipeline
from postroom.sender.throttle import DestinationBy
from postroom.web.forms import SearchFilter


class _Anything:
    def __getattr__(self, name: str) -> Any:
        return self

    def __setattr__(self, name: str, value: object) -> None:
        pass


_: Any = _Anything()

# The module's __getattr__ (PEP 562): `from postroom import enqueue` loads relay.outbox lazily.
postroom.__getattr__

# aiosmtpd calls a handler's handle_<VERB> and handle_exception by name.
BounceHandler.handle_RCPT
BounceHandler.handle_DATA
BounceHandler.handle_exception
# aiosmtpd's SMTP runs a command by its smtp_<VERB> method, found by name.
BounceSession.smtp_AUTH
BounceSession.smtp_DATA
devsmtp_handler.DevHandler.handle_EHLO
devsmtp_handler.DevHandler.handle_HELO
devsmtp_handler.DevHandler.handle_RCPT
devsmtp_handler.DevHandler.handle_DATA
devsmtp_handler.DevHandler.handle_exception
# aiosmtpd's Session.host_name: a handler with its own handle_EHLO/HELO must set it (aiosmtpd
# reads it to refuse MAIL before a greeting).
_.host_name

# http.server calls do_<METHOD> and log_message by name; socketserver reads daemon_threads.
otlp._Handler.do_POST
otlp._Handler.log_message
_.do_GET  # postroom.health.serve's Handler, a class inside the function
_.log_message
_BoundedHTTPServer.daemon_threads

# asyncio calls a Protocol's data_received and eof_received.
Pipeline.data_received
Pipeline.eof_received

# aiosmtplib's SMTPProtocol reads _response_pending (sender/smtp.py _message writes the message
# half of its DATA command itself, under the pin in pyproject.toml).
_._response_pending

# psycopg's PGconn.nonblocking is a property setter (sender/marker.py: pipeline mode).
_.nonblocking

# The logging module reads these globals (postroom/logs.py configure_logging: the HOWTO's
# "Optimization" section).
_._srcfile
_.logThreads
_.logProcesses
_.logMultiprocessing

# openpyxl writes a worksheet's title into the workbook (postroom/devkit/story.py).
_.title

# Alembic reads each revision module's variables (relay/migrations/versions/*.py).
_.down_revision
_.branch_labels
_.depends_on

# Enum members looked up by value: Source(row.source) from the suppression table, and
# DestinationBy(settings.destination_by) from POSTROOM_DESTINATION_BY.
Source.BOUNCE
Source.COMPLAINT
Source.SOFT
Source.OPERATOR
DestinationBy.DOMAIN

# Dev tooling (postroom/devkit) that tests, bench and the chaos suite use.
devsmtp.DevSmtpServer.message_ids  # tests/integration/test_devsmtp.py, test_smtp.py
bouncemail.junk_text  # bench/bounces.py, tests/chaos/bouncestorm.py
bouncemail.junk_parts  # bench/bounces.py, tests/chaos/bouncestorm.py
bouncemail.postfix_dsn  # bench/bounces.py, tests/chaos/bouncestorm.py
histograms.SENT_MARK_WINDOW  # bench/delivery.py, tests/chaos/harness.py
histograms.Buckets.quantile_bound  # bench/delivery.py, tests/chaos/test_chaos.py
histograms.scrape_histogram  # bench/delivery.py, tests/chaos/harness.py
otlp.OtlpReceiver.endpoint  # bench/tracing.py, tests/integration/test_tracing.py
processes.PostroomProcesses.pids  # bench/relay.py, bench/latency.py, bench/delivery.py
processes.PostroomProcesses.wait_logged  # bench/relay.py, tests/integration/
processes.PostroomProcesses.complaints  # bench/latency.py, bench/delivery.py, tests/integration/
story.SEPTEMBER_ENDS  # tests/support/seed.py

# The schemaless header of an event, for the records tests write (the roles frame with
# Framing.frame; enqueue counts the header in schemas/sizes.py, without the codec).
framing.headers_for  # tests/unit/schemas/, tests/integration/sender/, tests/chaos/storm.py
SearchFilter.empty  # postroom/web/templates/search.html
