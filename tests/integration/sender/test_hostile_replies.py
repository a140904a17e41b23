"""A mail server whose replies are broken bytes, end to end through the real pipeline: each attempt
is classified (transient, permanent or sent), its row ends with a text PostgreSQL holds, and the
sender goes on (issue 23)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from support.pipeline import Pipeline, outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The first RCPT of a recipient whose local part starts with the name gets the bytes; later ones
# are accepted. ``accept-`` is refused nothing; its message's 250 is broken.
FIRST_RCPT = {
    "nul451": b"451 4.3.0 try\x00again \xff\xfe later",
    "nocode": b"\xff\xfe\x00 no code at all",
    "long451": b"451 4.3.0 " + b"x" * 100_000,
    "cont451": b"451-4.3.0 first\r\n451-\xff\x00\xfe\r\n451 4.3.0 last",
}
ALWAYS_RCPT = {"nul550": b"550-5.1.1 \x00\xff first\r\n550 5.1.1 User \x00unknown \xed\xa0\x80"}
ACCEPTED = b"250 2.0.0 Ok \xff\xfe\x00 queued"


class HostileServer:
    """An SMTP server on a thread of its own that pipelines and answers as the tables say."""

    def __init__(self) -> None:
        self.port = 0
        self.delivered: Counter[str] = Counter()
        self.rcpts: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._session, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
            server.close()
            self._loop.run_until_complete(server.wait_closed())
        finally:
            self._loop.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 hostile ESMTP\r\n")
        rcpt: str | None = None
        try:
            while line := await reader.readline():
                command = line.decode("ascii", "replace").strip()
                verb = command.split(" ", 1)[0].upper()
                if verb == "EHLO":
                    writer.write(b"250-hostile\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
                elif verb == "MAIL":
                    rcpt = None
                    writer.write(b"250 2.1.0 Ok\r\n")
                elif verb == "RCPT":
                    address = command.partition("<")[2].rstrip(">").lower()
                    kind = address.split("-", 1)[0]
                    self.rcpts[address] += 1
                    answer = ALWAYS_RCPT.get(kind) or (
                        FIRST_RCPT.get(kind) if self.rcpts[address] == 1 else None)
                    if answer is None:
                        rcpt = address
                        answer = b"250 2.1.5 Ok"
                    writer.write(answer + b"\r\n")
                elif verb == "DATA":
                    if rcpt is None:
                        writer.write(b"554 5.5.1 no valid recipients\r\n")
                        continue
                    writer.write(b"354 go ahead\r\n")
                    while await reader.readline() not in (b".\r\n", b""):
                        pass
                    self.delivered[rcpt] += 1
                    writer.write(ACCEPTED + b"\r\n")
                elif verb == "QUIT":
                    writer.write(b"221 bye\r\n")
                    break
                else:
                    writer.write(b"250 2.0.0 Ok\r\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def __enter__(self) -> HostileServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer() as hostile:
        yield hostile


def test_broken_replies_end_every_row_and_the_sender_goes_on(
        settings: Settings, engine: sa.Engine, server: HostileServer) -> None:
    recipients = [f"{kind}-{n}@example.com" for kind in (*FIRST_RCPT, *ALWAYS_RCPT, "accept")
                  for n in range(2)]
    with engine.begin() as conn:
        enqueue(conn, key="hostile", recipients=recipients, subject="S", body="b")
    smtp = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, smtp_timeout_s=5.0)
    pipeline = Pipeline(smtp, engine).start()
    try:
        rows = wait_until(
            lambda: (found := outbox_rows(engine, "hostile")) and all(
                r.status in ("sent", "failed", "dead") for r in found) and found, 60,
            "every row to end")
    finally:
        pipeline.stop()  # raises if the sender died
    status = {r.recipient: (r.status, r.attempts) for r in rows}
    for recipient in recipients:
        kind = recipient.split("-", 1)[0]
        if kind in ALWAYS_RCPT:
            assert status[recipient] == ("failed", 1), recipient  # 550: permanent
        elif kind in FIRST_RCPT:
            assert status[recipient] == ("sent", 2), recipient    # transient, then sent
        else:
            assert status[recipient] == ("sent", 1), recipient
    assert server.delivered == Counter({r: 1 for r in recipients if not r.startswith("nul550")})
    failed = next(r for r in rows if r.status == "failed")
    assert failed.last_error.startswith("550 5.1.1 first") and failed.last_error.isprintable()
    assert (failed.smtp_code, failed.enhanced_code) == (550, "5.1.1")
    with engine.connect() as conn:
        # Every text the rows hold is printable: nothing NUL, nothing of the server's raw bytes.
        texts = conn.execute(sa.text("SELECT last_error FROM outbox WHERE message_key = 'hostile' "
                                     "AND last_error IS NOT NULL")).scalars().all()
    assert texts and all(text.isprintable() for text in texts)
