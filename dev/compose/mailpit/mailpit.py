#!/usr/bin/env python3
"""A stand-in for Mailpit (axllent/mailpit) in scripts/compose-test.sh: SMTP on 1025 accepting
every message (every recipient matching MP_SMTP_ALLOWED_RECIPIENTS when set, Mailpit's regular
expression; others refused with 550 as Mailpit refuses them), HTTP on 8025 with /readyz, /livez
and GET /api/v1/messages (the newest first, the fields of Mailpit's summary that the test reads).
`/mailpit readyz` exits 0 when the HTTP side answers /readyz, as Mailpit's subcommand does.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import itertools
import json
import os
import re
import signal
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock, Thread

from aiosmtpd.controller import Controller

# Every interface of the container: the other containers reach it by its service name.
LISTEN = "0.0.0.0"  # noqa: S104
SMTP_PORT = 1025
HTTP_PORT = 8025
MESSAGES: list[dict[str, object]] = []
LOCK = Lock()
IDS = itertools.count(1)


def _summary(raw: bytes, recipients: list[str]) -> dict[str, object]:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    attachments = [part.get_filename() for part in message.iter_attachments()
                   if part.get_filename()] if message.is_multipart() else []
    return {"ID": str(next(IDS)), "MessageID": message.get("Message-ID", ""),
            "From": {"Address": str(message.get("From", ""))},
            "To": [{"Address": address} for address in recipients],
            "Subject": str(message.get("Subject", "")),
            "Attachments": len(attachments), "AttachmentNames": attachments,
            "Size": len(raw)}


class Handler:
    def __init__(self, allowed: re.Pattern[str] | None) -> None:
        self.allowed = allowed

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.allowed is not None and not self.allowed.search(address):
            print(f"[smtpd] rejected message to {address} from {envelope.mail_from}", flush=True)
            return "550 5.1.0 Requested action not taken: mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server, session, envelope):
        summary = _summary(envelope.original_content or envelope.content, envelope.rcpt_tos)
        with LOCK:
            MESSAGES.insert(0, summary)
        print(f"[smtpd] message received from {envelope.mail_from} to "
              f"{', '.join(envelope.rcpt_tos)}", flush=True)
        return "250 2.0.0 Ok: queued as " + str(summary["ID"])


class Http(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path in ("/readyz", "/livez"):
            self._send(200, b"ok", "text/plain")
        elif self.path.split("?")[0] == "/api/v1/messages":
            with LOCK:
                body = {"total": len(MESSAGES), "count": len(MESSAGES), "messages": MESSAGES}
                data = json.dumps(body).encode()
            self._send(200, data, "application/json")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def readyz() -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/readyz", timeout=3) as reply:
            return 0 if reply.status == 200 else 1
    except OSError:
        return 1


def serve() -> int:
    pattern = os.environ.get("MP_SMTP_ALLOWED_RECIPIENTS", "")
    allowed = re.compile(pattern) if pattern else None
    controller = Controller(Handler(allowed), hostname=LISTEN, port=SMTP_PORT,
                            data_size_limit=0, decode_data=False)
    controller.start()
    http = ThreadingHTTPServer((LISTEN, HTTP_PORT), Http)
    Thread(target=http.serve_forever, daemon=True).start()
    print(f"[smtpd] accepting mail on [::]:{SMTP_PORT}; [http] on [::]:{HTTP_PORT}"
          + (f"; only recipients matching {pattern}" if allowed else ""), flush=True)
    loop = asyncio.new_event_loop()
    # PID 1 in its container: without a handler SIGTERM would be ignored until SIGKILL.
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.add_signal_handler(signal.SIGINT, loop.stop)
    try:
        loop.run_forever()
    finally:
        controller.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["readyz"]:
        sys.exit(readyz())
    sys.exit(serve())
